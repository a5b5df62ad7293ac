package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/internal/invariants"
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/sampling"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// DecodeConfig configures a decode worker.
type DecodeConfig struct {
	Model *model.Model
	// Pool is the decode pool; its shape must match the model.
	Pool *kvpool.Pool
	Auth *transfer.Auth
	Self transfer.PeerID // this worker's transfer identity
	// Router is the PeerID the router's messages (Open, Abort) are stepped
	// from.
	Router transfer.PeerID
	// ContextWindow is the most tokens per request (prompt + max_tokens);
	// 0 means the model's context length. LowerWindow lets NewDecodeWorker
	// lower it to the pool's tokens instead of refusing (I6); Note says so.
	ContextWindow int
	LowerWindow   bool
	// MaxRunning bounds requests holding pages (--max-running-requests).
	// Default 64.
	MaxRunning int
	// MaxQueue bounds requests waiting for admission. Default 1024.
	MaxQueue int
	// StreamBuffer is each stream's event buffer; a sequence whose client
	// does not read skips steps once it is full. Default 64.
	StreamBuffer int
	// Threads for the forward pass (< 1: GOMAXPROCS).
	Threads int
	// TickInterval is the machine's tick (default 10ms). Timeouts below are
	// in ticks.
	TickInterval time.Duration
	// TransferTimeout bounds Grant to Done (and a request's wait for its
	// prefill peer's first connection); 0 means 60000 (10 minutes at the
	// default tick): a lost connection is caught by the peer epoch, so this
	// only ends transfers of a prefill worker that is alive but stuck, and
	// must exceed the longest prefill.
	TransferTimeout int64
	DrainTimeout    int64 // abort to Drained before quarantine; 0 means 100
	// ReconnectGrace bounds how long a request waits for a prefill peer
	// that was connected before and whose connection is down now; 0 means
	// 500 (5 s at the default tick). Past it the request fails with
	// peer_lost.
	ReconnectGrace int64
	transfer.Protections
	// TransferAddr is where prefill workers dial this worker (Info).
	TransferAddr string
	// KeyBase makes window keys unique across incarnations (random).
	KeyBase uint64
	Log     *slog.Logger
}

// DecodeStats is a snapshot of a decode worker's gauges and counters.
type DecodeStats struct {
	Pool          kvpool.Stats // pages by state; fence, checksum, quarantine counters
	PoolTokens    int
	ContextWindow int
	Running       int // requests holding pages
	Active        int // sequences decoding
	Queued        int // waiting for admission
	// Rejected counts requests refused before any reservation, by kind
	// (context_length_exceeded, invalid_request, overloaded, shutting_down).
	Rejected          [reqerr.KindInternal + 1]uint64
	Failed            [reqerr.KindInternal + 1]uint64 // admitted requests that ended with an error, by kind
	DeferredDrained   uint64                          // deferred releases ended by Drained
	DeferredTimeout   uint64                          // deferred releases ended by the drain timeout (quarantine)
	IntegrityFailures uint64                          // transfers that failed verification
	FenceFailures     uint64                          // sequences ended because a page failed VerifyFences before a step
	GeneratedTokens   uint64
	Steps             uint64 // forward calls
	MaxBatch          int    // the most sequences one step carried
	Machine           transfer.DecodeStats
}

// DecodeWorker is a decode worker: the decode transfer machine, the
// continuous-batching loop and the admission queue, driven by one goroutine.
// Its exported methods are safe for concurrent use. It implements Decoder
// and link.Sink (give it to the transports that connect prefill workers).
type DecodeWorker struct {
	cfg     DecodeConfig
	window  int
	note    string
	windows *transfer.WindowTable
	in      *inbox
	done    chan struct{} // closed when the driver goroutine exits
	ctx     context.Context
	cancel  context.CancelFunc

	// mu guards the admission bookkeeping shared with Generate and Close.
	mu struct {
		sync.Mutex
		waiting    int  // requests handed to the driver and not yet admitted or ended
		closing    bool // Close was called: no new work
		shutdownBy <-chan struct{}
	}
	rejected [reqerr.KindInternal + 1]atomic.Uint64
	// hold keeps decode steps from running while fewer sequences than it
	// can step (tests use it to build a known batch).
	hold atomic.Int32
	// onAdmit, when set before the first request, is called by the driver
	// for each admitted room (tests observe admission order).
	onAdmit func(transfer.RoomID)

	// snap is the driver's published view for Info and Stats.
	snapMu sync.Mutex
	snap   DecodeStats

	d driverState // owned by the driver goroutine
}

