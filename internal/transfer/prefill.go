package transfer

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvfence/kvfence/internal/invariants"
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

// PState is a room's state on the prefill side (see the package doc).
type PState uint8

const (
	PQueued      PState = iota + 1 // Prefill admitted, waiting for local pages
	PWaitGrant                     // computing into local pages; no Grant yet
	PWaitPrefill                   // Grant arrived before Prefill; nothing allocated
	PRunning                       // Prefill and Grant: pages are written as they complete
	PAborting                      // aborted with writes in flight; Drained when they land
)

var pstateNames = [...]string{"", "queued", "wait-grant", "wait-prefill", "running", "aborting"}

func (s PState) String() string {
	if int(s) < len(pstateNames) && s > 0 {
		return pstateNames[s]
	}
	return fmt.Sprintf("pstate(%d)", uint8(s))
}

// PrefillConfig configures a prefill machine.
type PrefillConfig struct {
	Self PeerID
	Pool *kvpool.Pool // the prefill pool: it must hold a whole prompt
	Auth *Auth
	Protections
	// ContextWindow is the most tokens a request may use.
	ContextWindow int
	// MaxRooms bounds live rooms; Default 1024.
	MaxRooms int
	// MaxQueue bounds rooms waiting for local pages. Default 256.
	MaxQueue int
	// WaitTimeout is the number of ticks a room may wait for its Grant,
	// its Prefill or local pages before it is dropped (tombstoned, and the
	// decode side told with a Reject); 0 disables it.
	WaitTimeout int64
	// Tombstones bounds the tombstone table. It must exceed the rooms
	// closed within the longest message delay: a Grant for a room whose
	// tombstone was evicted is treated as a new room. Default 4096.
	Tombstones int
}

// PrefillStats counts what the prefill machine did. Counters only grow.
type PrefillStats struct {
	Dropped      [numDropReasons]uint64
	Admitted     uint64
	Rejected     uint64 // Prefills refused at admission
	Placeholders uint64 // unsafe: refused Prefills turned into one-token placeholders
	WritesPosted uint64
	Done         uint64
	Drained      uint64 // Drained messages sent
	Failed       uint64
}

type proom struct {
	id          RoomID
	state       PState
	decode      PeerID
	havePrefill bool
	prompt      int
	maxTokens   int
	placeholder bool
	local       []int32
	grant       *Grant
	computed    int
	sampled     bool
	first       int32
	posted      int
	inflight    int
	sums        []uint32
	deadline    int64
	seen        uint16
	// drainOwed (unsafe, no tombstones): an Abort came while writes were
	// in flight; send Drained when they land, and carry on.
	drainOwed bool
	// peerLost: the decode peer's epoch changed while writes were in
	// flight; the room is failed and waits only for those writes, and
	// owes the decode side no Drained (its room ended with the epoch).
	peerLost bool
}

// PrefillMachine is the prefill side of the transfer protocol. It is not
// safe for concurrent use: one driver goroutine makes every call.
type PrefillMachine struct {
	cfg      PrefillConfig
	now      int64
	rooms    map[RoomID]*proom
	order    []*proom
	queue    []*proom
	tombs    *roomSet
	epochs   map[PeerID]uint64
	seq      uint64
	inflight map[uint64]*proom // posted writes not yet Landed
	stats    PrefillStats
	out      []Output
}

// NewPrefillMachine returns a prefill machine.
func NewPrefillMachine(cfg PrefillConfig) (*PrefillMachine, error) {
	if cfg.Pool == nil || cfg.Auth == nil {
		return nil, errors.New("transfer: prefill machine needs Pool and Auth")
	}
	if cfg.ContextWindow <= 0 {
		return nil, errors.New("transfer: prefill machine needs a positive ContextWindow")
	}
	if cfg.MaxRooms <= 0 {
		cfg.MaxRooms = 1024
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 256
	}
	if cfg.Tombstones <= 0 {
		cfg.Tombstones = 4096
	}
	return &PrefillMachine{
		cfg:      cfg,
		rooms:    make(map[RoomID]*proom),
		tombs:    newRoomSet(cfg.Tombstones),
		epochs:   make(map[PeerID]uint64),
		inflight: make(map[uint64]*proom),
	}, nil
}

