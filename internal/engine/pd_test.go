package engine

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

func prompt(rng *rand.Rand, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(rng.IntN(256))
	}
	return p
}

// TestGreedyMatchesReference is I7 through the whole PD path: concurrent
// requests of different lengths, chunked prefill of several sizes, the
// inproc transport, continuous batching; every output equals the request
// run alone.
func TestGreedyMatchesReference(t *testing.T) {
	for _, chunk := range []int{5, 64} {
		t.Run("chunk"+itoa(chunk), func(t *testing.T) {
			h := newPD(t, pdOptions{pageSize: 4, decodePages: 160, prefillPages: 40, chunk: chunk, maxRunning: 8, window: 128})
			rng := rand.New(rand.NewPCG(uint64(chunk), 1))
			const n = 18
			reqs := make([]*req, n)
			for i := range reqs {
				reqs[i] = &req{tenant: "t" + itoa(i%3), prompt: prompt(rng, 1+rng.IntN(60)), max: 1 + rng.IntN(16)}
			}
			results := make([]result, n)
			var wg sync.WaitGroup
			for i, r := range reqs {
				wg.Go(func() { results[i] = h.run(r) })
			}
			wg.Wait()
			for i, r := range reqs {
				want := reference(t, h.m, r.prompt, r.max, nil)
				res := results[i]
				if res.err != nil || res.prefErr != nil {
					t.Fatalf("request %d: stream %v, prefill %v", i, res.err, res.prefErr)
				}
				if got := res.ids(); !slices.Equal(got, want) {
					t.Errorf("request %d (prompt %d, max %d): got %v, want %v", i, len(r.prompt), r.max, got, want)
				}
				if i < 3 {
					t.Logf("request %d: prompt %d, %d tokens %v", i, len(r.prompt), len(want), want)
				}
				last := res.events[len(res.events)-1]
				if last.Finish == "" {
					t.Errorf("request %d: last event has no finish reason", i)
				}
			}
			st := h.dw.Stats()
			t.Logf("%d steps for %d generated tokens, largest batch %d", st.Steps, st.GeneratedTokens, st.MaxBatch)
			h.waitRest()
		})
	}
}

func itoa(i int) string {
	return string(rune('0'+i/10%10)) + string(rune('0'+i%10))
}

// TestContinuousBatching holds decode steps until six sequences are active,
// so the first step carries all of them; they then leave one by one as they
// reach their own max_tokens, and every output still equals the reference.
func TestContinuousBatching(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 120, prefillPages: 40, chunk: 32, maxRunning: 8, window: 128})
	h.dw.hold.Store(100)
	rng := rand.New(rand.NewPCG(3, 3))
	reqs := make([]*req, 6)
	results := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i := range reqs {
		reqs[i] = &req{tenant: "a", prompt: prompt(rng, 3+7*i), max: 4 + 3*i}
		wg.Go(func() { results[i] = h.run(reqs[i]) })
	}
	for h.dw.Stats().Active < len(reqs) {
		time.Sleep(time.Millisecond)
	}
	if st := h.dw.Stats(); st.Steps != 0 {
		t.Fatalf("%d steps ran while held", st.Steps)
	}
	h.dw.hold.Store(0)
	h.dw.in.put(op{kind: opAbort})
	wg.Wait()
	for i, r := range reqs {
		want := reference(t, h.m, r.prompt, r.max, nil)
		if got := results[i].ids(); results[i].err != nil || !slices.Equal(got, want) {
			t.Errorf("request %d: got %v (%v), want %v", i, got, results[i].err, want)
		}
	}
	if st := h.dw.Stats(); st.MaxBatch != len(reqs) {
		t.Errorf("largest batch %d, want %d", st.MaxBatch, len(reqs))
	}
	h.waitRest()
}
