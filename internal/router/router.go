package router

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router/api"
	"github.com/kvfence/kvfence/internal/tokenizer"
	"github.com/kvfence/kvfence/internal/transfer"
)

// Config configures a Router.
type Config struct {
	// Tokenizer is the served model's tokenizer (required): the router
	// tokenizes, so that it can admit by token count before anything
	// reaches a worker.
	Tokenizer *tokenizer.Tokenizer
	// Auth signs the Open, Prefill and Abort messages under the cluster
	// secret (required).
	Auth *transfer.Auth
	// Decoders and Prefillers are the workers (at least one of each). The
	// slices are the Router's after New.
	Decoders   []engine.Decoder
	Prefillers []engine.Prefiller
	// ModelName is the name clients send as "model"; "" takes the first
	// decode worker's model name.
	ModelName string
	// Created is shown by /v1/models (unix seconds); 0 means New's time.
	Created int64
	// AbortPolicy: what a client that goes away does to its request.
	AbortPolicy AbortPolicy
	// Log receives one line per failed pairing or prefill; nil discards.
	Log *slog.Logger
}

// Router implements api.Backend over in-process or remote workers. It is
// safe for concurrent use.
type Router struct {
	cfg     Config
	tok     *tokenizer.Tokenizer
	decSlot []slot
	preSlot []slot
	next    atomic.Uint64 // rotates the start of the pairing scan (ties go round-robin)

	// base is the parent of every generation's context; hardStop cancels
	// it when Shutdown gives up waiting.
	base     context.Context
	hardStop context.CancelFunc

	// wg counts live streams and the goroutines they own (prefill calls,
	// first-token waits). Shutdown waits for it.
	wg sync.WaitGroup

	mu struct {
		sync.Mutex
		closing bool // Shutdown began: Generate refuses new requests
	}
}