// Stats returns the counters.
func (p *PrefillMachine) Stats() PrefillStats { return p.stats }

// State returns a live room's state (false for unknown or tombstoned).
func (p *PrefillMachine) State(room RoomID) (PState, bool) {
	if r := p.rooms[room]; r != nil {
		return r.state, true
	}
	return 0, false
}

// Tombstoned reports whether room is in the tombstone table.
func (p *PrefillMachine) Tombstoned(room RoomID) bool {
	_, ok := p.tombs.has(room)
	return ok
}

// Rooms returns the number of live rooms.
func (p *PrefillMachine) Rooms() int { return len(p.rooms) }

// InFlight returns the number of posted writes not yet reported landed.
func (p *PrefillMachine) InFlight() int { return len(p.inflight) }

// Step delivers a message from peer from.
func (p *PrefillMachine) Step(from PeerID, m Message) []Output {
	p.out = nil
	if !p.cfg.Auth.Verify(m) {
		p.drop(from, m, DropBadMAC)
		return p.flush()
	}
	switch m := m.(type) {
	case *Prefill:
		p.prefill(from, m)
	case *Grant:
		p.grant(from, m)
	case *Reject:
		p.reject(from, m)
	case *Abort:
		p.abort(from, m)
	case *PeerEpoch:
		p.peerEpoch(from, m)
	default:
		p.drop(from, m, DropUnexpected)
	}
	p.admitQueued()
	return p.flush()
}

// Tick advances the clock and fires the wait timeouts that are due.
func (p *PrefillMachine) Tick(now int64) []Output {
	p.out = nil
	if now > p.now {
		p.now = now
	}
	if p.cfg.WaitTimeout > 0 {
		for _, r := range slices.Clone(p.order) {
			switch r.state {
			case PQueued, PWaitGrant, PWaitPrefill:
				if p.now >= r.deadline {
					p.refuse(r, reqerr.New(reqerr.KindAborted, "room %v: timed out waiting for %s", r.id, waitingFor(r.state)),
						&Reject{Kind: reqerr.KindAborted})
				}
			}
		}
	}
	p.admitQueued()
	return p.flush()
}

func waitingFor(s PState) string {
	switch s {
	case PQueued:
		return "prefill pages"
	case PWaitGrant:
		return "its grant"
	}
	return "its prefill request"
}

// Computed reports that prompt positions [0, tokens) of room have their KV
// in the local pages. Pages complete by it are posted at once when the
// grant is known. Reports for rooms that have ended are ignored.
func (p *PrefillMachine) Computed(room RoomID, tokens int) []Output {
	p.out = nil
	r := p.rooms[room]
	if r == nil || (r.state != PWaitGrant && r.state != PRunning) {
		return nil
	}
	invariants.Assert(tokens >= r.computed && tokens <= r.prompt, "transfer: Computed out of order or beyond the prompt")
	r.computed = tokens
	p.post(r)
	return p.flush()
}

// Sampled reports the token sampled after the whole prompt was computed.
func (p *PrefillMachine) Sampled(room RoomID, first int32) []Output {
	p.out = nil
	r := p.rooms[room]
	if r == nil || (r.state != PWaitGrant && r.state != PRunning) {
		return nil
	}
	invariants.Assert(r.computed == r.prompt, "transfer: Sampled before the prompt was computed")
	r.sampled, r.first = true, first
	p.maybeDone(r)
	return p.flush()
}

