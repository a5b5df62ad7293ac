package engine

import (
	"context"
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

// TestAbortsAtRandomPoints aborts requests before their grant, during the
// transfer and during decoding, among requests that run to the end: the
// others' outputs equal the reference (I7) and the pools come back to rest
// (I5).
func TestAbortsAtRandomPoints(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 200, prefillPages: 64, chunk: 8, maxRunning: 8, window: 128, drainTimeout: 20000})
	rng := rand.New(rand.NewPCG(21, 21))
	const n = 24
	type job struct {
		r    *req
		mode int // 0 runs to the end; 1 abort before the prefill; 2 abort mid-transfer; 3 close mid-decode
		wait time.Duration
		read int
	}
	jobs := make([]job, n)
	for i := range jobs {
		jobs[i] = job{
			r:    &req{tenant: "t" + itoa(i%4), prompt: prompt(rng, 2+rng.IntN(50)), max: 2 + rng.IntN(12)},
			mode: i % 4, wait: time.Duration(rng.IntN(3000)) * time.Microsecond, read: rng.IntN(3),
		}
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range jobs {
		j := &jobs[i]
		wg.Go(func() {
			switch j.mode {
			case 0:
				results[i] = h.run(j.r)
			case 1:
				g, p := h.open(j.r)
				s, err := h.dw.Generate(h.ctx, g)
				if err != nil {
					results[i].err = err
					return
				}
				defer s.Close()
				h.dw.Abort(h.abortMsg(j.r.room))
				h.pw.Abort(h.abortMsg(j.r.room))
				results[i].prefErr = h.pw.Prefill(h.ctx, p) // overtaken by the abort
				_, results[i].err = s.Next(h.ctx)
			case 2:
				g, p := h.open(j.r)
				s, err := h.dw.Generate(h.ctx, g)
				if err != nil {
					results[i].err = err
					return
				}
				defer s.Close()
				go h.pw.Prefill(h.ctx, p)
				time.Sleep(j.wait)
				h.dw.Abort(h.abortMsg(j.r.room))
				h.pw.Abort(h.abortMsg(j.r.room))
				for {
					ev, err := s.Next(h.ctx)
					if err != nil {
						results[i].err = err
						return
					}
					results[i].events = append(results[i].events, ev)
				}
			case 3:
				g, p := h.open(j.r)
				s, err := h.dw.Generate(h.ctx, g)
				if err != nil {
					results[i].err = err
					return
				}
				go h.pw.Prefill(h.ctx, p)
				for range j.read {
					ev, err := s.Next(h.ctx)
					if err != nil {
						break
					}
					results[i].events = append(results[i].events, ev)
				}
				s.Close() // the client leaves
			}
		})
	}
	wg.Wait()
	for i, j := range jobs {
		res := results[i]
		want := reference(t, h.m, j.r.prompt, j.r.max, nil)
		switch j.mode {
		case 0:
			if res.err != nil || !slices.Equal(res.ids(), want) {
				t.Errorf("request %d: %v (%v), want %v", i, res.ids(), res.err, want)
			}
		case 1:
			if reqerr.KindOf(res.err) != reqerr.KindAborted || res.prefErr == nil {
				t.Errorf("request %d aborted before its prefill: stream %v, prefill %v", i, res.err, res.prefErr)
			}
		default:
			// Whatever was generated before the abort is a prefix of the
			// answer the request would have had alone.
			if got := res.ids(); !slices.Equal(got, want[:min(len(got), len(want))]) || len(got) > len(want) {
				t.Errorf("request %d (mode %d): %v, want a prefix of %v", i, j.mode, got, want)
			}
			if j.mode == 2 && res.err != nil && reqerr.KindOf(res.err) != reqerr.KindAborted {
				t.Errorf("request %d aborted mid-transfer ended with %v", i, res.err)
			}
		}
	}
	h.waitRest()
	if q := h.dpool.Counts().Quarantined; q != 0 {
		t.Errorf("%d pages quarantined after drained aborts", q)
	}
	st := h.dw.Stats()
	t.Logf("deferred releases: drained %d, timeout %d; machine %+v", st.DeferredDrained, st.DeferredTimeout, st.Machine)
}

