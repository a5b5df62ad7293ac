package transfer

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvfence/kvfence/internal/invariants"
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

// DState is a room's state on the decode side (see the package doc).
type DState uint8

const (
	DQueued      DState = iota + 1 // admitted, waiting for free pages; nothing reserved
	DGranted                       // pages allocated, window open, Grant sent; waiting for Done
	DActive                        // transfer verified; the engine decodes; ends with Finish
	DDraining                      // aborted after the grant; pages deferred until Drained
	DQuarantined                   // drain timeout or integrity failure; pages held until PeerEpoch
)

var dstateNames = [...]string{"", "queued", "granted", "active", "draining", "quarantined"}

func (s DState) String() string {
	if int(s) < len(dstateNames) && s > 0 {
		return dstateNames[s]
	}
	return fmt.Sprintf("dstate(%d)", uint8(s))
}

// DecodeConfig configures a decode machine.
type DecodeConfig struct {
	Self    PeerID       // this worker's id (Abort.Decode)
	Pool    *kvpool.Pool // the decode pool; the machine allocates and releases prompt pages
	Windows Windows      // the receiver's window table
	Auth    *Auth
	Protections
	// ContextWindow is the most tokens a request may use (prompt +
	// max_tokens); admission also limits requests to the pool's tokens.
	ContextWindow int
	// MaxRooms bounds live rooms (every state, quarantined included: a
	// prefill peer that never reconnects keeps its quarantined rooms until
	// it does); an Open beyond it is rejected as overloaded. Default 1024.
	MaxRooms int
	// MaxQueue bounds rooms waiting for pages. Default 256.
	MaxQueue int
	// TransferTimeout is the number of ticks from Grant to Done before the
	// machine aborts the transfer itself; 0 disables it.
	TransferTimeout int64
	// DrainTimeout is the number of ticks an aborted room waits for
	// Drained before its pages go to quarantine. Default 100.
	DrainTimeout int64
	// ClosedRooms bounds the table of closed rooms used to drop replays.
	// Default 4096.
	ClosedRooms int
	// KeyBase is added to a counter to make window keys; give each
	// incarnation of a worker a different base (e.g. random) so that keys
	// are never reused across restarts.
	KeyBase uint64
}

// DecodeStats counts what the decode machine did. Counters only grow.
type DecodeStats struct {
	Dropped            [numDropReasons]uint64 // inputs dropped, by reason
	Admitted           uint64                 // Opens that passed admission
	Rejected           uint64                 // Opens rejected at admission (no page reserved)
	Granted            uint64
	Started            uint64 // transfers verified
	Failed             uint64 // Fail outputs
	IntegrityFailures  uint64 // transfers that failed verification
	DrainedReleases    uint64 // deferred releases ended by Drained (outcome drained)
	TimeoutQuarantines uint64 // deferred releases ended by the drain timeout (outcome timeout)
	EpochReleases      uint64 // rooms whose pages were released by a PeerEpoch
	ImmediateReleases  uint64 // aborted rooms freed at once (no deferred release)
}

type droom struct {
	id        RoomID
	state     DState
	prefill   PeerID
	prompt    int
	maxTokens int
	need      int // pages to grant
	pages     []int32
	epochs    []uint64
	key       WindowKey
	deadline  int64  // transfer or drain timeout
	qEpoch    uint64 // prefill peer's epoch when quarantined
	seen      uint16 // message types accepted
}

// DecodeMachine is the decode side of the transfer protocol. It is not safe for
// concurrent use: one driver goroutine makes every call.
type DecodeMachine struct {
	cfg     DecodeConfig
	now     int64
	rooms   map[RoomID]*droom
	order   []*droom // live rooms by creation: deterministic iteration
	queue   []*droom
	closed  *roomSet
	epochs  map[PeerID]uint64
	nextKey uint64
	stats   DecodeStats
	out     []Output
}