// Landed reports that the transport has finished with posted write seq of
// room (applied, refused by a revoked window, or lost with its
// connection). Each PostWrite is reported exactly once.
func (p *PrefillMachine) Landed(room RoomID, seq uint64) []Output {
	p.out = nil
	r, ok := p.inflight[seq]
	invariants.Assert(ok, "transfer: Landed for a write not in flight")
	invariants.Assert(r.id == room, "transfer: Landed with the wrong room")
	delete(p.inflight, seq)
	r.inflight--
	if p.rooms[room] != r {
		return nil // the room ended (peer epoch); nothing waits for this
	}
	switch {
	case r.state == PAborting && r.inflight == 0:
		p.finishAbort(r)
	case r.drainOwed && r.inflight == 0:
		r.drainOwed = false
		p.sendDrained(r.id, r.decode)
		p.maybeDone(r)
	case r.state == PRunning:
		p.maybeDone(r)
	}
	p.admitQueued()
	return p.flush()
}

// Abort aborts a room locally; decode names its decode peer if the room is
// unknown here.
func (p *PrefillMachine) Abort(room RoomID, reason reqerr.Kind, decode PeerID) []Output {
	m := &Abort{Envelope: Envelope{Room: room}, Reason: reason, Decode: decode}
	p.cfg.Auth.Sign(m)
	return p.Step(p.cfg.Self, m)
}

func (p *PrefillMachine) prefill(from PeerID, m *Prefill) {
	if seen, ok := p.tombs.has(m.Room); ok {
		p.dropTomb(from, m, seen)
		return
	}
	r := p.rooms[m.Room]
	switch {
	case r != nil && r.havePrefill:
		p.drop(from, m, DropReplayed)
		return
	case r != nil && r.decode != m.Decode:
		p.drop(from, m, DropWrongPeer)
		return
	}
	rj := p.admission(int(m.PromptTokens), int(m.MaxTokens))
	if r == nil && len(p.rooms) >= p.cfg.MaxRooms {
		// No room for the room; the request's own limits still come first.
		if rj == nil {
			rj = &Reject{Kind: reqerr.KindOverloaded}
		}
		p.stats.Rejected++
		rj.Room = m.Room
		p.cfg.Auth.Sign(rj)
		p.fail(m.Room, rj.Err())
		p.emit(Send{To: m.Decode, Msg: rj})
		if !p.cfg.NoTombstones {
			p.tombs.add(m.Room, bit(TypePrefill))
		}
		return
	}
	if r == nil {
		r = p.add(m.Room, m.Decode)
	}
	r.seen |= bit(TypePrefill)
	r.havePrefill = true
	r.prompt, r.maxTokens = int(m.PromptTokens), int(m.MaxTokens)
	if rj != nil {
		if !p.cfg.NoAdmissionBeforeReservation {
			p.stats.Rejected++
			p.refuse(r, rj.Err(), rj)
			return
		}
		// Unsafe: "rejected" becomes a one-token placeholder that flows
		// through the normal path and reports a complete transfer.
		p.stats.Placeholders++
		r.placeholder = true
		r.prompt = 1
	}
	if r.grant != nil && !p.agree(r) {
		p.refuse(r, reqerr.New(reqerr.KindIntegrity, "room %v: grant disagrees with the prompt", r.id), &Reject{Kind: reqerr.KindIntegrity})
		return
	}
	if len(p.queue) >= p.cfg.MaxQueue {
		p.refuse(r, reqerr.New(reqerr.KindOverloaded, "room %v: prefill queue full", r.id), &Reject{Kind: reqerr.KindOverloaded})
		return
	}
	p.stats.Admitted++
	r.state = PQueued
	r.deadline = p.now + p.cfg.WaitTimeout
	p.queue = append(p.queue, r)
}

// admission returns the Reject for a prompt this worker can never serve:
// longer than the prefill pool, or with max_tokens beyond the window.
func (p *PrefillMachine) admission(prompt, maxTokens int) *Reject {
	poolTokens := p.cfg.Pool.Tokens()
	switch {
	case prompt == 0:
		return &Reject{Kind: reqerr.KindInvalidRequest}
	case prompt+maxTokens > p.cfg.ContextWindow:
		return &Reject{Kind: reqerr.KindContextLength, Prompt: uint32(prompt), MaxTokens: uint32(maxTokens), Limit: uint32(p.cfg.ContextWindow)}
	case prompt > poolTokens:
		return &Reject{Kind: reqerr.KindContextLength, Prompt: uint32(prompt), MaxTokens: uint32(maxTokens), Limit: uint32(poolTokens)}
	}
	return nil
}