// TestPrefillAfterAbortEndsAtOnce: the router's abort reaches the prefill
// worker before the request itself (the abort overtook it). The room is
// tombstoned, so the request can never run: Prefill returns aborted at once
// instead of waiting for a Grant that will never come (it used to wait for
// the whole wait timeout, seen as a rare hang of TestAbortsAtRandomPoints).
func TestPrefillAfterAbortEndsAtOnce(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 64, prefillPages: 64, chunk: 8, maxRunning: 4, window: 100})
	r := &req{tenant: "a", prompt: prompt(rand.New(rand.NewPCG(5, 5)), 9), max: 3}
	_, p := h.open(r)
	h.pw.Abort(h.abortMsg(r.room))
	ctx, cancel := context.WithTimeout(h.ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	err := h.pw.Prefill(ctx, p)
	if reqerr.KindOf(err) != reqerr.KindAborted || time.Since(start) > 2*time.Second {
		t.Fatalf("Prefill after its abort: %v after %v, want aborted at once", err, time.Since(start))
	}
	h.waitRest()
}

// TestPeerLost: a new connection epoch fails the rooms that depended on the
// old connection with peer_lost on both sides and releases their pages;
// the link serves new requests afterwards.
func TestPeerLost(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 100, prefillPages: 64, chunk: 16, maxRunning: 3, window: 100})
	rng := rand.New(rand.NewPCG(4, 4))
	// Decode side: granted rooms whose prefill never comes, and one more
	// waiting for a running slot.
	var streams []TokenStream
	for range 4 {
		g, _ := h.open(&req{tenant: "a", prompt: prompt(rng, 10), max: 5})
		s, err := h.dw.Generate(h.ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		streams = append(streams, s)
	}
	// Prefill side: rooms waiting for a grant that never comes.
	perrs := make(chan error, 2)
	for range 2 {
		_, p := h.open(&req{tenant: "b", prompt: prompt(rng, 10), max: 5})
		go func() { perrs <- h.pw.Prefill(h.ctx, p) }()
	}
	for h.dw.Stats().Machine.Granted < 3 || h.dw.Stats().Queued < 1 || h.pw.Stats().Waiting < 2 {
		time.Sleep(time.Millisecond)
	}
	if cnt := h.dpool.Counts(); cnt.Allocated == 0 {
		t.Fatalf("nothing granted: %+v", cnt)
	}
	h.pair.Reconnect()
	for i, s := range streams {
		if _, err := s.Next(h.ctx); reqerr.KindOf(err) != reqerr.KindPeerLost {
			t.Errorf("decode stream %d: %v, want peer_lost", i, err)
		}
	}
	for range 2 {
		if err := <-perrs; reqerr.KindOf(err) != reqerr.KindPeerLost {
			t.Errorf("prefill: %v, want peer_lost", err)
		}
	}
	h.waitRest()
	r := &req{tenant: "a", prompt: prompt(rng, 20), max: 6}
	if res := h.run(r); res.err != nil || !slices.Equal(res.ids(), reference(t, h.m, r.prompt, r.max, nil)) {
		t.Errorf("after the reconnection: %v %v", res.ids(), res.err)
	}
	h.waitRest()
}

// TestFenceMismatchFailsClosed: a page whose header no longer carries the
// sequence's fence is never read; the request fails with
// kv_integrity_error, and the failure is counted.
func TestFenceMismatchFailsClosed(t *testing.T) {
	t.Run("safe", func(t *testing.T) { testFenceMismatch(t, transfer.Protections{}) })
	// --unsafe-no-fence-check: the engine reads the page without looking;
	// here the data is intact, so the request completes, unnoticed.
	t.Run("NoFenceCheck", func(t *testing.T) { testFenceMismatch(t, transfer.Protections{NoFenceCheck: true}) })
}

