package engine

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/sampling"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// PrefillConfig configures a prefill worker.
type PrefillConfig struct {
	Model  *model.Model
	Pool   *kvpool.Pool // the prefill pool: it must hold a whole prompt
	Auth   *transfer.Auth
	Self   transfer.PeerID
	Router transfer.PeerID // the PeerID router messages are stepped from
	// ContextWindow and LowerWindow: as for the decode worker (I6).
	ContextWindow int
	LowerWindow   bool
	// ChunkSize bounds the prompt tokens of one forward call
	// (--chunked-prefill-size); chunks of several rooms share a call.
	// Default 512.
	ChunkSize int
	// MaxRunning bounds rooms computing at once. Default 16.
	MaxRunning int
	// MaxRooms bounds rooms known to the machine. Default 1024.
	MaxRooms int
	Threads  int
	// TickInterval is the machine's tick (default 10ms). WaitTimeout, in
	// ticks, bounds a room's wait for its Grant (which comes when the decode
	// side admits it, so it includes decode queueing) and for local pages;
	// 0 means 60000 (10 minutes at the default tick).
	TickInterval time.Duration
	WaitTimeout  int64
	transfer.Protections
	// Dial opens a link to a decode worker the worker has none to
	// (PrefillRequest.DecodeAddr); the link must deliver to this worker
	// (it is a link.Sink). Nil: only links given to AddLink are used.
	Dial func(ctx context.Context, peer transfer.PeerID, addr string) (link.Link, error)
	Log  *slog.Logger
}

// PrefillStats is a snapshot of a prefill worker's gauges and counters.
type PrefillStats struct {
	Pool          kvpool.Stats
	PoolTokens    int
	ContextWindow int
	Running       int // rooms computing
	Rooms         int // rooms known to the machine
	Waiting       int // requests waiting for their Grant (not yet in the machine)
	InFlight      int // writes posted and not yet reported
	Forwards      uint64
	PromptTokens  uint64 // tokens computed
	WritesLost    uint64 // writes reported lost or refused
	FenceFailures uint64
	Machine       transfer.PrefillStats
}

// PrefillWorker is a prefill worker: the prefill transfer machine and
// chunked prefill, driven by one goroutine. Its exported methods are safe
// for concurrent use. It implements Prefiller and link.Sink.
type PrefillWorker struct {
	cfg    PrefillConfig
	window int
	note   string
	in     *inbox
	done   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the links known outside the driver (for Dial) and closing.
	mu struct {
		sync.Mutex
		links   map[transfer.PeerID]bool
		dialing map[transfer.PeerID]chan struct{}
		closing bool
	}
	lost atomic.Uint64

	snapMu sync.Mutex
	snap   PrefillStats

	d prefillState // owned by the driver goroutine
}

type prefillState struct {
	m       *transfer.PrefillMachine
	links   map[transfer.PeerID]link.Link
	rooms   map[transfer.RoomID]*preq
	stash   map[transfer.RoomID]*preq  // requests waiting for their Grant; the machine has not seen them
	epochs  map[transfer.PeerID]uint64 // last connection epoch seen per decode peer
	run     []*preq                    // rooms computing, in turn order
	turn    int
	ws      *model.Workspace
	batch   []model.Seq
	inBatch []*preq
	ops     []op
	now     int64
	stats   PrefillStats
}

// preq is one prefill request inside the worker.
type preq struct {
	req      *PrefillRequest
	room     transfer.RoomID
	result   chan error // capacity 1; the request's outcome
	answered bool
	pages    []int32 // local pages, from RunPrefill
	computed int
	running  bool
	deadline int64 // tick by which a stashed request must have its Grant
}

