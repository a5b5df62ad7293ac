package sampling

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Params configure a Sampler. The zero value is greedy decoding.
type Params struct {
	// Temperature divides the logits before the softmax. 0 (or less)
	// means greedy: the highest logit, lowest id on ties.
	Temperature float32
	// TopK keeps the K highest logits; 0 keeps all.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// (after temperature and top-k) reaches P; 0 or >= 1 keeps all.
	TopP float32
	// MinP keeps tokens whose probability is at least MinP times the most
	// likely token's (after temperature, top-k and top-p); 0 keeps all.
	MinP float32
	// Seed determines every random draw: the same seed, parameters and
	// logits give the same tokens.
	Seed uint64
	// LogProbs asks for the chosen token's log probability; TopLogProbs
	// for that many most likely alternatives as well (OpenAI's logprobs /
	// top_logprobs). Both are computed on the model's distribution (the
	// raw logits, before temperature and truncation).
	LogProbs    bool
	TopLogProbs int
}

// MaxTopLogProbs bounds Params.TopLogProbs (OpenAI allows 20).
const MaxTopLogProbs = 20

// Errors of Sample. They describe the logits row, never its content.
var (
	// ErrNaN is returned when a logit is NaN or +Inf: the row is
	// corrupt and no token can be chosen honestly.
	ErrNaN = errors.New("sampling: logits contain NaN or +Inf")
	// ErrNoCandidates is returned when every logit is -Inf.
	ErrNoCandidates = errors.New("sampling: every logit is -Inf")
	// ErrVocab is returned when the row's length is not the vocabulary
	// size the Sampler was built for.
	ErrVocab = errors.New("sampling: logits row has the wrong length")
)

// TokenLogProb is a token with its log probability.
type TokenLogProb struct {
	Token   int32
	LogProb float32
}

// Result is one sampled token.
type Result struct {
	Token int32
	// LogProb is the chosen token's log probability under the model's
	// distribution (when Params.LogProbs or TopLogProbs; else 0).
	LogProb float32
	// Top holds the Params.TopLogProbs most likely tokens, most likely
	// first (ties: lower id first). It aliases the Sampler's memory and is
	// valid until the next Sample call.
	Top []TokenLogProb
}

// Sampler samples tokens for one sequence. It is not safe for concurrent
// use.
type Sampler struct {
	p     Params
	vocab int
	rng   rng
	idx   []int32 // candidate ids; the only vocabulary-sized scratch
	heap  []int32 // selection heap for small k
	top   []TokenLogProb
}

// New returns a Sampler for rows of vocab logits.
func New(p Params, vocab int) (*Sampler, error) {
	switch {
	case vocab <= 0:
		return nil, fmt.Errorf("sampling: vocabulary size %d", vocab)
	case math.IsNaN(float64(p.Temperature)) || math.IsInf(float64(p.Temperature), 0):
		return nil, fmt.Errorf("sampling: temperature must be finite")
	case p.TopK < 0:
		return nil, fmt.Errorf("sampling: top_k %d is negative", p.TopK)
	case !(p.TopP >= 0) || math.IsInf(float64(p.TopP), 0):
		return nil, fmt.Errorf("sampling: top_p must be a finite value >= 0")
	case !(p.MinP >= 0 && p.MinP <= 1):
		return nil, fmt.Errorf("sampling: min_p must be in [0, 1]")
	case p.TopLogProbs < 0 || p.TopLogProbs > MaxTopLogProbs:
		return nil, fmt.Errorf("sampling: top_logprobs must be in [0, %d]", MaxTopLogProbs)
	}
	return &Sampler{
		p:     p,
		vocab: vocab,
		rng:   newRNG(p.Seed),
		idx:   make([]int32, vocab),
		heap:  make([]int32, 0, heapSelectMax),
		top:   make([]TokenLogProb, 0, p.TopLogProbs),
	}, nil
}

// Params returns the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

