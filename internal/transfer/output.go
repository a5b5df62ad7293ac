package transfer

import (
	"fmt"

	"github.com/kvfence/kvfence/internal/reqerr"
)

// Output is one thing a machine call produced, in the order it happened.
// The driver MUST act on every output of a call, in order, before the next
// call into the same machine:
//
//   - Send, PostWrite: hand to the transport (messages are already signed).
//   - RunPrefill, StopPrefill, StartDecode, Fail: hand to the engine.
//   - OpenWindow, RevokeWindow, PagesReleased, PagesDeferred,
//     PagesQuarantined, Dropped: already applied (the machine did it
//     through its Pool and Windows); for logs, metrics and the simulator.
type Output interface {
	output()
	String() string
}

// Send a control message to a peer.
type Send struct {
	To  PeerID
	Msg Message
}

// PostWrite posts a page write (prefill side). Msg.Data aliases local page
// LocalPage of the prefill pool, which stays allocated until the driver
// reports the write with Prefill.Landed(room, Seq): exactly once, when the
// transport has finished with it, whether it was applied or refused by a
// revoked window, or was lost with its connection.
type PostWrite struct {
	To        PeerID
	Seq       uint64
	LocalPage int32
	// Fence is the fence the write carries in Msg.Header, for drivers and
	// checkers that do not want to parse the header; Msg.Page is the remote
	// page and Msg.Key the window.
	Fence Fence
	Msg   *Write
}

// OpenWindow: the decode machine opened window Key over Pages for Room.
type OpenWindow struct {
	Room  RoomID
	Key   WindowKey
	Pages []int32
}

// RevokeWindow: the decode machine revoked window Key; no write under it
// can land any more.
type RevokeWindow struct {
	Room RoomID
	Key  WindowKey
}

// StartDecode: the transfer verified (I4); the sequence may join the
// decode batch with these pages (page table order) and the first token.
// From now on the engine owns the pages and ends the room with
// Decode.Finish.
type StartDecode struct {
	Room         RoomID
	Pages        []int32
	PromptTokens int
	FirstToken   int32
}

// Fail ends a request with Err (a *reqerr.ContextLengthError or a
// *reqerr.Error). On the decode side it is the request's outcome: the
// decode machine emits exactly one StartDecode or Fail per Open it
// accepted, plus a Fail after StartDecode if an Abort stops a running
// sequence. On the prefill side it tells the prefill engine to drop the
// room.
type Fail struct {
	Room RoomID
	Err  error
}

// RunPrefill: compute the prompt of Room into these local pages, reporting
// progress with Prefill.Computed and the sampled token with
// Prefill.Sampled.
type RunPrefill struct {
	Room         RoomID
	Pages        []int32
	PromptTokens int
}

// StopPrefill: stop computing Room; its local pages are about to be freed
// (they are freed in the same call when nothing is in flight).
type StopPrefill struct {
	Room RoomID
}

// Outcome says why pages went back to the free list.
type Outcome uint8

const (
	OutcomeFinished  Outcome = iota // the sequence finished (Decode.Finish) or the transfer completed (prefill side)
	OutcomeRejected                 // the prefill side rejected the room before writing
	OutcomeDrained                  // deferred release ended by Drained
	OutcomeEpoch                    // the peer's connection epoch changed: no old write can land
	OutcomeImmediate                // aborted and freed at once (window revoked, or unsafe)
	OutcomeUnsent                   // the Grant never left this worker: no write for the pages can exist
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"finished", "rejected", "drained", "epoch", "immediate", "unsent"}

func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// PagesReleased: these pages of Room went back to the free list.
type PagesReleased struct {
	Room    RoomID
	Pages   []int32
	Outcome Outcome
}

// PagesDeferred: these pages of an aborted Room are held until Drained or
// the drain timeout.
type PagesDeferred struct {
	Room  RoomID
	Pages []int32
}

// PagesQuarantined: these pages of Room are held until the prefill peer's
// connection epoch changes.
type PagesQuarantined struct {
	Room   RoomID
	Pages  []int32
	Reason string // "drain timeout" or "integrity"
}

// DropReason says why an input was dropped.
type DropReason uint8

const (
	DropBadMAC      DropReason = iota // the MAC does not verify
	DropReplayed                      // a message of this type was already accepted for the room
	DropLate                          // the room is closed (tombstoned) and this type was not seen
	DropUnknownRoom                   // no such room and the message does not open one
	DropWrongPeer                     // sent by a peer that is not the room's
	DropWrongState                    // the room is in a state that does not take this message
	DropUnexpected                    // this side never receives this type
	DropOverflow                      // a bounded table is full
	DropStaleEpoch                    // a PeerEpoch not newer than the known one
	numDropReasons
)

var dropNames = [numDropReasons]string{"bad-mac", "replayed", "late", "unknown-room", "wrong-peer",
	"wrong-state", "unexpected", "overflow", "stale-epoch"}

func (r DropReason) String() string {
	if r < numDropReasons {
		return dropNames[r]
	}
	return fmt.Sprintf("drop(%d)", uint8(r))
}

// Dropped: an input was dropped and counted.
type Dropped struct {
	From   PeerID
	Type   MsgType
	Room   RoomID
	Reason DropReason
}

func (Send) output()             {}
func (PostWrite) output()        {}
func (OpenWindow) output()       {}
func (RevokeWindow) output()     {}
func (StartDecode) output()      {}
func (Fail) output()             {}
func (RunPrefill) output()       {}
func (StopPrefill) output()      {}
func (PagesReleased) output()    {}
func (PagesDeferred) output()    {}
func (PagesQuarantined) output() {}
func (Dropped) output()          {}

func (o Send) String() string { return fmt.Sprintf("send to=%d %v", o.To, o.Msg) }
func (o PostWrite) String() string {
	return fmt.Sprintf("post-write to=%d seq=%d local=%d %v", o.To, o.Seq, o.LocalPage, o.Msg)
}
func (o OpenWindow) String() string {
	return fmt.Sprintf("open-window room=%v key=%d pages=%v", o.Room, o.Key, o.Pages)
}
func (o RevokeWindow) String() string {
	return fmt.Sprintf("revoke-window room=%v key=%d", o.Room, o.Key)
}
func (o StartDecode) String() string {
	return fmt.Sprintf("start-decode room=%v pages=%v prompt=%d first=%d", o.Room, o.Pages, o.PromptTokens, o.FirstToken)
}
func (o Fail) String() string {
	return fmt.Sprintf("fail room=%v kind=%v err=%q", o.Room, reqerr.KindOf(o.Err), o.Err.Error())
}
func (o RunPrefill) String() string {
	return fmt.Sprintf("run-prefill room=%v pages=%v prompt=%d", o.Room, o.Pages, o.PromptTokens)
}
func (o StopPrefill) String() string { return fmt.Sprintf("stop-prefill room=%v", o.Room) }
func (o PagesReleased) String() string {
	return fmt.Sprintf("release room=%v pages=%v outcome=%v", o.Room, o.Pages, o.Outcome)
}
func (o PagesDeferred) String() string { return fmt.Sprintf("defer room=%v pages=%v", o.Room, o.Pages) }
func (o PagesQuarantined) String() string {
	return fmt.Sprintf("quarantine room=%v pages=%v reason=%q", o.Room, o.Pages, o.Reason)
}
func (o Dropped) String() string {
	return fmt.Sprintf("drop from=%d type=%v room=%v reason=%v", o.From, o.Type, o.Room, o.Reason)
}