// NewPrefillWorker checks the pool against the context window (I6) and
// starts the driver goroutine.
func NewPrefillWorker(cfg PrefillConfig) (*PrefillWorker, error) {
	window, note, err := workerWindow("prefill", cfg.Model, cfg.Pool, cfg.Auth, cfg.ContextWindow, cfg.LowerWindow)
	if err != nil {
		return nil, err
	}
	cfg.ChunkSize = orDefault(cfg.ChunkSize, 512)
	cfg.MaxRunning = orDefault(cfg.MaxRunning, 16)
	cfg.MaxRooms = orDefault(cfg.MaxRooms, 1024)
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 10 * time.Millisecond
	}
	if cfg.WaitTimeout == 0 {
		cfg.WaitTimeout = 60000
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m, err := transfer.NewPrefillMachine(transfer.PrefillConfig{
		Self: cfg.Self, Pool: cfg.Pool, Auth: cfg.Auth, Protections: cfg.Protections,
		ContextWindow: window, MaxRooms: cfg.MaxRooms, MaxQueue: cfg.MaxRooms, WaitTimeout: cfg.WaitTimeout,
	})
	if err != nil {
		return nil, err
	}
	w := &PrefillWorker{cfg: cfg, window: window, note: note, in: newInbox(), done: make(chan struct{})}
	w.mu.links = make(map[transfer.PeerID]bool)
	w.mu.dialing = make(map[transfer.PeerID]chan struct{})
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.d = prefillState{
		m: m, links: make(map[transfer.PeerID]link.Link), rooms: make(map[transfer.RoomID]*preq),
		stash: make(map[transfer.RoomID]*preq), epochs: make(map[transfer.PeerID]uint64),
		ws: cfg.Model.NewWorkspace(cfg.ChunkSize, cfg.MaxRunning, cfg.Threads),
	}
	w.publish()
	go w.run()
	return w, nil
}

// Note is the I6 note when the window was lowered ("" otherwise).
func (w *PrefillWorker) Note() string { return w.note }

// ContextWindow is the effective context window.
func (w *PrefillWorker) ContextWindow() int { return w.window }

// AddLink makes l the link to its peer.
func (w *PrefillWorker) AddLink(l link.Link) {
	w.mu.Lock()
	w.mu.links[l.Peer()] = true
	w.mu.Unlock()
	w.in.put(op{kind: opLink, link: l})
}

// Deliver implements link.Sink.
func (w *PrefillWorker) Deliver(from transfer.PeerID, m transfer.Message) {
	w.in.put(op{kind: opDeliver, from: from, msg: m})
}

// Landed implements link.Sink.
func (w *PrefillWorker) Landed(r link.Report) {
	if r.Err != nil {
		w.lost.Add(1)
	}
	w.in.put(op{kind: opLanded, report: r})
}

// Info implements Prefiller.
func (w *PrefillWorker) Info() WorkerInfo {
	s := w.Stats()
	w.mu.Lock()
	closing := w.mu.closing
	w.mu.Unlock()
	return WorkerInfo{
		Role: "prefill", Model: w.cfg.Model.Config.Name, ContextWindow: w.window, PageSize: w.cfg.Pool.PageSize(),
		PoolPages: w.cfg.Pool.Total(), PoolTokens: w.cfg.Pool.Tokens(), FreePages: s.Pool.Free,
		Running: s.Running, Queued: s.Rooms - s.Running + s.Waiting, MaxRunning: w.cfg.MaxRunning,
		Peer: w.cfg.Self, Draining: closing,
	}
}

// Stats returns a snapshot of the worker's gauges and counters.
func (w *PrefillWorker) Stats() PrefillStats {
	w.snapMu.Lock()
	s := w.snap
	w.snapMu.Unlock()
	s.Pool = w.cfg.Pool.Stats()
	s.PoolTokens = w.cfg.Pool.Tokens()
	s.ContextWindow = w.window
	s.WritesLost = w.lost.Load()
	return s
}

