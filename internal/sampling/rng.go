package sampling

// rng is xoshiro256** seeded through SplitMix64: small, fast, and fully
// determined by the seed, so a sequence's samples replay exactly from its
// seed (math/rand/v2 would do too, but owning the algorithm means its
// output can never change under us between Go releases).
type rng struct{ s [4]uint64 }

func newRNG(seed uint64) rng {
	var r rng
	x := seed
	for i := range r.s {
		x += 0x9E3779B97F4A7C15
		z := x
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		r.s[i] = z ^ z>>31
	}
	return r
}

func rotl(x uint64, k uint) uint64 { return x<<k | x>>(64-k) }

func (r *rng) next() uint64 {
	s := &r.s
	out := rotl(s[1]*5, 7) * 9
	t := s[1] << 17
	s[2] ^= s[0]
	s[3] ^= s[1]
	s[1] ^= s[2]
	s[0] ^= s[3]
	s[2] ^= t
	s[3] = rotl(s[3], 45)
	return out
}

// float64 returns a uniform value in [0, 1) with 53 random bits.
func (r *rng) float64() float64 { return float64(r.next()>>11) / (1 << 53) }
