package engine

import (
	"math"
	"slices"
)

// sampler chooses tokens from logits. It is owned by one driver goroutine
// and keeps its scratch between calls, so sampling allocates nothing per
// token (Top slices aside, which only requests asking for top logprobs get).
//
// Draws are counter-based: the uniform number for a request's k-th
// generated token is a function of (Seed, k) only, so the prefill worker
// (k = 0) and the decode worker (k >= 1) sample exactly as one process
// would.
type sampler struct {
	probs []float64
	idx   []int32
}

func newSampler(vocab int) *sampler {
	return &sampler{probs: make([]float64, vocab), idx: make([]int32, vocab)}
}

// choice is one sampled token with what was asked about it.
type choice struct {
	id      int32
	logprob float32
	top     []TopLogprob
}

// pick samples token number k of a request from logits.
func (s *sampler) pick(logits []float32, p Sampling, k uint64, logprobs bool, topN int) choice {
	var c choice
	if p.Temperature <= 0 {
		c.id = argmax(logits)
	} else {
		c.id = s.draw(logits, p, k)
	}
	if logprobs || topN > 0 {
		lse := logSumExp(logits)
		c.logprob = float32(float64(logits[c.id]) - lse)
		if topN > 0 {
			c.top = s.top(logits, topN, lse)
		}
	}
	return c
}

// argmax returns the index of the largest logit; the lowest index wins a
// tie, so greedy decoding is a pure function of the logits.
func argmax(logits []float32) int32 {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return int32(best)
}

func logSumExp(logits []float32) float64 {
	m := float64(logits[argmax(logits)])
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v) - m)
	}
	return m + math.Log(sum)
}

// draw samples from softmax(logits/T), restricted to the smallest set of
// most likely tokens whose mass reaches TopP.
func (s *sampler) draw(logits []float32, p Sampling, k uint64) int32 {
	n := len(logits)
	probs, idx := s.probs[:n], s.idx[:n]
	m := float64(logits[argmax(logits)])
	var sum float64
	for i, v := range logits {
		e := math.Exp((float64(v) - m) / p.Temperature)
		probs[i] = e
		sum += e
		idx[i] = int32(i)
	}
	u := uniform(p.Seed, k)
	if p.TopP > 0 && p.TopP < 1 {
		slices.SortFunc(idx, func(a, b int32) int {
			switch {
			case probs[a] > probs[b]:
				return -1
			case probs[a] < probs[b]:
				return 1
			}
			return int(a - b)
		})
		var mass float64
		cut := n
		for j, i := range idx {
			mass += probs[i] / sum
			if mass >= p.TopP {
				cut = j + 1
				break
			}
		}
		idx = idx[:cut]
		sum = 0
		for _, i := range idx {
			sum += probs[i]
		}
	}
	target := u * sum
	var acc float64
	for _, i := range idx {
		acc += probs[i]
		if acc > target {
			return i
		}
	}
	return idx[len(idx)-1]
}

// top returns the n most likely tokens with their log probabilities.
func (s *sampler) top(logits []float32, n int, lse float64) []TopLogprob {
	n = min(n, len(logits))
	out := make([]TopLogprob, 0, n)
	for i, v := range logits {
		lp := float32(float64(v) - lse)
		if len(out) == n && lp <= out[n-1].Logprob {
			continue
		}
		j := len(out)
		if j < n {
			out = append(out, TopLogprob{})
		} else {
			j = n - 1
		}
		for j > 0 && out[j-1].Logprob < lp {
			out[j] = out[j-1]
			j--
		}
		out[j] = TopLogprob{ID: int32(i), Logprob: lp}
	}
	return out
}

// uniform returns a number in [0, 1) that depends only on seed and k
// (splitmix64 of the pair).
func uniform(seed, k uint64) float64 {
	x := seed ^ (k+1)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}