// NewDecodeMachine returns a decode machine.
func NewDecodeMachine(cfg DecodeConfig) (*DecodeMachine, error) {
	if cfg.Pool == nil || cfg.Windows == nil || cfg.Auth == nil {
		return nil, errors.New("transfer: decode machine needs Pool, Windows and Auth")
	}
	if cfg.ContextWindow <= 0 {
		return nil, errors.New("transfer: decode machine needs a positive ContextWindow")
	}
	if cfg.MaxRooms <= 0 {
		cfg.MaxRooms = 1024
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 256
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 100
	}
	if cfg.ClosedRooms <= 0 {
		cfg.ClosedRooms = 4096
	}
	return &DecodeMachine{
		cfg:    cfg,
		rooms:  make(map[RoomID]*droom),
		closed: newRoomSet(cfg.ClosedRooms),
		epochs: make(map[PeerID]uint64),
	}, nil
}

// Stats returns the counters.
func (d *DecodeMachine) Stats() DecodeStats { return d.stats }

// State returns a live room's state (false for unknown or closed rooms).
func (d *DecodeMachine) State(room RoomID) (DState, bool) {
	if r := d.rooms[room]; r != nil {
		return r.state, true
	}
	return 0, false
}

// Rooms returns the number of live rooms.
func (d *DecodeMachine) Rooms() int { return len(d.rooms) }

// Step delivers a message from peer from (the transport's idea of the
// sender). Messages whose MAC does not verify, replays and messages for
// closed rooms are dropped and counted.
func (d *DecodeMachine) Step(from PeerID, m Message) []Output {
	d.out = nil
	if !d.cfg.Auth.Verify(m) {
		d.drop(from, m, DropBadMAC)
		return d.flush()
	}
	switch m := m.(type) {
	case *Open:
		d.open(from, m)
	case *Done:
		d.done(from, m)
	case *Reject:
		d.reject(from, m)
	case *Abort:
		d.abort(from, m)
	case *Drained:
		d.drained(from, m)
	case *PeerEpoch:
		d.peerEpoch(from, m)
	default:
		d.drop(from, m, DropUnexpected)
	}
	d.admitQueued()
	return d.flush()
}

// Tick advances the machine's clock to now (monotonic, in ticks) and fires
// the transfer and drain timeouts that are due.
func (d *DecodeMachine) Tick(now int64) []Output {
	d.out = nil
	if now > d.now {
		d.now = now
	}
	for _, r := range slices.Clone(d.order) {
		switch {
		case r.state == DGranted && d.cfg.TransferTimeout > 0 && d.now >= r.deadline:
			d.abortGranted(r, reqerr.KindAborted, reqerr.New(reqerr.KindAborted, "room %v: transfer timeout", r.id))
		case r.state == DDraining && d.now >= r.deadline:
			d.cfg.Pool.Quarantine(r.id, r.pages)
			r.state = DQuarantined
			r.qEpoch = d.epochs[r.prefill]
			d.stats.TimeoutQuarantines++
			d.emit(PagesQuarantined{Room: r.id, Pages: slices.Clone(r.pages), Reason: "drain timeout"})
		}
	}
	d.admitQueued()
	return d.flush()
}

// Finish ends an active room: the engine is done with the sequence and its
// prompt pages go back to the free list. Finishing a room that is not
// active is a programmer error.
func (d *DecodeMachine) Finish(room RoomID) []Output {
	d.out = nil
	r := d.rooms[room]
	invariants.Assert(r != nil && r.state == DActive, "transfer: Finish of a room that is not active")
	d.cfg.Pool.Free(r.id, r.pages)
	d.emit(PagesReleased{Room: r.id, Pages: slices.Clone(r.pages), Outcome: OutcomeFinished})
	d.close(r)
	d.admitQueued()
	return d.flush()
}