// agree is page-count agreement: the grant must be for exactly this
// prompt, in exactly the pages this side will write.
func (p *PrefillMachine) agree(r *proom) bool {
	if p.cfg.NoPageCountAgreement {
		return true
	}
	g := r.grant
	need := p.pagesFor(r.prompt)
	return int(g.PromptTokens) == r.prompt && int(g.PageCount) == need && len(g.Pages) == need && len(g.Epochs) == need
}

func (p *PrefillMachine) pagesFor(tokens int) int {
	ps := p.cfg.Pool.PageSize()
	return (tokens + ps - 1) / ps
}

func (p *PrefillMachine) admitQueued() {
	for len(p.queue) > 0 {
		r := p.queue[0]
		local, err := p.cfg.Pool.Alloc(r.id, p.pagesFor(r.prompt), nil)
		if err != nil {
			return
		}
		p.queue = p.queue[1:]
		r.local = local
		for i, pg := range local {
			p.cfg.Pool.Stamp(pg, uint32(i), 0)
		}
		p.emit(RunPrefill{Room: r.id, Pages: slices.Clone(local), PromptTokens: r.prompt})
		if r.grant != nil {
			r.state = PRunning
		} else {
			r.state = PWaitGrant
			r.deadline = p.now + p.cfg.WaitTimeout
		}
	}
}

func (p *PrefillMachine) grant(from PeerID, m *Grant) {
	if seen, ok := p.tombs.has(m.Room); ok {
		// The tombstone guarantee: a grant for a room this side has
		// aborted or finished never leads to a write.
		p.dropTomb(from, m, seen)
		return
	}
	r := p.rooms[m.Room]
	switch {
	case r == nil && len(p.rooms) >= p.cfg.MaxRooms:
		p.drop(from, m, DropOverflow)
		return
	case r == nil:
		r = p.add(m.Room, from)
		r.state = PWaitPrefill
		r.deadline = p.now + p.cfg.WaitTimeout
	case r.grant != nil:
		p.drop(from, m, DropReplayed)
		return
	case from != r.decode:
		p.drop(from, m, DropWrongPeer)
		return
	}
	if len(m.Pages) != len(m.Epochs) {
		p.drop(from, m, DropUnexpected)
		return
	}
	r.seen |= bit(TypeGrant)
	r.grant = m
	if !r.havePrefill {
		return
	}
	if !p.agree(r) {
		p.refuse(r, reqerr.New(reqerr.KindIntegrity, "room %v: grant disagrees with the prompt", r.id), &Reject{Kind: reqerr.KindIntegrity})
		return
	}
	if r.state == PWaitGrant {
		r.state = PRunning
		p.post(r)
	}
}

func (p *PrefillMachine) reject(from PeerID, m *Reject) {
	r := p.rooms[m.Room]
	if r == nil {
		if seen, ok := p.tombs.has(m.Room); ok {
			p.dropTomb(from, m, seen)
			return
		}
		// The decode side refused before this side heard of the room.
		if !p.cfg.NoTombstones {
			p.tombs.add(m.Room, bit(TypeReject))
		}
		p.drop(from, m, DropUnknownRoom)
		return
	}
	if from != r.decode {
		p.drop(from, m, DropWrongPeer)
		return
	}
	r.seen |= bit(TypeReject)
	p.fail(r.id, m.Err())
	p.stop(r)
	if r.inflight > 0 {
		r.state = PAborting
		return
	}
	p.releaseLocal(r, OutcomeRejected)
	p.close(r)
}

