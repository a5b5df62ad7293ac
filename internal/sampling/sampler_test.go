package sampling

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func mustNew(t testing.TB, p Params, vocab int) *Sampler {
	t.Helper()
	s, err := New(p, vocab)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// counts draws n samples and returns how often each token came up.
func counts(t *testing.T, p Params, logits []float32, n int) []int {
	s := mustNew(t, p, len(logits))
	c := make([]int, len(logits))
	for range n {
		r, err := s.Sample(logits)
		if err != nil {
			t.Fatal(err)
		}
		c[r.Token]++
	}
	return c
}

func softmax(logits []float32, temp float64) []float64 {
	m := math.Inf(-1)
	for _, l := range logits {
		m = max(m, float64(l))
	}
	p := make([]float64, len(logits))
	var z float64
	for i, l := range logits {
		p[i] = math.Exp((float64(l) - m) / temp)
		z += p[i]
	}
	for i := range p {
		p[i] /= z
	}
	return p
}

// checkDist asserts empirical frequencies are within 4 standard errors of
// want (and exactly zero where want is zero). The seed is fixed, so the
// outcome is deterministic; the bound says the sampler is right, not lucky.
func checkDist(t *testing.T, name string, got []int, want []float64) {
	t.Helper()
	n := 0
	for _, c := range got {
		n += c
	}
	for i, w := range want {
		f := float64(got[i]) / float64(n)
		if w == 0 {
			if got[i] != 0 {
				t.Errorf("%s: token %d drawn %d times, want never", name, i, got[i])
			}
			continue
		}
		se := math.Sqrt(w * (1 - w) / float64(n))
		if math.Abs(f-w) > 4*se+1e-9 {
			t.Errorf("%s: token %d frequency %.4f, want %.4f ± %.4f", name, i, f, w, 4*se)
		}
	}
}

func TestDistributions(t *testing.T) {
	logits := []float32{2, 1, 0.5, 0, -1, float32(math.Inf(-1)), -3}
	const n = 40000
	base := softmax(logits, 1)
	hot := softmax(logits, 2)
	renorm := func(p []float64, keep ...int) []float64 {
		out := make([]float64, len(p))
		var z float64
		for _, k := range keep {
			z += p[k]
		}
		for _, k := range keep {
			out[k] = p[k] / z
		}
		return out
	}
	cases := []struct {
		name string
		p    Params
		want []float64
	}{
		{"temperature 1", Params{Temperature: 1, Seed: 1}, base},
		{"temperature 2", Params{Temperature: 2, Seed: 2}, hot},
		{"top-k 3", Params{Temperature: 1, TopK: 3, Seed: 3}, renorm(base, 0, 1, 2)},
		// base: .561 .206 .125 .076 .028 0 .004; cumulative .561 .767 .892.
		{"top-p 0.7", Params{Temperature: 1, TopP: 0.7, Seed: 4}, renorm(base, 0, 1)},
		{"top-p 0.8", Params{Temperature: 1, TopP: 0.8, Seed: 4}, renorm(base, 0, 1, 2)},
		{"top-p 0.4", Params{Temperature: 1, TopP: 0.4, Seed: 5}, renorm(base, 0)},
		// min-p 0.2: keep p >= 0.2*0.561 = .112: tokens 0,1,2.
		{"min-p 0.2", Params{Temperature: 1, MinP: 0.2, Seed: 6}, renorm(base, 0, 1, 2)},
		{"top-k 4 + min-p 0.3", Params{Temperature: 1, TopK: 4, MinP: 0.3, Seed: 7}, renorm(base, 0, 1)},
		// hot: .363 .220 .172 ...: top-p .5 keeps 2.
		{"temperature 2 + top-p 0.5", Params{Temperature: 2, TopP: 0.5, Seed: 8}, renorm(hot, 0, 1)},
	}
	for _, c := range cases {
		checkDist(t, c.name, counts(t, c.p, logits, n), c.want)
	}
}

func TestGreedyEdgeCases(t *testing.T) {
	inf := float32(math.Inf(-1))
	cases := []struct {
		name   string
		p      Params
		logits []float32
		want   int32
	}{
		{"zero params", Params{}, []float32{0, 3, 1}, 1},
		{"ties pick lowest id", Params{}, []float32{1, 5, 5, 2}, 1},
		{"temperature 0", Params{Temperature: 0, TopK: 50, TopP: 0.5, Seed: 9}, []float32{0, 1, 9, 1}, 2},
		{"top-p 1e-9", Params{Temperature: 1.5, TopP: 1e-9, Seed: 9}, []float32{0.5, 0.7, 0.6}, 1},
		{"top-k 1", Params{Temperature: 5, TopK: 1, Seed: 9}, []float32{0.5, 0.7, 0.6}, 1},
		{"all -Inf but one", Params{Temperature: 1, Seed: 9}, []float32{inf, inf, -50, inf}, 2},
		{"all -Inf but one, top-k", Params{Temperature: 1, TopK: 3, TopP: 0.9, MinP: 0.5, Seed: 9}, []float32{inf, -1e30, inf}, 1},
		{"huge logits", Params{Temperature: 1, Seed: 9}, []float32{3e38, -3e38, 1}, 0},
	}
	for _, c := range cases {
		s := mustNew(t, c.p, len(c.logits))
		for range 20 {
			r, err := s.Sample(c.logits)
			if err != nil || r.Token != c.want {
				t.Fatalf("%s: got %d, %v want %d", c.name, r.Token, err, c.want)
			}
		}
	}
}

func TestErrors(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	s := mustNew(t, Params{Temperature: 1}, 3)
	for _, c := range []struct {
		logits []float32
		err    error
	}{
		{[]float32{0, nan, 1}, ErrNaN},
		{[]float32{0, inf, 1}, ErrNaN},
		{[]float32{-inf, -inf, -inf}, ErrNoCandidates},
		{[]float32{0, 1}, ErrVocab},
	} {
		if _, err := s.Sample(c.logits); !errors.Is(err, c.err) {
			t.Errorf("%v: err %v want %v", c.logits, err, c.err)
		}
	}
	for _, p := range []Params{
		{TopK: -1}, {TopP: -0.1}, {MinP: 1.5}, {Temperature: float32(math.NaN())}, {TopLogProbs: 21},
	} {
		if _, err := New(p, 10); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

func TestSeedReplay(t *testing.T) {
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i))) * 3
	}
	run := func(seed uint64) []int32 {
		s := mustNew(t, Params{Temperature: 0.9, TopK: 200, TopP: 0.95, MinP: 0.01, Seed: seed}, len(logits))
		var out []int32
		for range 200 {
			r, _ := s.Sample(logits)
			out = append(out, r.Token)
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	if !slices.Equal(a, b) {
		t.Error("same seed gave different tokens")
	}
	if slices.Equal(a, c) {
		t.Error("different seeds gave identical sequences")
	}
	// The RNG is our own: its first outputs are fixed forever.
	r := newRNG(0)
	if got := [3]uint64{r.next(), r.next(), r.next()}; got != [3]uint64{0x99ec5f36cb75f2b4, 0xbf6e1f784956452a, 0x1a5f849d4933e6e0} {
		t.Errorf("rng(0) = %#x", got)
	}
}

func TestLogProbs(t *testing.T) {
	logits := []float32{1, 3, 2, float32(math.Inf(-1)), 3}
	s := mustNew(t, Params{TopLogProbs: 3, LogProbs: true}, len(logits))
	r, err := s.Sample(logits)
	if err != nil {
		t.Fatal(err)
	}
	p := softmax(logits, 1)
	if r.Token != 1 || math.Abs(float64(r.LogProb)-math.Log(p[1])) > 1e-6 {
		t.Errorf("chosen %d logprob %v, want 1 %v", r.Token, r.LogProb, math.Log(p[1]))
	}
	wantIDs := []int32{1, 4, 2}
	if len(r.Top) != 3 {
		t.Fatalf("top %v", r.Top)
	}
	for i, tl := range r.Top {
		if tl.Token != wantIDs[i] || math.Abs(float64(tl.LogProb)-math.Log(p[wantIDs[i]])) > 1e-6 {
			t.Errorf("top[%d] = %+v, want token %d logprob %v", i, tl, wantIDs[i], math.Log(p[wantIDs[i]]))
		}
	}
	// Fewer finite tokens than asked for.
	s = mustNew(t, Params{TopLogProbs: 5}, 3)
	inf := float32(math.Inf(-1))
	r, _ = s.Sample([]float32{inf, 0, inf})
	if len(r.Top) != 1 || r.Top[0].Token != 1 || r.Top[0].LogProb != 0 {
		t.Errorf("single finite: %+v", r.Top)
	}
}

// TestTopPMatchesFullSort checks the incremental nucleus selection against
// a plain full sort on a vocabulary where the nucleus needs several
// expansion rounds.
func TestTopPMatchesFullSort(t *testing.T) {
	const V = 5000
	logits := make([]float32, V)
	for i := range logits {
		logits[i] = float32((i*7919)%V) / V // flat-ish: a wide nucleus
	}
	for _, topP := range []float32{0.01, 0.3, 0.9, 0.999} {
		s := mustNew(t, Params{Temperature: 0.05, TopP: topP}, V)
		m := slices.Max(logits)
		for i := range s.idx {
			s.idx[i] = int32(i)
		}
		n := s.truncate(logits, s.idx, m)
		if !slices.Equal(s.idx[:n], sortedPrefix(logits, n)) {
			t.Errorf("top-p %v: kept set is not the best %d in order", topP, n)
		}
		// Reference: sort everything, accumulate.
		ids := make([]int32, V)
		for i := range ids {
			ids[i] = int32(i)
		}
		sortCandidates(logits, ids)
		p := softmax(logits, 0.05)
		cum, want := 0.0, 0
		for i, id := range ids {
			cum += p[id]
			if cum >= float64(topP)*(1-1e-12) {
				want = i + 1
				break
			}
		}
		if n != want {
			t.Errorf("top-p %v: nucleus of %d, full sort says %d", topP, n, want)
		}
	}
}

func sortedPrefix(logits []float32, n int) []int32 {
	ids := make([]int32, len(logits))
	for i := range ids {
		ids[i] = int32(i)
	}
	sortCandidates(logits, ids)
	return ids[:n]
}

func TestTopK(t *testing.T) {
	const V = 3000
	logits := make([]float32, V)
	for i := range logits {
		logits[i] = float32((i * 104729) % 97) // many ties
	}
	for _, k := range []int{1, 2, 50, 97, 500, V - 1} {
		s := mustNew(t, Params{Temperature: 1, TopK: k}, V)
		for i := range s.idx {
			s.idx[i] = int32(i)
		}
		n := s.truncate(logits, s.idx, slices.Max(logits))
		if n != k || !slices.Equal(s.idx[:n], sortedPrefix(logits, k)) {
			t.Errorf("top-k %d: kept %d, not the best k in order", k, n)
		}
	}
}

func TestNewStopIDs(t *testing.T) {
	s := NewStopIDs(nil, []int32{7, 3, 7}, false)
	if !s.Has(3) || !s.Has(7) || s.Has(4) {
		t.Errorf("stop ids %v", s.ids)
	}
}
