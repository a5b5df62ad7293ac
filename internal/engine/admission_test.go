package engine

import (
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

// TestContextLengthRejectedBeforeReservation is I3: a request that can
// never fit gets the original error from Generate, the prefill side gets
// the same error through the decode side's Reject, and no page is held.
func TestContextLengthRejectedBeforeReservation(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 64, prefillPages: 32, chunk: 16, maxRunning: 4, window: 100})
	rng := rand.New(rand.NewPCG(5, 5))
	cases := []struct {
		prompt, max int
	}{
		{90, 11},  // one over the window
		{101, 1},  // the prompt alone
		{60, 100}, // max_tokens
	}
	for _, c := range cases {
		r := &req{tenant: "a", prompt: prompt(rng, c.prompt), max: c.max}
		g, p := h.open(r)
		s, err := h.dw.Generate(h.ctx, g)
		var cle *reqerr.ContextLengthError
		if s != nil || !errors.As(err, &cle) {
			t.Fatalf("prompt %d max %d: stream %v, error %v; want a context length error", c.prompt, c.max, s, err)
		}
		if cle.Prompt != c.prompt || cle.MaxTokens != c.max || cle.Limit != 100 {
			t.Errorf("error %+v, want prompt %d max %d limit 100", *cle, c.prompt, c.max)
		}
		// The router also sent the request to the prefill worker: it is
		// refused there and computes nothing: with the original error when
		// the Prefill came first, as aborted when the decode side's Reject
		// did (the room is then tombstoned).
		perr := h.pw.Prefill(h.ctx, p)
		switch {
		case errors.As(perr, &cle):
			if cle.Prompt != c.prompt || cle.Limit != 100 {
				t.Errorf("prefill: %v, want the context length error", perr)
			}
		case reqerr.KindOf(perr) != reqerr.KindAborted:
			t.Errorf("prefill: %v, want the context length error or aborted", perr)
		}
		if cnt := h.dpool.Counts(); cnt.Free != cnt.Total {
			t.Errorf("decode pool after a rejection: %+v", cnt)
		}
	}
	if st := h.dw.Stats(); st.Rejected[reqerr.KindContextLength] != uint64(len(cases)) || st.Machine.Granted != 0 {
		t.Errorf("rejected %v, granted %d", st.Rejected, st.Machine.Granted)
	}
	if st := h.pw.Stats(); st.PromptTokens != 0 {
		t.Errorf("prefill computed %d tokens for rejected requests", st.PromptTokens)
	}
	// A request that fits is still served.
	r := &req{tenant: "a", prompt: prompt(rng, 50), max: 50}
	if res := h.run(r); res.err != nil || !slices.Equal(res.ids(), reference(t, h.m, r.prompt, r.max, nil)) {
		t.Errorf("fitting request: %v %v", res.ids(), res.err)
	}
	h.waitRest()
}

// TestInvalidRequests: requests that disagree with their signed message are
// refused before anything is reserved.
func TestInvalidRequests(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 32, prefillPages: 32, chunk: 16, maxRunning: 4, window: 100})
	r := &req{tenant: "a", prompt: []int32{1, 2, 3}, max: 4}
	cases := []struct {
		name string
		edit func(g *GenerateRequest)
	}{
		{"prompt longer than signed", func(g *GenerateRequest) { g.Prompt = append(g.Prompt, 4) }},
		{"max tokens differ", func(g *GenerateRequest) { g.MaxTokens = 5 }},
		{"bad MAC", func(g *GenerateRequest) { o := *g.Open; o.MaxTokens = 5; g.Open = &o; g.MaxTokens = 5 }},
		{"token outside vocabulary", func(g *GenerateRequest) { g.Prompt = []int32{1, 2, 1 << 20} }},
		{"top logprobs", func(g *GenerateRequest) { g.TopLogprobs = 21 }},
		{"no open", func(g *GenerateRequest) { g.Open = nil }},
	}
	for _, c := range cases {
		g, _ := h.open(r)
		c.edit(g)
		if _, err := h.dw.Generate(h.ctx, g); reqerr.KindOf(err) != reqerr.KindInvalidRequest {
			t.Errorf("%s: %v, want invalid_request", c.name, err)
		}
	}
	if cnt := h.dpool.Counts(); cnt.Free != cnt.Total {
		t.Errorf("pool: %+v", cnt)
	}
}