func (p *PrefillMachine) abort(from PeerID, m *Abort) {
	r := p.rooms[m.Room]
	if r == nil {
		if _, ok := p.tombs.has(m.Room); ok {
			p.tombs.mark(m.Room, bit(TypeAbort))
		} else if !p.cfg.NoTombstones {
			// The abort overtook the Prefill and the Grant: tombstone the
			// room so neither can start it later.
			p.tombs.add(m.Room, bit(TypeAbort))
		}
		// Nothing is in flight for a room this side does not have; with a
		// tombstone nothing ever will be. Answer every Abort: the decode
		// side may be waiting for a Drained that was lost.
		p.sendDrained(m.Room, m.Decode)
		return
	}
	if r.seen&bit(TypeAbort) != 0 {
		p.drop(from, m, DropReplayed)
		return
	}
	r.seen |= bit(TypeAbort)
	if p.cfg.NoTombstones {
		// Unsafe: acknowledge that nothing is in flight now, promise
		// nothing about later; the room carries on.
		if r.inflight == 0 {
			p.sendDrained(r.id, r.decode)
		} else {
			r.drainOwed = true
		}
		return
	}
	p.fail(r.id, reqerr.New(reqerr.KindAborted, "room %v aborted", r.id))
	p.stop(r)
	if r.inflight > 0 {
		r.state = PAborting
		return
	}
	p.finishAbort(r)
}

func (p *PrefillMachine) finishAbort(r *proom) {
	if r.peerLost {
		p.releaseLocal(r, OutcomeEpoch)
		p.close(r)
		return
	}
	p.releaseLocal(r, OutcomeDrained)
	p.close(r)
	p.sendDrained(r.id, r.decode)
}

func (p *PrefillMachine) peerEpoch(from PeerID, m *PeerEpoch) {
	if m.Epoch <= p.epochs[m.Peer] {
		p.drop(from, m, DropStaleEpoch)
		return
	}
	p.epochs[m.Peer] = m.Epoch
	for _, r := range slices.Clone(p.order) {
		if r.decode != m.Peer {
			continue
		}
		if r.state == PAborting {
			continue // already failed; waits for its writes below
		}
		// The old connection is gone with every write posted through it;
		// the decode side sees the same epoch change and ends the room.
		p.fail(r.id, reqerr.New(reqerr.KindPeerLost, "room %v: decode peer %d reconnected", r.id, m.Peer))
		p.stop(r)
		if r.inflight > 0 {
			// Writes posted after the connection dropped but before this
			// epoch reached us went out on the new connection: they still
			// read the local pages. The decode side refuses them (its
			// windows for the room are revoked by the same epoch), but the
			// pages must stay ours until the transport reports each one.
			r.state = PAborting
			r.peerLost = true
			continue
		}
		p.releaseLocal(r, OutcomeEpoch)
		p.close(r)
	}
}

// post posts a write for every page that is complete and not yet posted.
func (p *PrefillMachine) post(r *proom) {
	if r.state != PRunning {
		return
	}
	g := r.grant
	ps := p.cfg.Pool.PageSize()
	ready := r.computed / ps
	if r.computed == r.prompt {
		ready = p.pagesFor(r.prompt)
	}
	ready = min(ready, len(r.local), len(g.Pages)) // differ only without page-count agreement
	for r.posted < ready {
		i := r.posted
		h := kvpool.Header{
			Fence:   Fence{Room: r.id, Epoch: g.Epochs[i]},
			Page:    g.Pages[i],
			Ordinal: uint32(i),
			Tokens:  uint32(min(ps, r.prompt-i*ps)),
		}
		hdr := p.cfg.Pool.Seal(r.local[i], h)
		sealed, err := kvpool.ParseHeader(hdr[:])
		invariants.Assert(err == nil, "transfer: sealed header does not parse")
		w := &Write{Envelope: Envelope{Room: r.id}, Key: g.Key, Page: g.Pages[i], Header: hdr, Data: p.cfg.Pool.PageData(r.local[i])}
		p.cfg.Auth.Sign(w)
		p.seq++
		p.inflight[p.seq] = r
		r.inflight++
		r.posted++
		r.sums = append(r.sums, sealed.Checksum)
		p.stats.WritesPosted++
		p.emit(PostWrite{To: r.decode, Seq: p.seq, LocalPage: r.local[i], Fence: h.Fence, Msg: w})
	}
	p.maybeDone(r)
}