// GrantUnsent reports that the transport refused room's Grant without
// transmitting it (link.Link.Send returned an error: no connection, link
// closed, or the driver stopped waiting for queue room). The prefill side
// never learned the pages, so no write for them exists or can ever be
// posted: the window is revoked, the pages are free at once (outcome
// unsent), and a request still waiting for its transfer fails with
// peer_lost. Without this report an aborted room would wait for a Drained
// from a peer that never heard of it, and with a dead peer its pages would
// stay in quarantine for good. The driver makes this call after acting on
// all outputs of the call that produced the Grant. Reports for a room that
// is neither granted nor draining (it ended meanwhile) are ignored.
func (d *DecodeMachine) GrantUnsent(room RoomID) []Output {
	d.out = nil
	r := d.rooms[room]
	if r == nil {
		return nil
	}
	switch r.state {
	case DGranted:
		d.fail(r.id, reqerr.New(reqerr.KindPeerLost, "room %v: grant not sent: no connection to prefill peer %d", r.id, r.prefill))
	case DDraining:
		// Already failed by its abort; only the pages wait.
	default:
		return nil
	}
	d.revoke(r)
	d.releaseAll(r, OutcomeUnsent)
	d.admitQueued()
	return d.flush()
}

// Abort aborts a room locally (client gone, shutdown): the same as an
// Abort message from the router.
func (d *DecodeMachine) Abort(room RoomID, reason reqerr.Kind) []Output {
	m := &Abort{Envelope: Envelope{Room: room}, Reason: reason, Decode: d.cfg.Self}
	d.cfg.Auth.Sign(m)
	return d.Step(d.cfg.Self, m)
}

func (d *DecodeMachine) open(from PeerID, m *Open) {
	if _, ok := d.rooms[m.Room]; ok {
		d.drop(from, m, DropReplayed)
		return
	}
	if seen, ok := d.closed.has(m.Room); ok {
		d.dropClosed(from, m, seen)
		return
	}
	prompt, maxTokens := int(m.PromptTokens), int(m.MaxTokens)
	r := &droom{id: m.Room, state: DQueued, prefill: m.Prefill, prompt: prompt, maxTokens: maxTokens, seen: bit(TypeOpen)}
	ps := d.cfg.Pool.PageSize()
	r.need = (prompt + ps - 1) / ps
	limit := min(d.cfg.ContextWindow, d.cfg.Pool.Tokens())
	// The request's own limits come first, so that a request that can
	// never fit gets its original error even when the worker is busy.
	switch {
	case d.cfg.NoAdmissionBeforeReservation:
		// Unsafe: reserve for the whole prompt whatever it is, as far as
		// the pool goes (the "rejected but alive" decode side).
		r.need = min(r.need, d.cfg.Pool.Total())
	case prompt == 0:
		d.rejectOpen(r, &Reject{Kind: reqerr.KindInvalidRequest, Prompt: m.PromptTokens, MaxTokens: m.MaxTokens})
		return
	case prompt+maxTokens > limit:
		d.rejectOpen(r, &Reject{Kind: reqerr.KindContextLength, Prompt: m.PromptTokens, MaxTokens: m.MaxTokens, Limit: uint32(limit)})
		return
	}
	if len(d.rooms) >= d.cfg.MaxRooms || len(d.queue) >= d.cfg.MaxQueue {
		d.rejectOpen(r, &Reject{Kind: reqerr.KindOverloaded})
		return
	}
	d.stats.Admitted++
	d.rooms[r.id] = r
	d.order = append(d.order, r)
	d.queue = append(d.queue, r)
}

// rejectOpen refuses an Open before anything is reserved (I3): the
// request fails with the original error, the prefill side is told, and
// the room is remembered only as closed.
func (d *DecodeMachine) rejectOpen(r *droom, rj *Reject) {
	d.stats.Rejected++
	rj.Room = r.id
	d.cfg.Auth.Sign(rj)
	d.fail(r.id, rj.Err())
	d.emit(Send{To: r.prefill, Msg: rj})
	d.closed.add(r.id, r.seen)
}