func testFenceMismatch(t *testing.T, prot transfer.Protections) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 64, prefillPages: 64, chunk: 16, maxRunning: 4, window: 100, protections: prot})
	rng := rand.New(rand.NewPCG(8, 8))
	r := &req{tenant: "a", prompt: prompt(rng, 13), max: 8}
	g, p := h.open(r)
	h.dw.hold.Store(100)
	s, err := h.dw.Generate(h.ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := h.pw.Prefill(h.ctx, p); err != nil {
		t.Fatal(err)
	}
	for h.dw.Stats().Active == 0 {
		time.Sleep(time.Millisecond)
	}
	// Overwrite the header of the room's second prompt page, as a stray
	// write would.
	before := h.dpool.Stats().FenceMismatches
	hit := false
	for pg := range int32(h.dpool.Total()) {
		hd, err := h.dpool.Header(pg)
		if err == nil && h.dpool.State(pg) == kvpool.Allocated && hd.Fence.Room == r.room && hd.Ordinal == 1 {
			clear(h.dpool.PageBytes(pg)[:kvpool.HeaderSize])
			hit = true
		}
	}
	if !hit {
		t.Fatal("no prompt page found")
	}
	h.dw.hold.Store(0)
	h.dw.in.put(op{kind: opAbort})
	ev, err := s.Next(h.ctx)
	if err != nil || ev.ID != reference(t, h.m, r.prompt, 1, nil)[0] {
		t.Fatalf("first token: %+v %v", ev, err)
	}
	if prot.NoFenceCheck {
		n := 1
		for {
			if _, err := s.Next(h.ctx); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				break
			}
			n++
		}
		if st := h.dw.Stats(); n != r.max || st.FenceFailures != 0 || st.Pool.FenceMismatches != before {
			t.Errorf("unsafe: %d tokens, fence failures %d, mismatches %d", n, st.FenceFailures, st.Pool.FenceMismatches)
		}
		h.waitRest()
		return
	}
	if _, err := s.Next(h.ctx); reqerr.KindOf(err) != reqerr.KindIntegrity {
		t.Fatalf("after the corruption: %v, want kv_integrity_error", err)
	}
	if st := h.dw.Stats(); st.FenceFailures != 1 || st.Pool.FenceMismatches <= before || st.Steps != 0 {
		t.Errorf("fence failures %d, pool mismatches %d (before %d), steps %d", st.FenceFailures, st.Pool.FenceMismatches, before, st.Steps)
	}
	h.waitRest()
}

// TestCloseDrains: Close lets admitted requests finish, fails queued ones
// with shutting_down, refuses new ones, and leaves the pool at rest.
func TestCloseDrains(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 64, prefillPages: 64, chunk: 16, maxRunning: 1, window: 100})
	rng := rand.New(rand.NewPCG(6, 6))
	h.dw.hold.Store(100)
	running := &req{tenant: "a", prompt: prompt(rng, 9), max: 6}
	done := make(chan result, 1)
	go func() { done <- h.run(running) }()
	for h.dw.Stats().Active == 0 {
		time.Sleep(time.Millisecond)
	}
	g, _ := h.open(&req{tenant: "b", prompt: prompt(rng, 9), max: 6})
	queued, err := h.dw.Generate(h.ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()
	for h.dw.Stats().Queued == 0 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- h.dw.Close(h.ctx) }()
	if _, err := queued.Next(h.ctx); reqerr.KindOf(err) != reqerr.KindShuttingDown {
		t.Errorf("queued request: %v, want shutting_down", err)
	}
	g2, _ := h.open(&req{tenant: "c", prompt: prompt(rng, 9), max: 6})
	if _, err := h.dw.Generate(h.ctx, g2); reqerr.KindOf(err) != reqerr.KindShuttingDown {
		t.Errorf("new request while closing: %v", err)
	}
	h.dw.hold.Store(0)
	h.dw.in.put(op{kind: opAbort})
	res := <-done
	if res.err != nil || !slices.Equal(res.ids(), reference(t, h.m, running.prompt, running.max, nil)) {
		t.Errorf("running request: %v %v", res.ids(), res.err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if cnt := h.dpool.Counts(); cnt.Free != cnt.Total {
		t.Errorf("pool after Close: %+v", cnt)
	}
	if !errors.Is(h.dw.Close(h.ctx), nil) {
		t.Error("second Close")
	}
}

// TestWaitsForPrefillConnection: a request for a prefill worker that has
// not connected yet waits (nothing granted: the Grant would be lost and the
// first epoch would fail the room), and runs once the link is up.
func TestWaitsForPrefillConnection(t *testing.T) {
	h := newPD(t, pdOptions{pageSize: 4, decodePages: 64, prefillPages: 64, chunk: 16, maxRunning: 4, window: 100, noLink: true})
	r := &req{tenant: "a", prompt: prompt(rand.New(rand.NewPCG(2, 2)), 11), max: 5}
	g, _ := h.open(r)
	s, err := h.dw.Generate(h.ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for h.dw.Stats().Queued != 0 {
		time.Sleep(time.Millisecond)
	}
	r.room = [16]byte{}
	g, p := h.open(r)
	s, err = h.dw.Generate(h.ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for h.dw.Stats().Queued != 1 {
		time.Sleep(time.Millisecond)
	}
	if st := h.dw.Stats(); st.Machine.Granted != 0 || st.Pool.Allocated != 0 {
		t.Fatalf("granted %d, allocated %d before the prefill worker connected", st.Machine.Granted, st.Pool.Allocated)
	}
	h.connect()
	go h.pw.Prefill(h.ctx, p)
	var got []int32
	for {
		ev, err := s.Next(h.ctx)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		got = append(got, ev.ID)
	}
	if want := reference(t, h.m, r.prompt, r.max, nil); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	h.waitRest()
}