// New returns a Router. It starts no goroutine.
func New(cfg Config) (*Router, error) {
	switch {
	case cfg.Tokenizer == nil:
		return nil, errors.New("router: no tokenizer")
	case cfg.Auth == nil:
		return nil, errors.New("router: no cluster secret (transfer.Auth)")
	case len(cfg.Decoders) == 0 || len(cfg.Prefillers) == 0:
		return nil, fmt.Errorf("router: need at least one prefill and one decode worker (have %d and %d)", len(cfg.Prefillers), len(cfg.Decoders))
	}
	if cfg.AbortPolicy != AbortFirstToken && cfg.AbortPolicy != AbortImmediate {
		return nil, fmt.Errorf("router: unknown abort policy %v", cfg.AbortPolicy)
	}
	if cfg.ModelName == "" {
		cfg.ModelName = cfg.Decoders[0].Info().Model
	}
	if cfg.Created == 0 {
		cfg.Created = time.Now().Unix()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	r := &Router{
		cfg:     cfg,
		tok:     cfg.Tokenizer,
		decSlot: make([]slot, len(cfg.Decoders)),
		preSlot: make([]slot, len(cfg.Prefillers)),
	}
	r.base, r.hardStop = context.WithCancel(context.Background())
	return r, nil
}

// Models lists the one served model. Its context length is the smallest
// window of any worker that takes work, so that the HTTP layer's bound on
// max_tokens holds whichever pair serves the request.
func (r *Router) Models() []api.ModelInfo {
	return []api.ModelInfo{{
		ID:            r.cfg.ModelName,
		Created:       r.cfg.Created,
		OwnedBy:       "kvfence",
		ContextLength: r.contextLength(),
	}}
}

func (r *Router) contextLength() int {
	limit := 0
	take := func(in engine.WorkerInfo) {
		if !in.Draining && in.ContextWindow > 0 && (limit == 0 || in.ContextWindow < limit) {
			limit = in.ContextWindow
		}
	}
	for _, d := range r.cfg.Decoders {
		take(d.Info())
	}
	for _, p := range r.cfg.Prefillers {
		take(p.Info())
	}
	return limit
}

// Ready reports whether a pair can take work (for /readyz).
func (r *Router) Ready() error {
	r.mu.Lock()
	closing := r.mu.closing
	r.mu.Unlock()
	if closing {
		return reqerr.New(reqerr.KindShuttingDown, "the router is shutting down")
	}
	if _, _, _, _, err := r.pick(); err != nil {
		return err
	}
	return nil
}

// pick chooses the least loaded usable decode worker and the least loaded
// usable prefill worker. Load is the larger of the requests this router has
// in flight on the worker and what the worker reports (running + queued):
// the first moves at once, the second also counts other routers' requests.
func (r *Router) pick() (di, pi int, dinfo, pinfo engine.WorkerInfo, err error) {
	start := int(r.next.Add(1))
	dinfos := make([]engine.WorkerInfo, len(r.cfg.Decoders))
	for i, d := range r.cfg.Decoders {
		dinfos[i] = d.Info()
	}
	pinfos := make([]engine.WorkerInfo, len(r.cfg.Prefillers))
	for i, p := range r.cfg.Prefillers {
		pinfos[i] = p.Info()
	}
	load := func(s []slot, infos []engine.WorkerInfo) func(int) int64 {
		return func(i int) int64 {
			return max(s[i].inFlight.Load(), int64(infos[i].Running+infos[i].Queued))
		}
	}
	di = pickLeast(len(dinfos), start, func(i int) bool { return usable(dinfos[i]) }, load(r.decSlot, dinfos))
	pi = pickLeast(len(pinfos), start, func(i int) bool { return usable(pinfos[i]) }, load(r.preSlot, pinfos))
	if di < 0 || pi < 0 {
		return 0, 0, dinfo, pinfo, reqerr.New(reqerr.KindNoWorkers, "no prefill/decode pair is available (%d prefill, %d decode workers configured)", len(pinfos), len(dinfos))
	}
	return di, pi, dinfos[di], pinfos[pi], nil
}

func usable(in engine.WorkerInfo) bool {
	return !in.Draining && in.ContextWindow > 0
}

// Generate tokenizes r, admits it against the chosen pair's context window,
// and starts it on both workers. The HTTP request's ctx is not passed to any
// worker (see the package doc).
func (r *Router) Generate(ctx context.Context, req *api.Request) (api.Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prompt, err := Tokenize(r.tok, req)
	if err != nil {
		return nil, err
	}
	di, pi, dinfo, pinfo, err := r.pick()
	if err != nil {
		return nil, err
	}
	limit := min(dinfo.ContextWindow, pinfo.ContextWindow)
	maxTokens, err := Admit(len(prompt), req.MaxTokens, req.MaxTokensAuto, limit)
	if err != nil {
		return nil, err
	}

	// Registering in wg and checking closing under one lock means Shutdown,
	// once it has set closing, waits for every stream that got past here.
	r.mu.Lock()
	if r.mu.closing {
		r.mu.Unlock()
		return nil, reqerr.New(reqerr.KindShuttingDown, "the router is shutting down")
	}
	r.wg.Add(1)
	r.mu.Unlock()

	s := &stream{
		r:       r,
		dec:     r.cfg.Decoders[di],
		pre:     r.cfg.Prefillers[pi],
		decSlot: &r.decSlot[di],
		preSlot: &r.preSlot[pi],
		decPeer: dinfo.Peer,
		prompt:  len(prompt),
		td:      r.tok.NewStreamDecoder(),
		logp:    req.Logprobs,
	}
	s.decSlot.inFlight.Add(1)
	s.preSlot.inFlight.Add(1)
	if _, err := rand.Read(s.room[:]); err != nil {
		s.release()
		return nil, fmt.Errorf("router: minting a room: %w", err)
	}
	samp := engine.Sampling{Temperature: req.Temperature, TopP: req.TopP}
	if req.Seed != nil {
		samp.Seed = uint64(*req.Seed)
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
		samp.Seed = binary.LittleEndian.Uint64(b[:])
	}
	open := &transfer.Open{
		Envelope:     transfer.Envelope{Room: s.room},
		Prefill:      pinfo.Peer,
		PromptTokens: uint32(len(prompt)),
		MaxTokens:    uint32(maxTokens),
	}
	r.cfg.Auth.Sign(open)
	pmsg := &transfer.Prefill{
		Envelope:     transfer.Envelope{Room: s.room},
		Decode:       dinfo.Peer,
		PromptTokens: uint32(len(prompt)),
		MaxTokens:    uint32(maxTokens),
	}
	r.cfg.Auth.Sign(pmsg)

	s.ctx, s.cancel = context.WithCancel(r.base)
	ts, err := s.dec.Generate(s.ctx, &engine.GenerateRequest{
		Open:        open,
		Tenant:      req.Tenant,
		Prompt:      prompt,
		MaxTokens:   maxTokens,
		Sampling:    samp,
		StopIDs:     nil, // the model's end-of-generation tokens stop it already
		Logprobs:    req.Logprobs,
		TopLogprobs: req.TopLogprobs,
	})
	if err != nil {
		s.release()
		return nil, err
	}
	s.ts = ts

	// The prefill call blocks until the transfer is done; it runs beside
	// the stream under the stream's context.
	preq := &engine.PrefillRequest{
		Prefill:    pmsg,
		Tenant:     req.Tenant,
		Prompt:     prompt,
		Sampling:   samp,
		DecodeAddr: dinfo.TransferAddr,
	}
	s.preDone = make(chan struct{})
	r.wg.Add(1)
	go s.runPrefill(preq, req.ID)
	return s, nil
}

// abort tells both workers to end room (signed under the cluster secret).
func (r *Router) abortRoom(dec engine.Decoder, pre engine.Prefiller, room transfer.RoomID, decPeer transfer.PeerID) {
	m := &transfer.Abort{Envelope: transfer.Envelope{Room: room}, Reason: reqerr.KindAborted, Decode: decPeer}
	r.cfg.Auth.Sign(m)
	dec.Abort(m)
	pre.Abort(m)
}

// StopAccepting makes Generate refuse new requests (KindShuttingDown) and
// Ready report so, for the first phase of a graceful shutdown.
func (r *Router) StopAccepting() {
	r.mu.Lock()
	r.mu.closing = true
	r.mu.Unlock()
}

// Shutdown refuses new requests, then waits until every stream has ended
// and its goroutines have exited, or ctx ends. When ctx ends first it aborts
// every generation still running (their workers see an Abort, their streams
// an aborted error), waits for the goroutines to exit, and returns ctx's
// error. Callers stop the HTTP server first, so that no handler is still
// reading a stream when the generations are aborted.
func (r *Router) Shutdown(ctx context.Context) error {
	r.StopAccepting()
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		r.hardStop()
		return nil
	case <-ctx.Done():
	}
	r.hardStop()
	<-done
	return ctx.Err()
}

// InFlight returns the requests this router has in flight on decode workers
// (streams not yet released) and on prefill workers (prefill calls not yet
// returned). Tests and operators use it to see that everything let go.
func (r *Router) InFlight() (decode, prefill int64) {
	for i := range r.decSlot {
		decode += r.decSlot[i].inFlight.Load()
	}
	for i := range r.preSlot {
		prefill += r.preSlot[i].inFlight.Load()
	}
	return decode, prefill
}