// TestCapacityCheck is I6: a pool smaller than the window refuses to start
// with both numbers, or lowers the window when asked.
func TestCapacityCheck(t *testing.T) {
	m := tinyModel(t)
	auth, _ := transfer.NewAuth(secret)
	pool, err := kvpool.New(kvpool.Config{Shape: PoolShape(m, 16), Pages: 10})
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewDecodeWorker(DecodeConfig{Model: m, Pool: pool, Auth: auth, ContextWindow: 512})
	var ce *kvpool.CapacityError
	if !errors.As(err, &ce) || ce.PoolTokens != 160 || ce.Window != 512 {
		t.Fatalf("NewDecodeWorker: %v, want a capacity error naming 160 and 512", err)
	}
	_, err = NewPrefillWorker(PrefillConfig{Model: m, Pool: pool, Auth: auth, ContextWindow: 512})
	if !errors.As(err, &ce) {
		t.Fatalf("NewPrefillWorker: %v, want a capacity error", err)
	}
	w, err := NewDecodeWorker(DecodeConfig{Model: m, Pool: pool, Auth: auth, ContextWindow: 512, LowerWindow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(t.Context())
	if w.ContextWindow() != 160 || w.Note() == "" || w.Info().ContextWindow != 160 {
		t.Errorf("lowered window %d, note %q", w.ContextWindow(), w.Note())
	}
	bad, _ := kvpool.New(kvpool.Config{Shape: kvpool.Shape{Layers: 3, KVHeads: 2, HeadDim: 16, PageSize: 16}, Pages: 64})
	if _, err := NewDecodeWorker(DecodeConfig{Model: m, Pool: bad, Auth: auth}); err == nil {
		t.Error("a pool of another model's shape was accepted")
	}
}

// TestTenantFairness: with one running slot, a tenant that queued ten
// requests does not make another tenant's two requests wait behind all of
// them: admission alternates between tenants.
func TestTenantFairness(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 64, prefillPages: 64, chunk: 64, maxRunning: 1, window: 100})
	var mu sync.Mutex
	var order []string
	tenantOf := map[transfer.RoomID]string{}
	h.dw.onAdmit = func(room transfer.RoomID) {
		mu.Lock()
		order = append(order, tenantOf[room])
		mu.Unlock()
	}
	rng := rand.New(rand.NewPCG(9, 9))
	var reqs []*req
	for i := range 12 {
		tenant := "flood"
		if i >= 10 {
			tenant = "small"
		}
		r := &req{tenant: tenant, prompt: prompt(rng, 8), max: 3}
		h.open(r) // mints the room
		mu.Lock()
		tenantOf[r.room] = tenant
		mu.Unlock()
		reqs = append(reqs, r)
	}
	// Hold decode so the first request cannot finish before all are
	// queued, and queue them in order.
	h.dw.hold.Store(100)
	var wg sync.WaitGroup
	results := make([]result, len(reqs))
	for i, r := range reqs {
		wg.Go(func() { results[i] = h.run(r) })
		for h.dw.Stats().Running+h.dw.Stats().Queued < i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	h.dw.hold.Store(0)
	h.dw.in.put(op{kind: opAbort})
	wg.Wait()
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// The first flood request is admitted alone; the next flood request
	// had its turn when small arrived (a tenant that becomes busy goes last
	// in the round); from then on the tenants alternate.
	want := []string{"flood", "flood", "small", "flood", "small", "flood", "flood"}
	if !slices.Equal(order[:len(want)], want) {
		t.Errorf("admission order %v, want it to start %v", order, want)
	}
	h.waitRest()
}

func TestFairQueue(t *testing.T) {
	f := newFairQueue()
	mk := func(tenant string, id byte) *dreq {
		return &dreq{req: &GenerateRequest{Tenant: tenant}, room: transfer.RoomID{id}}
	}
	for i := range 4 {
		f.push("a", mk("a", byte(i)))
	}
	f.push("b", mk("b", 10))
	f.push("c", mk("c", 20))
	f.push("b", mk("b", 11))
	gone := mk("c", 21)
	f.push("c", gone)
	f.remove(gone)
	var got []byte
	for f.peek() != nil {
		got = append(got, f.peek().room[0])
		f.pop()
	}
	want := []byte{0, 10, 20, 1, 11, 2, 3}
	if !slices.Equal(got, want) || f.len() != 0 {
		t.Errorf("order %v, want %v (len %d)", got, want, f.len())
	}
}

// TestNoCrossPoolDeadlock: prefill requests that arrive long before their
// decode admission do not take prefill pages. If they did, a prefill pool
// full of rooms the decode side has not admitted, and decode slots full of
// rooms waiting for prefill pages, would wait for each other until the
// timeouts failed them. Here the Generates come last and in reverse order.
func TestNoCrossPoolDeadlock(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 64, prefillPages: 8, chunk: 8, maxRunning: 2, window: 32})
	rng := rand.New(rand.NewPCG(13, 13))
	const n = 8
	reqs := make([]*req, n)
	gens := make([]*GenerateRequest, n)
	perrs := make([]chan error, n)
	for i := range reqs {
		reqs[i] = &req{tenant: "a", prompt: prompt(rng, 13+rng.IntN(4)), max: 4}
		g, p := h.open(reqs[i])
		gens[i] = g
		perrs[i] = make(chan error, 1)
		go func() { perrs[i] <- h.pw.Prefill(h.ctx, p) }()
	}
	for h.pw.Stats().Waiting < n {
		time.Sleep(time.Millisecond)
	}
	if c := h.ppool.Counts(); c.Allocated != 0 {
		t.Fatalf("prefill pages taken before any grant: %+v", c)
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := n - 1; i >= 0; i-- {
		s, err := h.dw.Generate(h.ctx, gens[i])
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer s.Close()
			for {
				ev, err := s.Next(h.ctx)
				if err != nil {
					if !errors.Is(err, io.EOF) {
						results[i].err = err
					}
					return
				}
				results[i].events = append(results[i].events, ev)
			}
		})
	}
	wg.Wait()
	for i, r := range reqs {
		if err := <-perrs[i]; err != nil || results[i].err != nil {
			t.Fatalf("request %d: prefill %v, stream %v", i, err, results[i].err)
		}
		if got, want := results[i].ids(), reference(t, h.m, r.prompt, r.max, nil); !slices.Equal(got, want) {
			t.Errorf("request %d: %v, want %v", i, got, want)
		}
	}
	h.waitRest()
}