// driverState is everything only the driver goroutine touches.
type driverState struct {
	m       *transfer.DecodeMachine
	links   map[transfer.PeerID]link.Link
	epochs  map[transfer.PeerID]uint64  // last connection epoch seen per prefill peer
	parked  map[transfer.PeerID][]*dreq // waiting for their prefill peer's first connection
	nparked int
	reqs    map[transfer.RoomID]*dreq
	fair    fairQueue
	running int // requests holding pages (opened or active)
	active  []*dreq
	scratch []*dreq
	later   []transfer.RoomID // Finish calls owed after the current outputs
	unsent  []transfer.RoomID // GrantUnsent calls owed: the link refused these rooms' Grants
	ws      *model.Workspace
	zeros   []float32 // a logits row that advances a sampler's draw count
	batch   []model.Seq
	inBatch []*dreq
	ops     []op
	now     int64
	stats   DecodeStats
	closing bool
	abortAt bool // the shutdown deadline passed: everything is aborted
}

type dstate uint8

const (
	dsQueued dstate = iota // in the fair queue: nothing reserved
	dsOpened               // growth pages reserved, Open stepped
	dsActive               // transfer verified; decoding
)

// dreq is one generation request inside the decode worker.
type dreq struct {
	req      *GenerateRequest
	room     transfer.RoomID
	state    dstate
	stream   *stream
	growth   []int32 // pages for generated tokens, reserved at admission
	pages    []int32 // page table once active: prompt pages then growth
	prompt   int
	pos      int      // position of tok[0] (the last emitted token, or the last prompt token while lpOwed)
	tok      [2]int32 // the chunk fed at the next step
	ntok     int
	gen      int  // tokens emitted so far
	lpOwed   bool // the first token's logprobs are still to compute
	first    int32
	smp      *sampling.Sampler // this request's seeded sampler
	stops    []int32
	stamped  int   // pages of the table whose headers carry this room's fence
	parked   bool  // waiting for its prefill peer to connect (not in the fair queue)
	deadline int64 // tick by which a parked request must be queued
}