// maybeDone sends Done once every page is posted, every write has landed
// and the first token is known: Done means nothing is in flight.
func (p *PrefillMachine) maybeDone(r *proom) {
	if r.state != PRunning || !r.sampled || r.inflight > 0 {
		return
	}
	if r.posted < min(p.pagesFor(r.prompt), len(r.local), len(r.grant.Pages)) {
		return
	}
	d := &Done{Envelope: Envelope{Room: r.id}, Pages: uint32(r.posted), Tokens: uint32(r.prompt),
		Checksums: slices.Clone(r.sums), FirstToken: r.first}
	p.cfg.Auth.Sign(d)
	p.stats.Done++
	p.emit(Send{To: r.decode, Msg: d})
	p.releaseLocal(r, OutcomeFinished)
	r.seen |= bit(TypeDone)
	p.close(r)
}

// refuse ends a room that has posted nothing: fail it, tell the decode
// side with rj (which promises that nothing was or will be written) and
// tombstone it.
func (p *PrefillMachine) refuse(r *proom, err error, rj *Reject) {
	invariants.Assert(r.inflight == 0, "transfer: refusing a room with writes in flight")
	rj.Room = r.id
	p.cfg.Auth.Sign(rj)
	p.fail(r.id, err)
	p.stop(r)
	p.emit(Send{To: r.decode, Msg: rj})
	p.releaseLocal(r, OutcomeRejected)
	p.close(r)
}

func (p *PrefillMachine) stop(r *proom) {
	if r.state == PWaitGrant || r.state == PRunning {
		p.emit(StopPrefill{Room: r.id})
	}
	if i := slices.Index(p.queue, r); i >= 0 {
		p.queue = slices.Delete(p.queue, i, i+1)
	}
}

func (p *PrefillMachine) releaseLocal(r *proom, o Outcome) {
	if len(r.local) == 0 {
		return
	}
	p.cfg.Pool.Free(r.id, r.local)
	p.emit(PagesReleased{Room: r.id, Pages: slices.Clone(r.local), Outcome: o})
	r.local = nil
}

func (p *PrefillMachine) add(id RoomID, decode PeerID) *proom {
	r := &proom{id: id, decode: decode}
	p.rooms[id] = r
	p.order = append(p.order, r)
	return r
}

// close forgets a room and, with tombstones on, tombstones it.
func (p *PrefillMachine) close(r *proom) {
	delete(p.rooms, r.id)
	if i := slices.Index(p.order, r); i >= 0 {
		p.order = slices.Delete(p.order, i, i+1)
	}
	if !p.cfg.NoTombstones {
		p.tombs.add(r.id, r.seen)
	}
}

func (p *PrefillMachine) sendDrained(room RoomID, to PeerID) {
	m := &Drained{Envelope: Envelope{Room: room}}
	p.cfg.Auth.Sign(m)
	p.stats.Drained++
	p.emit(Send{To: to, Msg: m})
}

func (p *PrefillMachine) dropTomb(from PeerID, m Message, seen uint16) {
	if seen&bit(m.Type()) != 0 {
		p.drop(from, m, DropReplayed)
		return
	}
	p.tombs.mark(m.Env().Room, bit(m.Type()))
	p.drop(from, m, DropLate)
}

func (p *PrefillMachine) drop(from PeerID, m Message, why DropReason) {
	p.stats.Dropped[why]++
	p.emit(Dropped{From: from, Type: m.Type(), Room: m.Env().Room, Reason: why})
}

func (p *PrefillMachine) fail(room RoomID, err error) {
	p.stats.Failed++
	p.emit(Fail{Room: room, Err: err})
}

func (p *PrefillMachine) emit(o Output) { p.out = append(p.out, o) }

func (p *PrefillMachine) flush() []Output {
	out := p.out
	p.out = nil
	return out
}