// admitQueued grants queued rooms, oldest first, while pages are free.
func (d *DecodeMachine) admitQueued() {
	for len(d.queue) > 0 {
		r := d.queue[0]
		pages, err := d.cfg.Pool.Alloc(r.id, r.need, nil)
		if err != nil {
			return // head of line waits; pages come back on release
		}
		d.queue = d.queue[1:]
		r.pages = pages
		r.epochs = make([]uint64, len(pages))
		for i, pg := range pages {
			f := d.cfg.Pool.Expected(pg)
			invariants.Assert(f.Room == r.id, "transfer: allocated page carries another room's fence")
			r.epochs[i] = f.Epoch
		}
		d.nextKey++
		r.key = WindowKey(d.cfg.KeyBase + d.nextKey)
		d.cfg.Windows.Open(r.key, r.id, pages)
		d.emit(OpenWindow{Room: r.id, Key: r.key, Pages: slices.Clone(pages)})
		r.state = DGranted
		r.deadline = d.now + d.cfg.TransferTimeout
		d.stats.Granted++
		g := &Grant{Envelope: Envelope{Room: r.id}, Key: r.key, PromptTokens: uint32(r.prompt),
			PageCount: uint32(r.need), Pages: slices.Clone(pages), Epochs: slices.Clone(r.epochs)}
		d.cfg.Auth.Sign(g)
		d.emit(Send{To: r.prefill, Msg: g})
	}
}

func (d *DecodeMachine) done(from PeerID, m *Done) {
	r := d.live(from, m, true)
	if r == nil {
		return
	}
	if r.state != DGranted {
		d.drop(from, m, DropWrongState)
		return
	}
	r.seen |= bit(TypeDone)
	if cause := d.verify(r, m); cause != nil {
		d.stats.IntegrityFailures++
		d.revoke(r)
		d.cfg.Pool.Quarantine(r.id, r.pages)
		r.state = DQuarantined
		r.qEpoch = d.epochs[r.prefill]
		d.emit(PagesQuarantined{Room: r.id, Pages: slices.Clone(r.pages), Reason: "integrity"})
		d.fail(r.id, reqerr.New(reqerr.KindIntegrity, "room %v: %v", r.id, cause))
		return
	}
	d.revoke(r)
	r.state = DActive
	d.stats.Started++
	d.emit(StartDecode{Room: r.id, Pages: slices.Clone(r.pages), PromptTokens: r.prompt, FirstToken: m.FirstToken})
}

// verify is the I4 check on Done. It fails closed: a page that cannot be
// shown to hold this room's data under its fence fails the transfer.
func (d *DecodeMachine) verify(r *droom, m *Done) error {
	pool := d.cfg.Pool
	n := len(r.pages)
	if !d.cfg.NoPageCountAgreement {
		if int(m.Pages) != n || int(m.Tokens) != r.prompt || len(m.Checksums) != n {
			return fmt.Errorf("done reports %d pages, %d tokens, %d checksums; agreed %d pages, %d tokens",
				m.Pages, m.Tokens, len(m.Checksums), n, r.prompt)
		}
	} else {
		n = min(int(m.Pages), n) // unsafe: trust the writer's count
	}
	pages := r.pages[:n]
	if !d.cfg.NoFenceCheck {
		if err := pool.VerifyFences(r.id, pages); err != nil {
			return err
		}
	}
	if !d.cfg.NoPageCountAgreement {
		ps := pool.PageSize()
		for i, pg := range pages {
			h, err := pool.Header(pg)
			if err != nil {
				return fmt.Errorf("page %d: %w", pg, err)
			}
			if want := min(ps, r.prompt-i*ps); int(h.Tokens) != want {
				return fmt.Errorf("page %d holds %d tokens, want %d", pg, h.Tokens, want)
			}
		}
	}
	if !d.cfg.NoChecksum {
		for i, pg := range pages {
			if err := pool.VerifyChecksum(pg); err != nil {
				return err
			}
			if i >= len(m.Checksums) {
				return fmt.Errorf("page %d: done carries no checksum", pg)
			}
			if h, _ := pool.Header(pg); h.Checksum != m.Checksums[i] {
				return fmt.Errorf("page %d: checksum %#08x, done says %#08x", pg, h.Checksum, m.Checksums[i])
			}
		}
	}
	return nil
}