// Prefill implements Prefiller.
func (w *PrefillWorker) Prefill(ctx context.Context, r *PrefillRequest) error {
	if err := w.validate(r); err != nil {
		return err
	}
	w.mu.Lock()
	closing := w.mu.closing
	w.mu.Unlock()
	if closing {
		return reqerr.New(reqerr.KindShuttingDown, "prefill worker %d is shutting down", w.cfg.Self)
	}
	if err := w.ensureLink(ctx, r.Prefill.Decode, r.DecodeAddr); err != nil {
		return err
	}
	q := &preq{req: r, room: r.Prefill.Room, result: make(chan error, 1)}
	w.in.put(op{kind: opPrefill, pre: q})
	select {
	case err := <-q.result:
		return err
	case <-ctx.Done():
		w.in.put(op{kind: opAbort, room: q.room, from: r.Prefill.Decode})
		return ctx.Err()
	}
}

func (w *PrefillWorker) validate(r *PrefillRequest) error {
	switch {
	case r == nil || r.Prefill == nil:
		return reqerr.New(reqerr.KindInvalidRequest, "prefill request without a signed prefill")
	case !w.cfg.Auth.Verify(r.Prefill):
		return reqerr.New(reqerr.KindInvalidRequest, "room %v: prefill does not authenticate", r.Prefill.Room)
	case len(r.Prompt) == 0 || len(r.Prompt) != int(r.Prefill.PromptTokens):
		return reqerr.New(reqerr.KindInvalidRequest, "room %v: %d prompt tokens, the prefill says %d", r.Prefill.Room, len(r.Prompt), r.Prefill.PromptTokens)
	}
	if _, err := sampling.New(samplingParams(r.Sampling, false, 0), w.cfg.Model.Config.Vocab); err != nil {
		return reqerr.New(reqerr.KindInvalidRequest, "%v", err)
	}
	vocab := int32(w.cfg.Model.Config.Vocab)
	for _, t := range r.Prompt {
		if t < 0 || t >= vocab {
			return reqerr.New(reqerr.KindInvalidRequest, "room %v: prompt token outside the vocabulary", r.Prefill.Room)
		}
	}
	return nil
}

