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

// TestSampledAndLogprobs: seeded sampling, stop ids and logprobs through
// the PD path equal one process sampling the same request: the prefill
// worker's first draw and the decode worker's later draws come from one
// seeded stream, and the first token's logprobs are recomputed on decode.
func TestSampledAndLogprobs(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 200, prefillPages: 64, chunk: 16, maxRunning: 8, window: 128})
	rng := rand.New(rand.NewPCG(12, 12))
	cases := []struct {
		s        Sampling
		logprobs bool
		top      int
		stops    bool
	}{
		{Sampling{}, true, 0, false},
		{Sampling{}, true, 5, true},
		{Sampling{Temperature: 0.9, Seed: 42}, false, 0, false},
		{Sampling{Temperature: 1.3, TopP: 0.8, Seed: 7}, true, 3, false},
		{Sampling{Temperature: 0.7, TopK: 20, MinP: 0.05, Seed: 99}, false, 2, true},
		{Sampling{Temperature: 1, Seed: 5}, true, 1, false},
	}
	type out struct {
		r     *req
		stops []int32
		res   result
	}
	outs := make([]out, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		r := &req{tenant: "x", prompt: prompt(rng, 5+rng.IntN(30)), max: 1 + rng.IntN(14), sampling: c.s, logprobs: c.logprobs, top: c.top}
		var stops []int32
		if c.stops {
			// Stop on the third token the request would generate.
			full := referenceEvents(t, h.m, r.prompt, r.max, nil, c.s, false, 0)
			if len(full) >= 3 {
				stops = []int32{full[2].ID}
			}
		}
		outs[i] = out{r: r, stops: stops}
		wg.Go(func() { outs[i].res = h.runStops(r, stops) })
	}
	wg.Wait()
	for i, o := range outs {
		c := cases[i]
		want := referenceEvents(t, h.m, o.r.prompt, o.r.max, o.stops, c.s, c.logprobs, c.top)
		got := o.res.events
		if o.res.err != nil || len(got) != len(want) {
			t.Fatalf("case %d: %d events (%v), want %d", i, len(got), o.res.err, len(want))
		}
		for k := range want {
			g, w := got[k], want[k]
			if g.ID != w.ID || g.Finish != w.Finish || g.Logprob != w.Logprob || len(g.Top) != len(w.Top) {
				t.Fatalf("case %d token %d: got %+v, want %+v", i, k, g, w)
			}
			for j := range w.Top {
				if g.Top[j] != w.Top[j] {
					t.Fatalf("case %d token %d top %d: got %+v, want %+v", i, k, j, g.Top[j], w.Top[j])
				}
			}
			if c.logprobs && k > 0 && g.Logprob >= 0 {
				t.Errorf("case %d token %d: logprob %v", i, k, g.Logprob)
			}
		}
	}
	h.waitRest()
}