// Sample picks a token from logits (one row, length = vocabulary size).
// It allocates nothing.
func (s *Sampler) Sample(logits []float32) (Result, error) {
	if len(logits) != s.vocab {
		return Result{}, ErrVocab
	}
	// One pass: validity, the maximum (lowest id on ties) and the finite
	// candidates in id order.
	best := int32(-1)
	m := float32(math.Inf(-1))
	n := 0
	for i, l := range logits {
		if l != l || l > math.MaxFloat32 {
			return Result{}, ErrNaN
		}
		if l < -math.MaxFloat32 {
			continue
		}
		s.idx[n] = int32(i)
		n++
		if l > m {
			m, best = l, int32(i)
		}
	}
	if best < 0 {
		return Result{}, ErrNoCandidates
	}
	tok := best
	if s.p.Temperature > 0 && s.p.TopK != 1 {
		tok = s.sampleFrom(logits, s.idx[:n], m)
	}
	res := Result{Token: tok}
	if s.p.LogProbs || s.p.TopLogProbs > 0 {
		lse := logSumExp(logits, m)
		res.LogProb = float32(float64(logits[tok]) - lse)
		if s.p.TopLogProbs > 0 {
			res.Top = s.topLogProbs(logits, lse)
		}
	}
	return res, nil
}

// better orders candidates: higher logit first, lower id on ties. It is a
// total order, so selections and sorts by it are deterministic.
func better(logits []float32, a, b int32) bool {
	return logits[a] > logits[b] || logits[a] == logits[b] && a < b
}

// sampleFrom applies temperature, top-k, top-p and min-p to the finite
// candidates idx (in id order) and draws one. m is the largest logit.
func (s *Sampler) sampleFrom(logits []float32, idx []int32, m float32) int32 {
	t := float64(s.p.Temperature)
	w := func(id int32) float64 { return math.Exp((float64(logits[id]) - float64(m)) / t) }
	n := s.truncate(logits, idx, m)
	// Draw: walk the kept candidates in their (deterministic) order.
	var z float64
	for _, id := range idx[:n] {
		z += w(id)
	}
	u := s.rng.float64() * z
	var cum float64
	for _, id := range idx[:n] {
		cum += w(id)
		if u < cum {
			return id
		}
	}
	return idx[n-1] // u rounded up to z
}

// truncate applies top-k, top-p and min-p (on the temperature-scaled
// distribution) to idx, leaving the kept candidates in idx[:n] in a
// deterministic order: sorted best first when top-k or top-p ran, else in
// id order.
func (s *Sampler) truncate(logits []float32, idx []int32, m float32) (n int) {
	t := float64(s.p.Temperature)
	w := func(id int32) float64 { return math.Exp((float64(logits[id]) - float64(m)) / t) }
	n = len(idx)
	sorted := false
	if k := s.p.TopK; k > 0 && k < n {
		s.selectTop(logits, idx, k)
		n = k
		sortCandidates(logits, idx[:n])
		sorted = true
	}
	if p := float64(s.p.TopP); p > 0 && p < 1 {
		var z float64
		for _, id := range idx[:n] {
			z += w(id)
		}
		target := p * z
		// Sort only as much as needed: the nucleus is usually small, so
		// select the top 64, then 512, ... until it is covered.
		// The best `done` candidates keep their place and order when the
		// selection grows (the order is total), so their mass is summed once.
		k := n
		if !sorted {
			k = min(n, 64)
		}
		cum, done := 0.0, 0
		for {
			if !sorted {
				if k < n {
					s.selectTop(logits, idx[done:n], k-done)
				}
				sortCandidates(logits, idx[done:k])
			}
			cut := -1
			for i := done; i < k; i++ {
				cum += w(idx[i])
				if cum >= target {
					cut = i + 1
					break
				}
			}
			if cut > 0 {
				n = cut
				sorted = true
				break
			}
			if k == n { // rounding: keep everything
				sorted = true
				break
			}
			done, k = k, min(n, k*8)
		}
	}
	if mp := float64(s.p.MinP); mp > 0 {
		// p_i >= min_p * p_max  <=>  logit_i >= m + T*ln(min_p).
		thr := float64(m) + t*math.Log(mp)
		j := 0
		for _, id := range idx[:n] {
			if float64(logits[id]) >= thr {
				idx[j] = id
				j++
			}
		}
		n = j
	}
	return n
}

