package engine

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// BenchmarkPDGenerate runs batches of 8 concurrent greedy requests (prompt
// 32, 16 new tokens) through prefill, the inproc link and decode; it
// reports generated tokens per second.
func BenchmarkPDGenerate(b *testing.B) {
	h := newPD(b, pdOptions{pageSize: 16, decodePages: 64, prefillPages: 32, chunk: 128, maxRunning: 8, window: 256})
	rng := rand.New(rand.NewPCG(1, 2))
	reqs := make([]*req, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		for i := range reqs {
			reqs[i] = &req{tenant: "b", prompt: prompt(rng, 32), max: 16}
			wg.Go(func() {
				if res := h.run(reqs[i]); res.err != nil {
					b.Error(res.err)
				}
			})
		}
		wg.Wait()
	}
	st := h.dw.Stats()
	b.ReportMetric(float64(st.GeneratedTokens)/b.Elapsed().Seconds(), "tokens/s")
}
