package router

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router/api"
)

// collect reads s to its end and closes it.
func collect(t testing.TB, s api.Stream) (ids []int32, text string, res api.Result, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	defer s.Close()
	for {
		tok, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			return ids, text, s.Result(), nil
		}
		if err != nil {
			return ids, text, s.Result(), err
		}
		ids = append(ids, tok.ID)
		text += tok.Text
	}
}

var prompts = []string{
	"the cat sat on the mat",
	"in the beginning",
	"hello",
	"a much longer prompt that spans more than one page of sixteen tokens, to test page boundaries in the transfer",
}

// TestOutputsEqualDirectGeneration: greedy outputs through router, prefill,
// transfer and decode equal the model run directly (I7), for completions
// and chat, one at a time and all at once.
func TestOutputsEqualDirectGeneration(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	const maxTokens = 12
	type job struct {
		req  *api.Request
		want []int32
	}
	var jobs []job
	for i, p := range prompts {
		r := &api.Request{ID: "r", Tenant: "t", Prompt: p, MaxTokens: maxTokens}
		if i%2 == 1 {
			r = &api.Request{ID: "r", Tenant: "t", Chat: true, Messages: []api.Message{{Role: "user", Content: p}}, MaxTokens: maxTokens}
		}
		prompt, err := Tokenize(c.m.Tok, r)
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, job{r, greedy(t, c.m, prompt, maxTokens)})
	}
	check := func(j job) error {
		s, err := c.r.Generate(context.Background(), j.req)
		if err != nil {
			return err
		}
		ids, text, res, err := collect(t, s)
		if err != nil {
			return err
		}
		if !equal(ids, j.want) {
			return errors.New("served tokens differ from the direct generation")
		}
		want := text
		if c.m.Tok.IsEOG(j.want[len(j.want)-1]) {
			want = c.m.Tok.Decode(j.want[:len(j.want)-1])
			if res.FinishReason != api.FinishStop {
				return errors.New("finish reason is not stop after an end-of-generation token")
			}
		} else {
			want = c.m.Tok.Decode(j.want)
			if res.FinishReason != api.FinishLength {
				return errors.New("finish reason is not length")
			}
		}
		if text != want {
			return errors.New("served text differs from the decoded direct generation")
		}
		if res.CompletionTokens != len(j.want) {
			return errors.New("completion token count differs")
		}
		return nil
	}
	for i, j := range jobs {
		if err := check(j); err != nil {
			t.Fatalf("prompt %d alone: %v", i, err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 4*len(jobs))
	for i := range errs {
		wg.Go(func() { errs[i] = check(jobs[i%len(jobs)]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("prompt %d concurrently: %v", i%len(jobs), err)
		}
	}
	c.waitIdle()
}

// TestContextLengthRejected: a request that cannot fit gets the original
// error before anything reaches a worker, and no page is held.
func TestContextLengthRejected(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	long := ""
	for range 300 {
		long += "x "
	}
	for _, r := range []*api.Request{
		{ID: "a", Tenant: "t", Prompt: long, MaxTokens: 1},
		{ID: "b", Tenant: "t", Prompt: "the cat", MaxTokens: testCtx},
		{ID: "c", Tenant: "t", Prompt: long, MaxTokens: 16, MaxTokensAuto: true},
	} {
		_, err := c.r.Generate(context.Background(), r)
		var cl *reqerr.ContextLengthError
		if !errors.As(err, &cl) || cl.Limit != testCtx || cl.MaxTokens != r.MaxTokens {
			t.Fatalf("request %s: %v, want a context length error with limit %d", r.ID, err, testCtx)
		}
	}
	dec, pre := c.pools()
	if dec[0].Allocated+dec[0].Deferred+dec[0].Quarantined != 0 || pre[0].Allocated != 0 {
		t.Fatalf("pages held after rejections: decode %+v prefill %+v", dec, pre)
	}
	// MaxTokensAuto lowers max_tokens to what fits instead of rejecting.
	prompt, _ := Tokenize(c.m.Tok, &api.Request{Prompt: "the cat"})
	s, err := c.r.Generate(context.Background(), &api.Request{ID: "d", Tenant: "t", Prompt: "the cat", MaxTokens: 4096, MaxTokensAuto: true})
	if err != nil {
		t.Fatal(err)
	}
	ids, _, res, err := collect(t, s)
	if err != nil {
		t.Fatal(err)
	}
	want := greedy(t, c.m, prompt, testCtx-len(prompt))
	if !equal(ids, want) || res.PromptTokens != len(prompt) {
		t.Fatalf("auto max tokens: %d tokens (finish %s), want %d", len(ids), res.FinishReason, len(want))
	}
	c.waitIdle()
}

// waitStats polls until cond holds on the first decode worker's stats.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestAbortPolicy: with first-token, a client gone before the first token
// lets the transfer complete and the request reach its first token, then
// aborts it; a client gone after the first token aborts at once. With
// immediate, the abort is immediate. Pages are freed in every case.
func TestAbortPolicy(t *testing.T) {
	const maxTokens = 150
	req := func() *api.Request {
		return &api.Request{ID: "x", Tenant: "t", Prompt: prompts[3], MaxTokens: maxTokens}
	}
	t.Run("first-token, gone before the first token", func(t *testing.T) {
		c := newCluster(t, clusterOpts{policy: AbortFirstToken})
		s, err := c.r.Generate(context.Background(), req())
		if err != nil {
			t.Fatal(err)
		}
		s.Close() // the client leaves at once
		c.waitIdle()
		st := c.dec[0].Stats()
		m := st.Machine
		// The transfer completed and decoding started: nothing was cut
		// mid-transfer (no deferred or immediate release of prompt pages).
		if m.Started != 1 || m.DrainedReleases != 0 || m.TimeoutQuarantines != 0 || m.ImmediateReleases != 0 {
			t.Fatalf("decode machine %+v: want one verified transfer and no abort of it", m)
		}
		if st.GeneratedTokens < 1 || st.GeneratedTokens >= maxTokens {
			t.Fatalf("generated %d tokens: want the first token, then an abort well before %d", st.GeneratedTokens, maxTokens)
		}
	})
	t.Run("first-token, gone after the first token", func(t *testing.T) {
		c := newCluster(t, clusterOpts{policy: AbortFirstToken})
		s, err := c.r.Generate(context.Background(), req())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := s.Next(ctx); err != nil {
			t.Fatal(err)
		}
		s.Close()
		c.waitIdle()
		st := c.dec[0].Stats()
		if st.GeneratedTokens >= maxTokens {
			t.Fatalf("generated %d tokens: want an abort well before %d", st.GeneratedTokens, maxTokens)
		}
	})
	t.Run("immediate", func(t *testing.T) {
		c := newCluster(t, clusterOpts{policy: AbortImmediate})
		s, err := c.r.Generate(context.Background(), req())
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		c.waitIdle()
		st := c.dec[0].Stats()
		if st.GeneratedTokens >= maxTokens {
			t.Fatalf("generated %d tokens: want an abort well before %d", st.GeneratedTokens, maxTokens)
		}
	})
	t.Run("client context ends while waiting", func(t *testing.T) {
		// Next returns the context's error and the generation goes on; the
		// policy applies at Close.
		c := newCluster(t, clusterOpts{policy: AbortFirstToken})
		s, err := c.r.Generate(context.Background(), req())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Next(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Next on a cancelled context: %v", err)
		}
		s.Close()
		c.waitIdle()
		if m := c.dec[0].Stats().Machine; m.Started != 1 {
			t.Fatalf("decode machine %+v: want the transfer completed", m)
		}
	})
}

// TestPairingSpreadsLoad: requests in flight spread evenly over two
// prefill and two decode workers, and every pair produces the same output.
func TestPairingSpreadsLoad(t *testing.T) {
	c := newCluster(t, clusterOpts{decoders: 2, prefillers: 2})
	var streams []api.Stream
	for range 4 {
		s, err := c.r.Generate(context.Background(), &api.Request{ID: "p", Tenant: "t", Prompt: "the cat", MaxTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	for i := range c.r.decSlot {
		if n := c.r.decSlot[i].inFlight.Load(); n != 2 {
			t.Errorf("decode worker %d has %d requests, want 2", i, n)
		}
	}
	var first []int32
	for i, s := range streams {
		ids, _, _, err := collect(t, s)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = ids
		} else if !equal(ids, first) {
			t.Fatalf("stream %d differs from stream 0", i)
		}
	}
	for i, d := range c.dec {
		if g := d.Stats().Machine.Started; g != 2 {
			t.Errorf("decode worker %d served %d transfers, want 2", i, g)
		}
	}
	for i, p := range c.pre {
		if g := p.Stats().PromptTokens; g == 0 {
			t.Errorf("prefill worker %d computed nothing", i)
		}
	}
	c.waitIdle()
}

// TestNoWorkers: every worker draining gives 503 no_workers; Shutdown
// gives shutting_down.
func TestNoWorkersAndShutdown(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	if err := c.r.Ready(); err != nil {
		t.Fatalf("ready: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.r.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := c.r.Generate(context.Background(), &api.Request{ID: "s", Tenant: "t", Prompt: "hi", MaxTokens: 2})
	if reqerr.KindOf(err) != reqerr.KindShuttingDown || reqerr.KindOf(c.r.Ready()) != reqerr.KindShuttingDown {
		t.Fatalf("after shutdown: %v", err)
	}

	c2 := newCluster(t, clusterOpts{})
	if err := c2.dec[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c2.r.Generate(context.Background(), &api.Request{ID: "n", Tenant: "t", Prompt: "hi", MaxTokens: 2})
	if reqerr.KindOf(err) != reqerr.KindNoWorkers {
		t.Fatalf("all decoders draining: %v", err)
	}
}

// TestPrefillFailureAbortsDecode: a prefill that fails before its machine
// sees the room (here: no link to the decode worker) aborts the decode side
// at once, and the client gets the prefill's error, not a generic abort or
// the decode side's transfer timeout (30 s, beyond this test's bound).
func TestPrefillFailureAbortsDecode(t *testing.T) {
	c := newCluster(t, clusterOpts{noLinks: true})
	s, err := c.r.Generate(context.Background(), &api.Request{ID: "l", Tenant: "t", Prompt: "the cat", MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = s.Next(ctx)
	s.Close()
	if reqerr.KindOf(err) != reqerr.KindPeerLost {
		t.Fatalf("Next: %v, want the prefill's peer_lost", err)
	}
	c.waitFor("the router to let go", func() bool { d, p := c.r.InFlight(); return d == 0 && p == 0 })
}

// TestLogprobsAndSeeds: logprobs and top logprobs pass through with their
// bytes; the greedy token is the most likely alternative; a sampled request
// with a seed repeats exactly.
func TestLogprobsAndSeeds(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.r.Generate(ctx, &api.Request{ID: "lp", Tenant: "t", Prompt: prompts[0], MaxTokens: 6, Logprobs: true, TopLogprobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		tok, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if len(tok.Top) != 3 || tok.Top[0].ID != tok.ID || tok.Top[0].Logprob != tok.Logprob ||
			tok.Logprob > 0 || tok.Top[1].Logprob > tok.Top[0].Logprob || tok.Bytes != c.m.Tok.Piece(tok.ID) ||
			tok.Top[2].Bytes != c.m.Tok.Piece(tok.Top[2].ID) {
			t.Fatalf("token %d: %+v", n, tok)
		}
	}
	s.Close()
	if n != 6 {
		t.Fatalf("%d tokens, want 6", n)
	}

	seed := int64(42)
	sampled := func() []int32 {
		s, err := c.r.Generate(ctx, &api.Request{ID: "s", Tenant: "t", Prompt: prompts[1], MaxTokens: 12, Temperature: 1, TopP: 1, Seed: &seed})
		if err != nil {
			t.Fatal(err)
		}
		ids, _, _, err := collect(t, s)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	a, b := sampled(), sampled()
	prompt, _ := Tokenize(c.m.Tok, &api.Request{Prompt: prompts[1]})
	if !equal(a, b) || equal(a, greedy(t, c.m, prompt, 12)) {
		t.Fatalf("seeded samples %v and %v: want equal to each other and different from greedy", a, b)
	}
	c.waitIdle()
}

// BenchmarkGenerate measures one short request end to end through the
// router, both workers and the inproc transport on the tiny model.
func BenchmarkGenerate(b *testing.B) {
	c := newCluster(b, clusterOpts{})
	req := &api.Request{ID: "b", Tenant: "t", Prompt: prompts[0], MaxTokens: 8}
	b.ReportAllocs()
	for b.Loop() {
		s, err := c.r.Generate(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, _, err := collect(b, s); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPairingSkipsDrainingWorkers: a decode worker that is shutting down
// gets no new request; its peer takes them all.
func TestPairingSkipsDrainingWorkers(t *testing.T) {
	c := newCluster(t, clusterOpts{decoders: 2, prefillers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.dec[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s, err := c.r.Generate(ctx, &api.Request{ID: "d", Tenant: "t", Prompt: "the cat", MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := collect(t, s); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := c.dec[0].Stats().Machine.Started, c.dec[1].Stats().Machine.Started; a != 0 || b != 3 {
		t.Fatalf("transfers: draining worker %d, live worker %d; want 0 and 3", a, b)
	}
	c.waitIdle()
}