// ensureLink dials peer once if the worker has no link to it.
func (w *PrefillWorker) ensureLink(ctx context.Context, peer transfer.PeerID, addr string) error {
	for {
		w.mu.Lock()
		if w.mu.links[peer] {
			w.mu.Unlock()
			return nil
		}
		if w.cfg.Dial == nil {
			w.mu.Unlock()
			return reqerr.New(reqerr.KindPeerLost, "no link to decode worker %d", peer)
		}
		if wait, ok := w.mu.dialing[peer]; ok {
			w.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		wait := make(chan struct{})
		w.mu.dialing[peer] = wait
		w.mu.Unlock()
		l, err := w.cfg.Dial(ctx, peer, addr)
		w.mu.Lock()
		delete(w.mu.dialing, peer)
		close(wait)
		w.mu.Unlock()
		if err != nil {
			return reqerr.New(reqerr.KindPeerLost, "decode worker %d unreachable", peer)
		}
		w.AddLink(l)
		return nil
	}
}

// Abort implements Prefiller.
func (w *PrefillWorker) Abort(m *transfer.Abort) {
	if m != nil {
		w.in.put(op{kind: opDeliver, from: w.cfg.Router, msg: m})
	}
}

// Close stops taking work; rooms in progress run until they end or ctx
// ends, when they are aborted (their writes still drain: the driver waits
// for every posted write to be reported, which the transport guarantees).
// Links are the caller's to close, after Close.
func (w *PrefillWorker) Close(ctx context.Context) error {
	w.mu.Lock()
	already := w.mu.closing
	w.mu.closing = true
	w.mu.Unlock()
	if already {
		<-w.done
		return nil
	}
	w.in.put(op{kind: opClose})
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	w.in.put(op{kind: opClose, from: 1}) // from=1: the deadline passed
	<-w.done
	return ctx.Err()
}

func (w *PrefillWorker) run() {
	defer close(w.done)
	defer w.d.ws.Close()
	defer w.cancel()
	t := time.NewTicker(w.cfg.TickInterval)
	defer t.Stop()
	closing, expired := false, false
	for {
		for {
			ops := w.in.take(w.d.ops)
			if len(ops) == 0 {
				w.d.ops = ops
				break
			}
			for i := range ops {
				if ops[i].kind == opClose {
					closing = true
					if ops[i].from == 1 && !expired {
						expired = true
						for _, q := range mapValues(w.d.rooms) {
							if w.d.stash[q.room] == q {
								delete(w.d.stash, q.room)
								w.answer(q, reqerr.New(reqerr.KindShuttingDown, "prefill worker %d is shutting down", w.cfg.Self))
							}
							w.apply(w.d.m.Abort(q.room, reqerr.KindShuttingDown, q.req.Prefill.Decode))
						}
					}
				} else {
					w.handle(&ops[i])
				}
				ops[i] = op{}
			}
			w.d.ops = ops
		}
		select {
		case <-t.C:
			w.d.now++
			w.apply(w.d.m.Tick(w.d.now))
			w.expire()
		default:
		}
		stepped := w.step()
		w.publish()
		if closing && len(w.d.stash) == 0 && w.d.m.Rooms() == 0 && w.d.m.InFlight() == 0 {
			return
		}
		if stepped {
			continue
		}
		select {
		case <-w.in.wake:
		case <-t.C:
			w.d.now++
			w.apply(w.d.m.Tick(w.d.now))
			w.expire()
		}
	}
}

func (w *PrefillWorker) handle(o *op) {
	d := &w.d
	switch o.kind {
	case opLink:
		d.links[o.link.Peer()] = o.link
	case opDeliver:
		w.apply(d.m.Step(o.from, o.msg))
		w.unstash(o.msg)
	case opLanded:
		w.apply(d.m.Landed(o.report.Room, o.report.Seq))
	case opPrefill:
		q := o.pre
		if _, dup := d.rooms[q.room]; dup {
			q.result <- reqerr.New(reqerr.KindInvalidRequest, "room %v is already in use", q.room)
			return
		}
		d.rooms[q.room] = q
		st, _ := d.m.State(q.room)
		// A tombstoned room (an abort or a reject overtook this request)
		// is stepped at once: the machine drops it and start answers, where
		// waiting for a Grant would wait for one that never comes.
		if st == transfer.PWaitPrefill || d.m.Tombstoned(q.room) || !w.fits(q) {
			w.start(q)
			return
		}
		// Wait for the decode side's Grant before the machine allocates
		// local pages: a prefill pool full of rooms the decode side has
		// not admitted (their pages held while the rooms it did admit wait
		// for prefill pages) would deadlock both pools until timeouts.
		q.deadline = d.now + w.cfg.WaitTimeout
		d.stash[q.room] = q
	case opAbort:
		if q := d.stash[o.room]; q != nil {
			delete(d.stash, o.room)
			w.answer(q, reqerr.New(reqerr.KindAborted, "room %v aborted", q.room))
		}
		w.apply(d.m.Abort(o.room, reqerr.KindAborted, o.from))
	}
}

// fits reports whether the machine could ever admit q; one that cannot is
// stepped at once so that the decode side hears the rejection before it
// reserves anything.
func (w *PrefillWorker) fits(q *preq) bool {
	n := len(q.req.Prompt)
	return n <= w.cfg.Pool.Tokens() && n+int(q.req.Prefill.MaxTokens) <= w.window
}

// start steps a request's Prefill into the machine.
func (w *PrefillWorker) start(q *preq) {
	d := &w.d
	w.apply(d.m.Step(w.cfg.Router, q.req.Prefill))
	if d.rooms[q.room] == q {
		if _, live := d.m.State(q.room); !live {
			w.answer(q, reqerr.New(reqerr.KindAborted, "room %v was closed before it started", q.room))
		}
	}
}

// unstash acts on a delivered message for the rooms waiting for their
// Grant (after the machine has seen it).
func (w *PrefillWorker) unstash(m transfer.Message) {
	d := &w.d
	if pe, ok := m.(*transfer.PeerEpoch); ok {
		if !w.cfg.Auth.Verify(pe) || pe.Epoch <= d.epochs[pe.Peer] {
			return
		}
		prev := d.epochs[pe.Peer]
		d.epochs[pe.Peer] = pe.Epoch
		if prev == 0 {
			return // a first connection, not a loss
		}
		for room, q := range d.stash {
			if q.req.Prefill.Decode == pe.Peer {
				delete(d.stash, room)
				w.answer(q, reqerr.New(reqerr.KindPeerLost, "room %v: decode peer %d reconnected", room, pe.Peer))
			}
		}
		return
	}
	if len(d.stash) == 0 {
		return
	}
	q := d.stash[m.Env().Room]
	if q == nil || !w.cfg.Auth.Verify(m) {
		return
	}
	switch m := m.(type) {
	case *transfer.Grant:
		delete(d.stash, q.room)
		w.start(q)
	case *transfer.Reject:
		// The machine has tombstoned the room; the request ends with the
		// decode side's original error.
		delete(d.stash, q.room)
		w.answer(q, m.Err())
	case *transfer.Abort:
		delete(d.stash, q.room)
		w.answer(q, reqerr.New(reqerr.KindAborted, "room %v aborted", q.room))
	}
}

// expire ends the rooms that waited for their Grant too long: tombstoned,
// and the decode side told (Drained).
func (w *PrefillWorker) expire() {
	d := &w.d
	for room, q := range d.stash {
		if d.now >= q.deadline {
			delete(d.stash, room)
			w.answer(q, reqerr.New(reqerr.KindAborted, "room %v: timed out waiting for its grant", room))
			w.apply(d.m.Abort(room, reqerr.KindAborted, q.req.Prefill.Decode))
		}
	}
}

// answer gives a request its outcome and forgets it.
func (w *PrefillWorker) answer(q *preq, err error) {
	if !q.answered {
		q.answered = true
		q.result <- err
	}
	w.stop(q)
	delete(w.d.rooms, q.room)
}

// stop takes a room out of the computing set: its pages are not touched
// again.
func (w *PrefillWorker) stop(q *preq) {
	if !q.running {
		return
	}
	q.running = false
	if i := slices.Index(w.d.run, q); i >= 0 {
		w.d.run = slices.Delete(w.d.run, i, i+1)
		if i < w.d.turn {
			w.d.turn--
		}
	}
}

func (w *PrefillWorker) apply(outs []transfer.Output) {
	d := &w.d
	for _, o := range outs {
		switch o := o.(type) {
		case transfer.Send:
			if done, ok := o.Msg.(*transfer.Done); ok {
				if q := d.rooms[done.Room]; q != nil {
					w.answer(q, nil)
				}
			}
			l := d.links[o.To]
			if l == nil {
				w.cfg.Log.Warn("no link to peer; message dropped", "peer", o.To, "type", o.Msg.Type())
				continue
			}
			if err := l.Send(w.ctx, o.Msg); err != nil {
				w.cfg.Log.Info("send failed", "peer", o.To, "type", o.Msg.Type(), "err", err)
			}
		case transfer.PostWrite:
			l := d.links[o.To]
			if l == nil {
				w.Landed(link.Report{Room: o.Msg.Room, Seq: o.Seq, Err: link.ErrPeerGone})
				continue
			}
			l.Post(w.ctx, o)
		case transfer.RunPrefill:
			q := d.rooms[o.Room]
			if q == nil {
				// A room the machine runs without a request here cannot
				// happen (Prefill carries the request); stop it.
				w.apply(d.m.Abort(o.Room, reqerr.KindInternal, 0))
				continue
			}
			q.pages = o.Pages
			q.running = true
			d.run = append(d.run, q)
		case transfer.StopPrefill:
			if q := d.rooms[o.Room]; q != nil {
				w.stop(q)
			}
		case transfer.Fail:
			if q := d.rooms[o.Room]; q != nil {
				w.answer(q, o.Err)
			}
		}
	}
}

// step runs one forward call over chunks of the computing rooms, at most
// ChunkSize tokens in all, taking rooms in turn.
func (w *PrefillWorker) step() bool {
	d := &w.d
	if len(d.run) == 0 {
		return false
	}
	ps := w.cfg.Pool.PageSize()
	budget := w.cfg.ChunkSize
	d.batch, d.inBatch = d.batch[:0], d.inBatch[:0]
	if d.turn >= len(d.run) {
		d.turn = 0
	}
	for i := 0; i < len(d.run) && budget > 0 && len(d.batch) < w.cfg.MaxRunning; i++ {
		q := d.run[(d.turn+i)%len(d.run)]
		prompt := q.req.Prompt
		n := min(len(prompt)-q.computed, budget)
		end := q.computed + n
		pages := q.pages[:ceilDiv(end, ps)]
		if !w.cfg.NoFenceCheck {
			if err := w.cfg.Pool.VerifyFences(q.room, pages); err != nil {
				d.stats.FenceFailures++
				w.cfg.Log.Error("fence mismatch in a prefill page; room aborted", "room", q.room, "err", err)
				w.apply(d.m.Abort(q.room, reqerr.KindIntegrity, q.req.Prefill.Decode))
				continue
			}
		}
		mode := model.LogitsNone
		if end == len(prompt) {
			mode = model.LogitsLast
		}
		d.batch = append(d.batch, model.Seq{Tokens: prompt[q.computed:end], Pos: q.computed, Pages: pages, Logits: mode})
		d.inBatch = append(d.inBatch, q)
		budget -= n
	}
	d.turn++
	if len(d.batch) == 0 {
		return false
	}
	if err := w.cfg.Model.Forward(d.ws, w.cfg.Pool, d.batch); err != nil {
		w.cfg.Log.Error("prefill forward refused", "err", err)
		for _, q := range d.inBatch {
			w.apply(d.m.Abort(q.room, reqerr.KindInternal, q.req.Prefill.Decode))
		}
		return true
	}
	d.stats.Forwards++
	for i, q := range d.inBatch {
		s := d.batch[i]
		d.stats.PromptTokens += uint64(len(s.Tokens))
		var first int32
		last := s.Logits == model.LogitsLast
		if last {
			smp, err := sampling.New(samplingParams(q.req.Sampling, false, 0), w.cfg.Model.Config.Vocab)
			var res sampling.Result
			if err == nil {
				res, err = smp.Sample(d.ws.Logits(i, 0))
			}
			if err != nil {
				w.cfg.Log.Error("prefill sampling failed; room aborted", "room", q.room, "err", err)
				w.apply(d.m.Abort(q.room, reqerr.KindInternal, q.req.Prefill.Decode))
				continue
			}
			first = res.Token
		}
		if !q.running || d.rooms[q.room] != q {
			continue // stopped by an output of an earlier room in this batch
		}
		q.computed += len(s.Tokens)
		if last {
			w.stop(q) // the pages are complete; the machine frees them after Done
		}
		w.apply(d.m.Computed(q.room, q.computed))
		if last && d.rooms[q.room] == q {
			w.apply(d.m.Sampled(q.room, first))
		}
	}
	return true
}

func (w *PrefillWorker) publish() {
	d := &w.d
	d.stats.Running = len(d.run)
	d.stats.Rooms = d.m.Rooms()
	d.stats.Waiting = len(d.stash)
	d.stats.InFlight = d.m.InFlight()
	d.stats.Machine = d.m.Stats()
	w.snapMu.Lock()
	w.snap = d.stats
	w.snapMu.Unlock()
}