func (d *DecodeMachine) reject(from PeerID, m *Reject) {
	if _, ok := d.rooms[m.Room]; !ok {
		if _, closed := d.closed.has(m.Room); !closed {
			// The prefill side refused before the Open arrived here. The
			// request ends now, with the prefill side's original error
			// (I3), and the room is remembered as closed so that the Open,
			// when it comes, reserves nothing.
			d.closed.add(m.Room, bit(TypeReject))
			d.fail(m.Room, m.Err())
			return
		}
	}
	r := d.live(from, m, true)
	if r == nil {
		return
	}
	switch r.state {
	case DQueued:
		r.seen |= bit(TypeReject)
		d.unqueue(r)
		d.fail(r.id, m.Err())
		d.close(r)
	case DGranted, DDraining:
		// The prefill side rejected before writing and tombstoned the
		// room: nothing can land, the pages are free at once.
		r.seen |= bit(TypeReject)
		if r.state == DGranted {
			d.fail(r.id, m.Err())
		}
		d.revoke(r)
		d.releaseAll(r, OutcomeRejected)
	default:
		d.drop(from, m, DropWrongState)
	}
}

func (d *DecodeMachine) abort(from PeerID, m *Abort) {
	reason := m.Reason
	if reason == reqerr.KindUnknown {
		reason = reqerr.KindAborted
	}
	err := reqerr.New(reason, "room %v aborted", m.Room)
	if _, ok := d.rooms[m.Room]; !ok {
		if seen, ok := d.closed.has(m.Room); ok {
			d.dropClosed(from, m, seen)
			return
		}
		// The abort overtook the Open: remember the room as closed so the
		// Open, when it comes, reserves nothing.
		d.closed.add(m.Room, bit(TypeAbort))
		d.drop(from, m, DropUnknownRoom)
		return
	}
	r := d.live(from, m, false)
	if r == nil {
		return
	}
	switch r.state {
	case DQueued:
		r.seen |= bit(TypeAbort)
		d.unqueue(r)
		d.fail(r.id, err)
		d.sendAbort(r, reason)
		d.close(r)
	case DGranted:
		r.seen |= bit(TypeAbort)
		d.abortGranted(r, reason, err)
	case DActive:
		// The engine owns the sequence: it stops it and calls Finish.
		r.seen |= bit(TypeAbort)
		d.fail(r.id, err)
	default:
		d.drop(from, m, DropWrongState)
	}
}

// abortGranted ends a granted room early: revoke the window, then hold
// the pages until the prefill side drains (or free them at once when
// deferred release is off).
func (d *DecodeMachine) abortGranted(r *droom, reason reqerr.Kind, err error) {
	d.fail(r.id, err)
	d.sendAbort(r, reason)
	d.revoke(r)
	if d.cfg.NoDeferredRelease {
		d.stats.ImmediateReleases++
		d.releaseAll(r, OutcomeImmediate)
		return
	}
	d.cfg.Pool.Defer(r.id, r.pages)
	r.state = DDraining
	r.deadline = d.now + d.cfg.DrainTimeout
	d.emit(PagesDeferred{Room: r.id, Pages: slices.Clone(r.pages)})
}

func (d *DecodeMachine) drained(from PeerID, m *Drained) {
	r := d.live(from, m, true)
	if r == nil {
		return
	}
	switch r.state {
	case DDraining:
		r.seen |= bit(TypeDrained)
		d.stats.DrainedReleases++
		d.cfg.Pool.Release(r.id, r.pages)
		d.emit(PagesReleased{Room: r.id, Pages: slices.Clone(r.pages), Outcome: OutcomeDrained})
		d.close(r)
	case DQueued, DGranted:
		// The prefill side was aborted (by the router) before this side
		// heard of it. Drained is its promise that nothing is in flight
		// and nothing will be: end the room and free at once.
		r.seen |= bit(TypeDrained)
		d.fail(r.id, reqerr.New(reqerr.KindAborted, "room %v aborted", r.id))
		if r.state == DQueued {
			d.unqueue(r)
			d.close(r)
			return
		}
		d.revoke(r)
		d.stats.DrainedReleases++
		d.releaseAll(r, OutcomeDrained)
	default:
		// Quarantined pages wait for the connection epoch (DESIGN §4).
		d.drop(from, m, DropWrongState)
	}
}

