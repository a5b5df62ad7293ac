package sampling

import (
	"math"
	"testing"
)

// qwenVocab is Qwen3's vocabulary size, the largest the demo model uses.
const qwenVocab = 151936

func benchLogits() []float32 {
	r := newRNG(7)
	l := make([]float32, qwenVocab)
	for i := range l {
		// Roughly Gaussian logits with std ~3, as a real model's row.
		u1, u2 := r.float64()+1e-12, r.float64()
		l[i] = float32(3 * math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2))
	}
	return l
}

func benchSample(b *testing.B, p Params) {
	logits := benchLogits()
	s := mustNew(b, p, len(logits))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Sample(logits); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGreedy(b *testing.B)      { benchSample(b, Params{}) }
func BenchmarkTemperature(b *testing.B) { benchSample(b, Params{Temperature: 0.8, Seed: 1}) }
func BenchmarkTopK40(b *testing.B)      { benchSample(b, Params{Temperature: 0.8, TopK: 40, Seed: 1}) }
func BenchmarkTopP095(b *testing.B)     { benchSample(b, Params{Temperature: 0.8, TopP: 0.95, Seed: 1}) }
func BenchmarkMinP005(b *testing.B)     { benchSample(b, Params{Temperature: 0.8, MinP: 0.05, Seed: 1}) }
func BenchmarkQwen3Default(b *testing.B) {
	// Qwen3's recommended thinking-mode settings.
	benchSample(b, Params{Temperature: 0.6, TopK: 20, TopP: 0.95, Seed: 1})
}
func BenchmarkTopLogProbs5(b *testing.B) {
	benchSample(b, Params{Temperature: 0.8, TopK: 40, LogProbs: true, TopLogProbs: 5, Seed: 1})
}
