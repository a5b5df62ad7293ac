package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/sampling"
	"github.com/kvfence/kvfence/internal/tokenizer"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/inproc"
)

const (
	prefillID transfer.PeerID = 1
	decodeID  transfer.PeerID = 2
)

var secret = []byte("kvfence engine test secret, 32 bytes")

var (
	modelOnce sync.Once
	modelPath string
	modelErr  error
)

// tinyModel loads a 2-layer qwen3 model with random weights, built once
// per test binary.
func tinyModel(t testing.TB) *model.Model {
	t.Helper()
	modelOnce.Do(func() {
		modelPath = filepath.Join(testDir, "tiny.gguf")
		modelErr = modelbuild.Write(modelbuild.Options{
			Arch: "qwen3", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 96, Ctx: 512,
			Type: gguf.TypeF32, Seed: 11, Tokenizer: tokenizer.Tiny(), Name: "tiny-qwen3",
		}, modelPath)
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	m, err := model.Load(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

type pd struct {
	t      testing.TB
	m      *model.Model
	auth   *transfer.Auth
	dpool  *kvpool.Pool
	ppool  *kvpool.Pool
	dw     *DecodeWorker
	pw     *PrefillWorker
	pair   *inproc.Pair
	ctx    context.Context
	cancel context.CancelFunc
}

type pdOptions struct {
	pageSize     int
	decodePages  int
	prefillPages int
	chunk        int
	maxRunning   int
	streamBuffer int
	window       int
	drainTimeout int64
	noLink       bool // connect later with h.connect
	protections  transfer.Protections
}

func newPD(t testing.TB, o pdOptions) *pd {
	t.Helper()
	m := tinyModel(t)
	auth, err := transfer.NewAuth(secret)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(pages int) *kvpool.Pool {
		p, err := kvpool.New(kvpool.Config{Shape: PoolShape(m, o.pageSize), Pages: pages})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	h := &pd{t: t, m: m, auth: auth, dpool: mk(o.decodePages), ppool: mk(o.prefillPages)}
	h.dw, err = NewDecodeWorker(DecodeConfig{Model: m, Pool: h.dpool, Auth: auth, Self: decodeID,
		ContextWindow: o.window, LowerWindow: true, MaxRunning: o.maxRunning, StreamBuffer: o.streamBuffer,
		Threads: 1, TickInterval: time.Millisecond, DrainTimeout: o.drainTimeout, KeyBase: 1 << 40,
		TransferTimeout: 60000, Protections: o.protections})
	if err != nil {
		t.Fatal(err)
	}
	h.pw, err = NewPrefillWorker(PrefillConfig{Model: m, Pool: h.ppool, Auth: auth, Self: prefillID,
		ContextWindow: o.window, LowerWindow: true, ChunkSize: o.chunk, Threads: 1, TickInterval: time.Millisecond,
		WaitTimeout: 60000, Protections: o.protections})
	if err != nil {
		t.Fatal(err)
	}
	if !o.noLink {
		h.connect()
	}
	h.ctx, h.cancel = context.WithTimeout(context.Background(), 50*time.Second)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h.dw.Close(ctx)
		h.pw.Close(ctx)
		if h.pair != nil {
			h.pair.Prefill().Close()
		}
		h.cancel()
	})
	return h
}

// connect joins the two workers with an inproc link.
func (h *pd) connect() {
	h.pair = inproc.New(inproc.Config{Auth: h.auth, QueueLen: 8},
		inproc.Side{ID: prefillID, Sink: h.pw}, inproc.Side{ID: decodeID, Sink: h.dw}, h.dw.Receiver())
	h.pw.AddLink(h.pair.Prefill())
	h.dw.AddLink(h.pair.Decode())
}

// req is one request as the router would make it.
type req struct {
	tenant   string
	prompt   []int32
	max      int
	sampling Sampling
	logprobs bool
	top      int
	room     transfer.RoomID
}

func (h *pd) open(r *req) (*GenerateRequest, *PrefillRequest) {
	if r.room == (transfer.RoomID{}) {
		rand.Read(r.room[:])
	}
	o := &transfer.Open{Envelope: transfer.Envelope{Room: r.room}, Prefill: prefillID, PromptTokens: uint32(len(r.prompt)), MaxTokens: uint32(r.max)}
	h.auth.Sign(o)
	p := &transfer.Prefill{Envelope: transfer.Envelope{Room: r.room}, Decode: decodeID, PromptTokens: uint32(len(r.prompt)), MaxTokens: uint32(r.max)}
	h.auth.Sign(p)
	return &GenerateRequest{Open: o, Tenant: r.tenant, Prompt: r.prompt, MaxTokens: r.max, Sampling: r.sampling, Logprobs: r.logprobs, TopLogprobs: r.top},
		&PrefillRequest{Prefill: p, Tenant: r.tenant, Prompt: r.prompt, Sampling: r.sampling}
}

func (h *pd) abortMsg(room transfer.RoomID) *transfer.Abort {
	a := &transfer.Abort{Envelope: transfer.Envelope{Room: room}, Reason: 7, Decode: decodeID}
	h.auth.Sign(a)
	return a
}

// result is what a client saw.
type result struct {
	events  []TokenEvent
	err     error // the stream's error (nil after io.EOF)
	prefErr error
}

func (r result) ids() []int32 {
	var ids []int32
	for _, e := range r.events {
		ids = append(ids, e.ID)
	}
	return ids
}

// run sends r through decode and prefill and reads the stream to its end.
func (h *pd) run(r *req) result { return h.runStops(r, nil) }

func (h *pd) runStops(r *req, stops []int32) result {
	g, p := h.open(r)
	g.StopIDs = stops
	s, err := h.dw.Generate(h.ctx, g)
	if err != nil {
		return result{err: err}
	}
	defer s.Close()
	perr := make(chan error, 1)
	go func() { perr <- h.pw.Prefill(h.ctx, p) }()
	var res result
	for {
		ev, err := s.Next(h.ctx)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.err = err
			}
			break
		}
		res.events = append(res.events, ev)
	}
	res.prefErr = <-perr
	return res
}

// waitRest waits until both pools are at rest (I5): nothing allocated or
// deferred.
func (h *pd) waitRest() {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, p := h.dpool.Counts(), h.ppool.Counts()
		if d.Allocated == 0 && d.Deferred == 0 && p.Allocated == 0 && p.Deferred == 0 {
			if d.Free+d.Quarantined != d.Total {
				h.t.Fatalf("decode pool accounting: %+v", d)
			}
			return
		}
		if time.Now().After(deadline) {
			for room, q := range h.pw.d.rooms {
				st, ok := h.pw.d.m.State(room)
				h.t.Logf("prefill room %v: state %v %v running %v computed %d/%d answered %v", room, st, ok, q.running, q.computed, len(q.req.Prompt), q.answered)
			}
			h.t.Logf("prefill machine rooms %d inflight %d", h.pw.d.m.Rooms(), h.pw.d.m.InFlight())
			h.t.Fatalf("pools not at rest: decode %+v prefill %+v", d, p)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// reference generates for prompt alone, with a plain store, one forward
// call per token and one sampler: what I7 compares against.
func reference(t testing.TB, m *model.Model, prompt []int32, max int, stops []int32) []int32 {
	t.Helper()
	var ids []int32
	for _, e := range referenceEvents(t, m, prompt, max, stops, Sampling{}, false, 0) {
		ids = append(ids, e.ID)
	}
	return ids
}

func referenceEvents(t testing.TB, m *model.Model, prompt []int32, max int, stops []int32, s Sampling, logprobs bool, top int) []TokenEvent {
	t.Helper()
	const ps = 16
	pages := (len(prompt)+max)/ps + 1
	store := model.NewSliceStore(m.Config, ps, pages)
	table := make([]int32, pages)
	for i := range table {
		table[i] = int32(i)
	}
	ws := m.NewWorkspace(len(prompt), 1, 1)
	defer ws.Close()
	smp, err := sampling.New(samplingParams(s, logprobs, top), m.Config.Vocab)
	if err != nil {
		t.Fatal(err)
	}
	var out []TokenEvent
	toks, pos := prompt, 0
	for {
		if err := m.Forward(ws, store, []model.Seq{{Tokens: toks, Pos: pos, Pages: table, Logits: model.LogitsLast}}); err != nil {
			t.Fatal(err)
		}
		c, err := smp.Sample(ws.Logits(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		ev := TokenEvent{ID: c.Token, Logprob: c.LogProb}
		for _, tl := range c.Top {
			ev.Top = append(ev.Top, TopLogprob{ID: tl.Token, Logprob: tl.LogProb})
		}
		out = append(out, ev)
		switch {
		case m.Tok.IsEOG(c.Token) || containsID(stops, c.Token):
			out[len(out)-1].Finish = FinishStop
			return out
		case len(out) == max:
			out[len(out)-1].Finish = FinishLength
			return out
		}
		pos += len(toks)
		toks = []int32{c.Token}
	}
}

func containsID(s []int32, id int32) bool {
	for _, v := range s {
		if v == id {
			return true
		}
	}
	return false
}