func (d *DecodeMachine) peerEpoch(from PeerID, m *PeerEpoch) {
	if m.Epoch <= d.epochs[m.Peer] {
		d.drop(from, m, DropStaleEpoch)
		return
	}
	d.epochs[m.Peer] = m.Epoch
	for _, r := range slices.Clone(d.order) {
		if r.prefill != m.Peer {
			continue
		}
		lost := reqerr.New(reqerr.KindPeerLost, "room %v: prefill peer %d reconnected", r.id, m.Peer)
		switch r.state {
		case DQueued:
			d.unqueue(r)
			d.fail(r.id, lost)
			d.close(r)
		case DGranted:
			d.fail(r.id, lost)
			d.revoke(r)
			d.stats.EpochReleases++
			d.releaseAll(r, OutcomeEpoch)
		case DDraining:
			d.stats.EpochReleases++
			d.releaseAll(r, OutcomeEpoch)
		case DQuarantined:
			if r.qEpoch < m.Epoch {
				d.stats.EpochReleases++
				d.releaseAll(r, OutcomeEpoch)
			}
		}
	}
}

// releaseAll frees every page of r, whatever its state, and closes r.
func (d *DecodeMachine) releaseAll(r *droom, o Outcome) {
	switch r.state {
	case DGranted:
		d.cfg.Pool.Free(r.id, r.pages)
	case DDraining, DQuarantined:
		d.cfg.Pool.Release(r.id, r.pages)
	default:
		invariants.Assert(false, "transfer: releaseAll in state "+r.state.String())
	}
	d.emit(PagesReleased{Room: r.id, Pages: slices.Clone(r.pages), Outcome: o})
	d.close(r)
}

// revoke closes r's window (a barrier: when it returns no write for r can
// land), unless revocation is switched off.
func (d *DecodeMachine) revoke(r *droom) {
	if d.cfg.NoWindowRevocation || r.key == 0 {
		return
	}
	d.cfg.Windows.Revoke(r.key)
	d.emit(RevokeWindow{Room: r.id, Key: r.key})
	r.key = 0
}

func (d *DecodeMachine) sendAbort(r *droom, reason reqerr.Kind) {
	a := &Abort{Envelope: Envelope{Room: r.id}, Reason: reason, Decode: d.cfg.Self}
	d.cfg.Auth.Sign(a)
	d.emit(Send{To: r.prefill, Msg: a})
}

func (d *DecodeMachine) unqueue(r *droom) {
	if i := slices.Index(d.queue, r); i >= 0 {
		d.queue = slices.Delete(d.queue, i, i+1)
	}
}

func (d *DecodeMachine) close(r *droom) {
	delete(d.rooms, r.id)
	if i := slices.Index(d.order, r); i >= 0 {
		d.order = slices.Delete(d.order, i, i+1)
	}
	d.closed.add(r.id, r.seen)
}

// live returns the live room m is for, or drops m (counted) and returns
// nil. With checkPeer, m must come from the room's prefill peer.
func (d *DecodeMachine) live(from PeerID, m Message, checkPeer bool) *droom {
	r := d.rooms[m.Env().Room]
	if r == nil {
		if seen, ok := d.closed.has(m.Env().Room); ok {
			d.dropClosed(from, m, seen)
		} else {
			d.drop(from, m, DropUnknownRoom)
		}
		return nil
	}
	if checkPeer && from != r.prefill {
		d.drop(from, m, DropWrongPeer)
		return nil
	}
	if r.seen&bit(m.Type()) != 0 {
		d.drop(from, m, DropReplayed)
		return nil
	}
	return r
}

func (d *DecodeMachine) dropClosed(from PeerID, m Message, seen uint16) {
	if seen&bit(m.Type()) != 0 {
		d.drop(from, m, DropReplayed)
		return
	}
	d.closed.mark(m.Env().Room, bit(m.Type()))
	d.drop(from, m, DropLate)
}

func (d *DecodeMachine) drop(from PeerID, m Message, why DropReason) {
	d.stats.Dropped[why]++
	d.emit(Dropped{From: from, Type: m.Type(), Room: m.Env().Room, Reason: why})
}

func (d *DecodeMachine) fail(room RoomID, err error) {
	d.stats.Failed++
	d.emit(Fail{Room: room, Err: err})
}

func (d *DecodeMachine) emit(o Output) { d.out = append(d.out, o) }

func (d *DecodeMachine) flush() []Output {
	out := d.out
	d.out = nil
	return out
}