// NewDecodeWorker checks the pool against the context window (I6) and
// starts the worker's driver goroutine.
func NewDecodeWorker(cfg DecodeConfig) (*DecodeWorker, error) {
	window, note, err := workerWindow("decode", cfg.Model, cfg.Pool, cfg.Auth, cfg.ContextWindow, cfg.LowerWindow)
	if err != nil {
		return nil, err
	}
	cfg.MaxRunning = orDefault(cfg.MaxRunning, 64)
	cfg.MaxQueue = orDefault(cfg.MaxQueue, 1024)
	cfg.StreamBuffer = max(orDefault(cfg.StreamBuffer, 64), 2)
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 10 * time.Millisecond
	}
	if cfg.TransferTimeout == 0 {
		cfg.TransferTimeout = 60000
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 100
	}
	if cfg.ReconnectGrace == 0 {
		cfg.ReconnectGrace = 500
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	w := &DecodeWorker{cfg: cfg, window: window, note: note, windows: transfer.NewWindowTable(0), in: newInbox(), done: make(chan struct{})}
	m, err := transfer.NewDecodeMachine(transfer.DecodeConfig{
		Self: cfg.Self, Pool: cfg.Pool, Windows: w.windows, Auth: cfg.Auth, Protections: cfg.Protections,
		ContextWindow: window, MaxRooms: 4 * cfg.MaxRunning, MaxQueue: cfg.MaxRunning,
		TransferTimeout: cfg.TransferTimeout, DrainTimeout: cfg.DrainTimeout, KeyBase: cfg.KeyBase,
	})
	if err != nil {
		return nil, err
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.d = driverState{
		m: m, links: make(map[transfer.PeerID]link.Link), reqs: make(map[transfer.RoomID]*dreq),
		epochs: make(map[transfer.PeerID]uint64), parked: make(map[transfer.PeerID][]*dreq),
		fair:  newFairQueue(),
		ws:    cfg.Model.NewWorkspace(2*cfg.MaxRunning, cfg.MaxRunning, cfg.Threads),
		zeros: make([]float32, cfg.Model.Config.Vocab),
	}
	w.publish()
	go w.run()
	return w, nil
}

// Note is the I6 note when the context window was lowered to the pool
// ("" otherwise); the caller logs it.
func (w *DecodeWorker) Note() string { return w.note }

// ContextWindow is the effective context window.
func (w *DecodeWorker) ContextWindow() int { return w.window }

// Receiver is this worker's data path, for the transports that connect
// prefill workers to it.
func (w *DecodeWorker) Receiver() link.Receiver {
	return link.Receiver{Pool: w.cfg.Pool, Windows: w.windows, Auth: w.cfg.Auth}
}

// AddLink makes l the link to its peer (replacing an older one).
func (w *DecodeWorker) AddLink(l link.Link) { w.in.put(op{kind: opLink, link: l}) }

// Deliver implements link.Sink.
func (w *DecodeWorker) Deliver(from transfer.PeerID, m transfer.Message) {
	w.in.put(op{kind: opDeliver, from: from, msg: m})
}

// Landed implements link.Sink; a decode worker posts no writes.
func (w *DecodeWorker) Landed(r link.Report) {
	invariants.Assert(false, "engine: decode worker got a write report")
}

// Info implements Decoder.
func (w *DecodeWorker) Info() WorkerInfo {
	s := w.Stats()
	w.mu.Lock()
	closing := w.mu.closing
	w.mu.Unlock()
	name := w.cfg.Model.Config.Name
	return WorkerInfo{
		Role: "decode", Model: name, ContextWindow: w.window, PageSize: w.cfg.Pool.PageSize(),
		PoolPages: w.cfg.Pool.Total(), PoolTokens: w.cfg.Pool.Tokens(), FreePages: s.Pool.Free,
		Running: s.Running, Queued: s.Queued, MaxRunning: w.cfg.MaxRunning,
		Peer: w.cfg.Self, TransferAddr: w.cfg.TransferAddr, Draining: closing,
	}
}

// Stats returns a snapshot of the worker's gauges and counters.
func (w *DecodeWorker) Stats() DecodeStats {
	w.snapMu.Lock()
	s := w.snap
	w.snapMu.Unlock()
	s.Pool = w.cfg.Pool.Stats()
	s.PoolTokens = w.cfg.Pool.Tokens()
	s.ContextWindow = w.window
	for k := range s.Rejected {
		s.Rejected[k] = w.rejected[k].Load()
	}
	return s
}

func (w *DecodeWorker) reject(err error) error {
	w.rejected[reqerr.KindOf(err)].Add(1)
	return err
}

// Generate implements Decoder.
func (w *DecodeWorker) Generate(ctx context.Context, r *GenerateRequest) (TokenStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := w.validate(r); err != nil {
		return nil, w.reject(err)
	}
	prompt := len(r.Prompt)
	if prompt+r.MaxTokens > w.window {
		// I3: refuse before anything is reserved. The machine still hears
		// the Open so that it tells the prefill side (Reject), and reserves
		// nothing for it either.
		w.in.put(op{kind: opReject, msg: r.Open})
		return nil, w.reject(&reqerr.ContextLengthError{Prompt: prompt, MaxTokens: r.MaxTokens, Limit: w.window})
	}
	w.mu.Lock()
	switch {
	case w.mu.closing:
		w.mu.Unlock()
		return nil, w.reject(reqerr.New(reqerr.KindShuttingDown, "decode worker %d is shutting down", w.cfg.Self))
	case w.mu.waiting >= w.cfg.MaxQueue:
		w.mu.Unlock()
		return nil, w.reject(reqerr.New(reqerr.KindOverloaded, "decode worker %d: admission queue full (%d)", w.cfg.Self, w.cfg.MaxQueue))
	}
	w.mu.waiting++
	w.mu.Unlock()
	smp, err := sampling.New(samplingParams(r.Sampling, r.Logprobs, r.TopLogprobs), w.cfg.Model.Config.Vocab)
	if err != nil {
		w.unwait()
		return nil, w.reject(reqerr.New(reqerr.KindInvalidRequest, "%v", err))
	}
	q := &dreq{req: r, room: r.Open.Room, prompt: prompt, stops: r.StopIDs, smp: smp}
	q.stream = &stream{w: w, room: q.room, ch: make(chan TokenEvent, w.cfg.StreamBuffer), end: make(chan struct{})}
	w.in.put(op{kind: opGenerate, gen: q})
	return q.stream, nil
}

func (w *DecodeWorker) validate(r *GenerateRequest) error {
	switch {
	case r == nil || r.Open == nil:
		return reqerr.New(reqerr.KindInvalidRequest, "generate request without a signed open")
	case !w.cfg.Auth.Verify(r.Open):
		return reqerr.New(reqerr.KindInvalidRequest, "room %v: open does not authenticate", r.Open.Room)
	case len(r.Prompt) == 0 || len(r.Prompt) != int(r.Open.PromptTokens):
		return reqerr.New(reqerr.KindInvalidRequest, "room %v: %d prompt tokens, the open says %d", r.Open.Room, len(r.Prompt), r.Open.PromptTokens)
	case r.MaxTokens < 1 || r.MaxTokens != int(r.Open.MaxTokens):
		return reqerr.New(reqerr.KindInvalidRequest, "room %v: max tokens %d, the open says %d", r.Open.Room, r.MaxTokens, r.Open.MaxTokens)
	case r.TopLogprobs < 0 || r.TopLogprobs > 20:
		return reqerr.New(reqerr.KindInvalidRequest, "top logprobs %d outside 0..20", r.TopLogprobs)
	case r.Sampling.Temperature < 0 || r.Sampling.TopP < 0 || r.Sampling.TopP > 1:
		return reqerr.New(reqerr.KindInvalidRequest, "sampling parameters out of range")
	}
	vocab := int32(w.cfg.Model.Config.Vocab)
	for _, t := range r.Prompt {
		if t < 0 || t >= vocab {
			return reqerr.New(reqerr.KindInvalidRequest, "room %v: prompt token outside the vocabulary", r.Open.Room)
		}
	}
	return nil
}

// Abort implements Decoder.
func (w *DecodeWorker) Abort(m *transfer.Abort) {
	if m == nil {
		return
	}
	w.in.put(op{kind: opDeliver, from: w.cfg.Router, msg: m})
}

// Close stops taking work and shuts the worker down: requests still waiting
// for admission fail with shutting_down at once; admitted ones run on until
// they finish or ctx ends, when they are aborted (their pages go through the
// normal release paths); then the driver waits, still bounded by ctx, for
// the aborted transfers to drain. It returns ctx's error if it had to abort
// or stop waiting, nil after a clean drain. Links are the caller's to close.
func (w *DecodeWorker) Close(ctx context.Context) error {
	w.mu.Lock()
	already := w.mu.closing
	w.mu.closing = true
	w.mu.shutdownBy = ctx.Done()
	w.mu.Unlock()
	if already {
		<-w.done
		return nil
	}
	w.in.put(op{kind: opAbort}) // wake the driver to see closing
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	w.in.put(op{kind: opAbort})
	<-w.done
	return ctx.Err()
}

// run is the driver goroutine.
func (w *DecodeWorker) run() {
	defer close(w.done)
	defer w.d.ws.Close()
	defer w.cancel()
	t := time.NewTicker(w.cfg.TickInterval)
	defer t.Stop()
	for {
		w.drain()
		select {
		case <-t.C:
			w.tick()
		default:
		}
		if w.shutdownStep() {
			w.publish()
			return
		}
		w.admit()
		stepped := w.step()
		w.publish()
		if stepped {
			continue
		}
		select {
		case <-w.in.wake:
		case <-t.C:
			w.tick()
		}
	}
}

func (w *DecodeWorker) tick() {
	d := &w.d
	d.now++
	w.apply(d.m.Tick(d.now))
	if d.nparked == 0 {
		return
	}
	for _, qs := range mapValues(d.parked) {
		for _, q := range qs {
			if d.now >= q.deadline {
				w.endQueued(q, reqerr.New(reqerr.KindPeerLost, "room %v: prefill worker %d is not connected", q.room, q.req.Open.Prefill))
			}
		}
	}
}

// peerReady reports whether a Grant sent to peer now would go out on a
// connection whose epoch this worker has seen. A Grant sent while the link
// is down is refused (the request would fail at once, GrantUnsent), and
// one sent on a new connection before its epoch arrives here would be
// failed by that epoch; a request for such a peer waits (parks) instead.
func (w *DecodeWorker) peerReady(peer transfer.PeerID) bool {
	d := &w.d
	l := d.links[peer]
	return l != nil && d.epochs[peer] > 0 && l.Connected() && l.Epoch() == d.epochs[peer]
}

// enqueue puts a new request in the fair queue, or parks it while its
// prefill peer is not ready (see peerReady).
func (w *DecodeWorker) enqueue(q *dreq) {
	if w.peerReady(q.req.Open.Prefill) {
		w.d.fair.push(q.req.Tenant, q)
		return
	}
	w.park(q)
}

// park holds q until its prefill peer is ready: up to TransferTimeout for
// a peer's first connection, up to ReconnectGrace for a peer that was
// connected before (it may be gone for good).
func (w *DecodeWorker) park(q *dreq) {
	d := &w.d
	peer := q.req.Open.Prefill
	wait := w.cfg.TransferTimeout
	if d.epochs[peer] > 0 {
		wait = min(wait, w.cfg.ReconnectGrace)
	}
	q.parked = true
	q.deadline = d.now + wait
	d.parked[peer] = append(d.parked[peer], q)
	d.nparked++
}

// unpark moves the requests parked for peer to the fair queue once it is
// ready.
func (w *DecodeWorker) unpark(peer transfer.PeerID) {
	d := &w.d
	if len(d.parked[peer]) == 0 || !w.peerReady(peer) {
		return
	}
	qs := d.parked[peer]
	delete(d.parked, peer)
	for _, q := range qs {
		q.parked = false
		d.nparked--
		d.fair.push(q.req.Tenant, q)
	}
}

// waitingAll lists the requests waiting for admission.
func (w *DecodeWorker) waitingAll() []*dreq {
	out := w.d.fair.all()
	for _, qs := range w.d.parked {
		out = append(out, qs...)
	}
	return out
}

// drain processes every pending input.
func (w *DecodeWorker) drain() {
	for {
		ops := w.in.take(w.d.ops)
		if len(ops) == 0 {
			w.d.ops = ops
			return
		}
		for i := range ops {
			w.handle(&ops[i])
			ops[i] = op{}
		}
		w.d.ops = ops
	}
}

func (w *DecodeWorker) handle(o *op) {
	d := &w.d
	switch o.kind {
	case opLink:
		d.links[o.link.Peer()] = o.link
		w.unpark(o.link.Peer())
	case opDeliver:
		switch m := o.msg.(type) {
		case *transfer.Abort:
			if q := d.reqs[m.Room]; q != nil && q.state == dsQueued {
				w.endQueued(q, reqerr.New(reqerr.KindAborted, "room %v aborted before admission", q.room))
			}
		case *transfer.PeerEpoch:
			w.peerEpoch(o.from, m)
		}
		w.apply(d.m.Step(o.from, o.msg))
	case opReject:
		w.apply(d.m.Step(w.cfg.Router, o.msg))
	case opGenerate:
		q := o.gen
		if _, dup := d.reqs[q.room]; dup || d.closing {
			w.unwait()
			err := reqerr.New(reqerr.KindInvalidRequest, "room %v is already in use", q.room)
			if d.closing {
				err = reqerr.New(reqerr.KindShuttingDown, "decode worker %d is shutting down", w.cfg.Self)
			}
			w.rejected[reqerr.KindOf(err)].Add(1)
			q.stream.finish(err)
			return
		}
		d.reqs[q.room] = q
		w.enqueue(q)
	case opClose:
		q := d.reqs[o.room]
		if q == nil {
			return
		}
		err := reqerr.New(reqerr.KindAborted, "room %v: stream closed", q.room)
		switch q.state {
		case dsQueued:
			w.endQueued(q, err)
		case dsOpened:
			w.apply(d.m.Abort(q.room, reqerr.KindAborted))
			if d.reqs[q.room] == q { // no Fail came back: the room is gone already
				w.endOpened(q, err)
			}
		case dsActive:
			w.endActive(q, "", err)
		}
	case opAbort:
		// Close woke the driver; shutdownStep does the work.
	}
}

// peerEpoch fails the requests still waiting for admission whose prefill
// peer reconnected: the prefill side has failed its rooms for this worker
// (the same rule as the machine's for the rooms it holds), so their
// transfers would never come. The first epoch of a peer is a first
// connection, not a loss.
func (w *DecodeWorker) peerEpoch(from transfer.PeerID, m *transfer.PeerEpoch) {
	d := &w.d
	if !w.cfg.Auth.Verify(m) || m.Epoch <= d.epochs[m.Peer] {
		return
	}
	prev := d.epochs[m.Peer]
	d.epochs[m.Peer] = m.Epoch
	defer w.unpark(m.Peer)
	if prev == 0 {
		return
	}
	for _, q := range d.fair.all() {
		if q.req.Open.Prefill == m.Peer {
			w.endQueued(q, reqerr.New(reqerr.KindPeerLost, "room %v: prefill peer %d reconnected", q.room, m.Peer))
		}
	}
}

// errNoLink: a message for a peer this worker has no link to was dropped.
var errNoLink = errors.New("engine: no link to peer")

// apply acts on a machine call's outputs, in order, then makes the Finish
// calls they owed.
func (w *DecodeWorker) apply(outs []transfer.Output) {
	d := &w.d
	for {
		for _, o := range outs {
			w.output(o)
		}
		switch {
		case len(d.unsent) > 0:
			room := d.unsent[0]
			d.unsent = d.unsent[1:]
			outs = d.m.GrantUnsent(room)
		case len(d.later) > 0:
			room := d.later[0]
			d.later = d.later[1:]
			outs = d.m.Finish(room)
		default:
			return
		}
	}
}

func (w *DecodeWorker) output(o transfer.Output) {
	d := &w.d
	switch o := o.(type) {
	case transfer.Send:
		var err error
		if l := d.links[o.To]; l == nil {
			err = errNoLink
		} else {
			err = l.Send(w.ctx, o.Msg)
		}
		if err == nil {
			return
		}
		w.cfg.Log.Info("send failed", "peer", o.To, "type", o.Msg.Type(), "err", err)
		if o.Msg.Type() == transfer.TypeGrant {
			// A Send error means the Grant was never transmitted
			// (link.Link's contract): the machine may free its pages now
			// instead of waiting on a peer that never heard of them.
			d.unsent = append(d.unsent, o.Msg.Env().Room)
		}
	case transfer.StartDecode:
		q := d.reqs[o.Room]
		if q == nil || q.state != dsOpened {
			// Nobody waits for it (cannot happen: a closed stream aborts
			// the room first); give the pages back.
			d.later = append(d.later, o.Room)
			return
		}
		w.start(q, o)
	case transfer.Fail:
		q := d.reqs[o.Room]
		if q == nil {
			return
		}
		switch q.state {
		case dsQueued:
			w.endQueued(q, o.Err)
		case dsOpened:
			w.endOpened(q, o.Err)
		case dsActive:
			w.endActive(q, "", o.Err)
		}
	case transfer.PagesQuarantined, transfer.PagesDeferred, transfer.PagesReleased,
		transfer.OpenWindow, transfer.RevokeWindow:
		// Applied by the machine; counted in its stats.
	default:
		w.cfg.Log.Debug("decode machine", "output", o.String())
	}
}

// admit moves requests from the fair queue into the machine while pages and
// running slots allow. A request is admitted only when every page it can
// ever need (prompt + max_tokens) is free: the growth pages are reserved
// here, the prompt pages are allocated by the machine in the same step, so
// an admitted request never waits for pages again.
func (w *DecodeWorker) admit() {
	d := &w.d
	ps := w.cfg.Pool.PageSize()
	for d.running < w.cfg.MaxRunning && !d.closing {
		q := d.fair.peek()
		if q == nil {
			return
		}
		if !w.peerReady(q.req.Open.Prefill) {
			// Its prefill peer's connection dropped while it waited.
			d.fair.pop()
			w.park(q)
			continue
		}
		promptPages := ceilDiv(q.prompt, ps)
		need := ceilDiv(q.prompt+q.req.MaxTokens, ps)
		if w.cfg.Pool.Counts().Free < need {
			return // strict turn: the tenant at the head waits, nobody overtakes it
		}
		d.fair.pop()
		w.unwait()
		if w.onAdmit != nil {
			w.onAdmit(q.room)
		}
		growth, err := w.cfg.Pool.Alloc(q.room, need-promptPages, nil)
		invariants.Assert(err == nil, "engine: growth pages not free after the check")
		q.growth = growth
		q.state = dsOpened
		d.running++
		w.apply(d.m.Step(w.cfg.Router, q.req.Open))
		if d.reqs[q.room] == q && q.state == dsOpened {
			if _, live := d.m.State(q.room); !live {
				// Dropped without a Fail (an abort overtook the Open).
				w.endOpened(q, reqerr.New(reqerr.KindAborted, "room %v was aborted before it opened", q.room))
			}
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func (w *DecodeWorker) unwait() {
	w.mu.Lock()
	w.mu.waiting--
	w.mu.Unlock()
}

// endQueued ends a request that holds nothing. The prefill side may be
// computing the room already and would wait for a grant until its timeout:
// tell it (an Abort it answers with Drained, or drops as a replay), and
// close the room in the machine so a late Open reserves nothing.
func (w *DecodeWorker) endQueued(q *dreq, err error) {
	if q.parked {
		w.d.parked[q.req.Open.Prefill] = slices.DeleteFunc(w.d.parked[q.req.Open.Prefill], func(p *dreq) bool { return p == q })
		w.d.nparked--
	} else {
		w.d.fair.remove(q)
	}
	w.unwait()
	delete(w.d.reqs, q.room)
	w.d.stats.Failed[reqerr.KindOf(err)]++
	q.stream.finish(err)
	a := &transfer.Abort{Envelope: transfer.Envelope{Room: q.room}, Reason: reqerr.KindAborted, Decode: w.cfg.Self}
	w.cfg.Auth.Sign(a)
	if l := w.d.links[q.req.Open.Prefill]; l != nil {
		if err := l.Send(w.ctx, a); err != nil {
			w.cfg.Log.Info("send failed", "peer", q.req.Open.Prefill, "type", a.Type(), "err", err)
		}
	}
	w.apply(w.d.m.Abort(q.room, reqerr.KindAborted))
}

// endOpened ends a request whose room the machine has closed (or holds
// under deferred release): only the growth pages are the engine's.
func (w *DecodeWorker) endOpened(q *dreq, err error) {
	w.cfg.Pool.Free(q.room, q.growth)
	q.growth = nil
	w.d.running--
	delete(w.d.reqs, q.room)
	w.d.stats.Failed[reqerr.KindOf(err)]++
	q.stream.finish(err)
}

// endActive ends a decoding sequence: with finish set it ended normally
// (its last event is already in the stream), else with err.
func (w *DecodeWorker) endActive(q *dreq, finish string, err error) {
	d := &w.d
	w.cfg.Pool.Free(q.room, q.growth)
	q.growth = nil
	d.running--
	delete(d.reqs, q.room)
	if i := slices.Index(d.active, q); i >= 0 {
		d.active = slices.Delete(d.active, i, i+1)
	}
	d.later = append(d.later, q.room)
	if finish == "" {
		d.stats.Failed[reqerr.KindOf(err)]++
	}
	q.stream.finish(err)
}

// start makes a verified transfer a decoding sequence.
func (w *DecodeWorker) start(q *dreq, o transfer.StartDecode) {
	d := &w.d
	q.state = dsActive
	q.pages = append(slices.Clone(o.Pages), q.growth...)
	q.stamped = len(o.Pages)
	q.first = o.FirstToken
	d.active = append(d.active, q)
	r := q.req
	if r.Logprobs || r.TopLogprobs > 0 {
		// The prefill side sampled the first token; recompute the last
		// prompt position (its KV is rewritten bit-identically) for its
		// logprobs.
		q.lpOwed = true
		q.pos = q.prompt - 1
		q.tok[0], q.tok[1] = r.Prompt[q.prompt-1], o.FirstToken
		q.ntok = 2
		if w.isLast(q, o.FirstToken, 1) != "" {
			q.ntok = 1
		}
		return
	}
	if advances(q.smp.Params()) {
		// The prefill side drew the first token; draw once here too so
		// this sampler continues where a single process would be.
		_, _ = q.smp.Sample(w.d.zeros)
	}
	w.emit(q, sampling.Result{Token: o.FirstToken})
}

// isLast says whether the gen-th generated token tok ends the request.
func (w *DecodeWorker) isLast(q *dreq, tok int32, gen int) string {
	if slices.Contains(q.stops, tok) || (w.cfg.Model.Tok != nil && w.cfg.Model.Tok.IsEOG(tok)) {
		return FinishStop
	}
	if gen >= q.req.MaxTokens {
		return FinishLength
	}
	return ""
}

// emit sends a generated token to the stream and ends the sequence when it
// is the last.
func (w *DecodeWorker) emit(q *dreq, c sampling.Result) {
	q.gen++
	w.d.stats.GeneratedTokens++
	fin := w.isLast(q, c.Token, q.gen)
	ev := TokenEvent{ID: c.Token, Finish: fin}
	if q.req.Logprobs || q.req.TopLogprobs > 0 {
		ev.Logprob = c.LogProb
		if len(c.Top) > 0 {
			ev.Top = make([]TopLogprob, len(c.Top)) // c.Top aliases the sampler
			for i, t := range c.Top {
				ev.Top[i] = TopLogprob{ID: t.Token, Logprob: t.LogProb}
			}
		}
	}
	// The driver never blocks on a client: a sequence only steps when its
	// stream has room (see step), and the first event goes to an empty one.
	select {
	case q.stream.ch <- ev:
	default:
		invariants.Assert(false, "engine: stream buffer full at emit")
	}
	if fin != "" {
		w.endActive(q, fin, nil)
		return
	}
	q.pos = q.prompt + q.gen - 1
	q.tok[0] = c.Token
	q.ntok = 1
}

// step runs one forward call over every active sequence that can take a
// token, and reports whether it ran.
func (w *DecodeWorker) step() bool {
	d := &w.d
	if len(d.active) == 0 {
		return false
	}
	ps := w.cfg.Pool.PageSize()
	d.batch, d.inBatch = d.batch[:0], d.inBatch[:0]
	d.scratch = append(d.scratch[:0], d.active...) // endActive edits d.active
	for _, q := range d.scratch {
		if len(q.stream.ch) >= cap(q.stream.ch)-1 {
			continue // the client is behind; this sequence waits
		}
		last := q.pos + q.ntok - 1
		n := last/ps + 1 // pages covering the chunk
		for ; q.stamped < n; q.stamped++ {
			// A growth page becomes this sequence's page when its first
			// slot is written: stamp its fence so reads can verify it.
			w.cfg.Pool.Stamp(q.pages[q.stamped], uint32(q.stamped), 0)
		}
		if !w.cfg.NoFenceCheck {
			if err := w.cfg.Pool.VerifyFences(q.room, q.pages[:n]); err != nil {
				d.stats.FenceFailures++
				w.cfg.Log.Error("fence mismatch before a decode step; request failed", "room", q.room, "err", err)
				w.endActive(q, "", reqerr.New(reqerr.KindIntegrity, "room %v: %v", q.room, err))
				continue
			}
		}
		mode := model.LogitsLast
		if q.ntok == 2 {
			mode = model.LogitsAll
		}
		d.batch = append(d.batch, model.Seq{Tokens: q.tok[:q.ntok], Pos: q.pos, Pages: q.pages[:n], Logits: mode})
		d.inBatch = append(d.inBatch, q)
	}
	if len(d.later) > 0 {
		w.apply(nil)
	}
	if len(d.batch) == 0 || len(d.batch) < int(w.hold.Load()) {
		return false
	}
	if err := w.cfg.Model.Forward(d.ws, w.cfg.Pool, d.batch); err != nil {
		// A batch the engine built wrong: fail the requests, loudly.
		w.cfg.Log.Error("decode forward refused", "err", err)
		for _, q := range d.inBatch {
			w.endActive(q, "", reqerr.New(reqerr.KindInternal, "decode step failed"))
		}
		w.apply(nil)
		return true
	}
	d.stats.Steps++
	d.stats.MaxBatch = max(d.stats.MaxBatch, len(d.batch))
	for i, q := range d.inBatch {
		if q.lpOwed {
			q.lpOwed = false
			// Sampling the recomputed row draws what the prefill side
			// drew; its choice stands, with its logprob on this row.
			row := d.ws.Logits(i, 0)
			c, err := q.smp.Sample(row)
			if err != nil {
				w.endActive(q, "", reqerr.New(reqerr.KindInternal, "room %v: sampling: %v", q.room, err))
				continue
			}
			c.Token, c.LogProb = q.first, logprobOf(row, q.first)
			w.emit(q, c)
			if q.state != dsActive || len(d.batch[i].Tokens) == 1 {
				continue
			}
			w.sampleEmit(q, d.ws.Logits(i, 1))
			continue
		}
		w.sampleEmit(q, d.ws.Logits(i, 0))
	}
	w.apply(nil)
	return true
}

func (w *DecodeWorker) sampleEmit(q *dreq, row []float32) {
	c, err := q.smp.Sample(row)
	if err != nil {
		// NaN logits: the KV or the model is corrupt; never guess.
		w.endActive(q, "", reqerr.New(reqerr.KindInternal, "room %v: sampling: %v", q.room, err))
		return
	}
	w.emit(q, c)
}

// advances reports whether sampling with p draws a random number (and so
// moves the sampler's stream).
func advances(p sampling.Params) bool { return p.Temperature > 0 && p.TopK != 1 }

func logprobOf(logits []float32, id int32) float32 {
	m := float64(logits[0])
	for _, v := range logits {
		m = max(m, float64(v))
	}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v) - m)
	}
	return float32(float64(logits[id]) - m - math.Log(sum))
}

// shutdownStep runs the shutdown phases; it reports true when the driver
// should exit.
func (w *DecodeWorker) shutdownStep() bool {
	d := &w.d
	w.mu.Lock()
	closing, by := w.mu.closing, w.mu.shutdownBy
	w.mu.Unlock()
	if !closing {
		return false
	}
	if !d.closing {
		d.closing = true
		for _, q := range w.waitingAll() {
			w.endQueued(q, reqerr.New(reqerr.KindShuttingDown, "decode worker %d is shutting down", w.cfg.Self))
		}
	}
	expired := false
	select {
	case <-by:
		expired = true
	default:
	}
	if expired && !d.abortAt {
		d.abortAt = true
		for _, q := range mapValues(d.reqs) {
			err := reqerr.New(reqerr.KindShuttingDown, "room %v: worker shutting down", q.room)
			switch q.state {
			case dsOpened:
				w.apply(d.m.Abort(q.room, reqerr.KindShuttingDown))
				if d.reqs[q.room] == q {
					w.endOpened(q, err)
				}
			case dsActive:
				w.endActive(q, "", err)
				w.apply(nil)
			}
		}
	}
	if len(d.reqs) > 0 {
		return false
	}
	// Requests are over; wait for aborted transfers to drain (Drained, or
	// the drain timeout moves their pages to quarantine, where only a new
	// connection epoch frees them) unless the deadline passed.
	return w.cfg.Pool.Counts().Deferred == 0 || expired
}

func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// publish copies the driver's gauges and counters for Stats.
func (w *DecodeWorker) publish() {
	d := &w.d
	d.stats.Running = d.running
	d.stats.Active = len(d.active)
	d.stats.Queued = d.fair.len() + d.nparked
	d.stats.Machine = d.m.Stats()
	d.stats.DeferredDrained = d.stats.Machine.DrainedReleases
	d.stats.DeferredTimeout = d.stats.Machine.TimeoutQuarantines
	d.stats.IntegrityFailures = d.stats.Machine.IntegrityFailures
	w.snapMu.Lock()
	w.snap = d.stats
	w.snapMu.Unlock()
}

// stream is a TokenStream fed by the driver.
type stream struct {
	w    *DecodeWorker
	room transfer.RoomID
	ch   chan TokenEvent
	end  chan struct{} // closed by the driver once err is set and no event follows
	err  error         // written before end is closed; nil means io.EOF
	// sticky is the consumer's own state (one goroutine).
	sticky error
	closed atomic.Bool
}

// finish is called by the driver, once.
func (s *stream) finish(err error) {
	s.err = err
	close(s.end)
}

// Next implements TokenStream.
func (s *stream) Next(ctx context.Context) (TokenEvent, error) {
	if s.sticky != nil {
		return TokenEvent{}, s.sticky
	}
	select {
	case ev := <-s.ch:
		return ev, nil
	default:
	}
	select {
	case ev := <-s.ch:
		return ev, nil
	case <-s.end:
		select {
		case ev := <-s.ch:
			return ev, nil
		default:
		}
		s.sticky = s.err
		if s.sticky == nil {
			s.sticky = io.EOF
		}
		return TokenEvent{}, s.sticky
	case <-ctx.Done():
		return TokenEvent{}, ctx.Err()
	}
}

// Close implements TokenStream.
func (s *stream) Close() {
	if s.closed.Swap(true) {
		return
	}
	select {
	case <-s.end:
		return // already over: nothing to release
	default:
	}
	s.w.in.put(op{kind: opClose, room: s.room})
}