// heapSelectMax is the largest k selected with a heap; larger k use
// quickselect.
const heapSelectMax = 256

// selectTop partially orders idx so that its first k entries (k < len)
// are the k best, in no particular order; idx stays a permutation.
func (s *Sampler) selectTop(logits []float32, idx []int32, k int) {
	if k > heapSelectMax {
		quickSelect(logits, idx, k)
		return
	}
	// One pass keeps the k best in a heap whose root is the worst of
	// them; most candidates lose one comparison against the root. A second
	// pass moves everything at least as good as the root to the front:
	// exactly k entries, since the order is total.
	h := s.heap[:0]
	worse := func(a, b int32) bool { return better(logits, b, a) }
	down := func(i int) {
		for {
			l, m := 2*i+1, i
			if l < len(h) && worse(h[l], h[m]) {
				m = l
			}
			if l+1 < len(h) && worse(h[l+1], h[m]) {
				m = l + 1
			}
			if m == i {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for _, id := range idx {
		if len(h) < k {
			h = append(h, id)
			for i := len(h) - 1; i > 0; {
				p := (i - 1) / 2
				if !worse(h[i], h[p]) {
					break
				}
				h[i], h[p] = h[p], h[i]
				i = p
			}
			continue
		}
		if better(logits, id, h[0]) {
			h[0] = id
			down(0)
		}
	}
	root := h[0]
	j := 0
	for i, id := range idx {
		if !better(logits, root, id) {
			idx[i], idx[j] = idx[j], idx[i]
			j++
		}
	}
	s.heap = h[:0]
}

// quickSelect is selectTop by quickselect with a median-of-three pivot.
func quickSelect(logits []float32, idx []int32, k int) {
	lo, hi := 0, len(idx)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		// Median of three to idx[hi] as pivot.
		if better(logits, idx[mid], idx[lo]) {
			idx[mid], idx[lo] = idx[lo], idx[mid]
		}
		if better(logits, idx[hi], idx[lo]) {
			idx[hi], idx[lo] = idx[lo], idx[hi]
		}
		if better(logits, idx[mid], idx[hi]) {
			idx[mid], idx[hi] = idx[hi], idx[mid]
		}
		pivot := idx[hi]
		i := lo
		for j := lo; j < hi; j++ {
			if better(logits, idx[j], pivot) {
				idx[i], idx[j] = idx[j], idx[i]
				i++
			}
		}
		idx[i], idx[hi] = idx[hi], idx[i]
		switch {
		case i == k-1 || i == k:
			return
		case i < k:
			lo = i + 1
		default:
			hi = i - 1
		}
	}
}

func sortCandidates(logits []float32, idx []int32) {
	slices.SortFunc(idx, func(a, b int32) int {
		if better(logits, a, b) {
			return -1
		}
		if a == b {
			return 0
		}
		return 1
	})
}

// logSumExp is log(sum(exp(logits))) given their maximum m (finite).
func logSumExp(logits []float32, m float32) float64 {
	var z float64
	fm := float64(m)
	for _, l := range logits {
		if l >= -math.MaxFloat32 {
			z += math.Exp(float64(l) - fm)
		}
	}
	return fm + math.Log(z)
}

// topLogProbs returns the TopLogProbs most likely tokens (reusing idx,
// which sampling no longer needs).
func (s *Sampler) topLogProbs(logits []float32, lse float64) []TokenLogProb {
	n := 0
	for i, l := range logits {
		if l >= -math.MaxFloat32 {
			s.idx[n] = int32(i)
			n++
		}
	}
	k := min(s.p.TopLogProbs, n)
	if k < n {
		s.selectTop(logits, s.idx[:n], k)
	}
	sortCandidates(logits, s.idx[:k])
	s.top = s.top[:0]
	for _, id := range s.idx[:k] {
		s.top = append(s.top, TokenLogProb{Token: id, LogProb: float32(float64(logits[id]) - lse)})
	}
	return s.top
}
