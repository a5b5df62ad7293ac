// Package transfer is the KV transfer protocol of DESIGN.md §4 as two pure
// state machines, one per side, plus what their transports need: the
// messages and their versioned wire format, the MAC that authenticates
// them, and the receiver's window table.
//
// The machines start no goroutines, do no I/O and read no clock. Inputs are
// method calls: Step(from, msg) for messages, Tick(now) for time, and
// engine reports (Computed, Sampled, Landed on the prefill side; Finish on
// the decode side). Each call returns the outputs it produced, in order
// (Send, PostWrite, RunPrefill, StopPrefill, StartDecode, Fail, and records
// of what it did: OpenWindow, RevokeWindow, PagesReleased, PagesDeferred,
// PagesQuarantined, Dropped). The pool and the window table are in-memory
// structures the machines change directly, inside the call: that makes
// "revoke the window, then release the pages" an order inside one function
// rather than a promise every driver must keep.
//
// # Messages
//
//	Open      router -> decode    room, prefill peer, prompt and max tokens
//	Prefill   router -> prefill   room, decode peer, prompt and max tokens
//	Grant     decode -> prefill   pages, epochs (fences), window key, agreed page count and prompt length
//	Reject    both ways           the original error as kind + numbers; from prefill: "never wrote, never will"
//	Write     prefill -> decode   data path: page header (fence, page, ordinal, tokens, checksum) + K/V
//	Done      prefill -> decode   pages written, tokens, checksums, first token; sent after every write landed
//	Abort     router -> both, decode -> prefill
//	Drained   prefill -> decode   nothing in flight AND the room is tombstoned
//	PeerEpoch transport -> both   the connection to a peer is new; nothing sent on the old one can land
//
// Every message carries its room and an HMAC-SHA256 MAC (first 16 bytes)
// under the cluster secret over its encoding. Machines drop and count
// messages whose MAC fails, messages of a type already accepted for the
// room (replays, duplicates), and messages for closed rooms.
//
// # Decode side (DecodeMachine)
//
//	(none)      --Open, cannot ever fit----------> Fail(ContextLengthError), Reject to prefill; nothing reserved (I3)
//	(none)      --Open, fits---------------------> Queued
//	(none)      --Reject (overtook the Open)-----> closed: Fail with the prefill side's error; a later Open reserves nothing
//	(none)      --Abort (overtook the Open)------> closed: a later Open reserves nothing
//	Queued      --pages free---------------------> Granted: alloc (epoch++), open window, send Grant
//	Queued      --Abort / Reject / Drained-------> closed, Fail
//	Granted     --Done, verified-----------------> Active: revoke window, StartDecode
//	Granted     --Done, verification fails-------> Quarantined: revoke window, Fail(kv_integrity_error)
//	Granted     --Abort / transfer timeout-------> Draining: Fail, Abort to prefill, revoke window, defer pages
//	Granted     --Reject / Drained---------------> closed: revoke window, free pages
//	Draining    --Drained / Reject---------------> closed: release pages (outcome drained)
//	Draining    --drain timeout------------------> Quarantined (outcome timeout)
//	Quarantined --PeerEpoch of its prefill peer--> closed: release pages
//	Granted, Draining --PeerEpoch----------------> closed: free or release pages (Fail peer_lost if granted)
//	Active      --Abort--------------------------> Active: Fail (the engine stops and calls Finish)
//	Active      --Finish-------------------------> closed: free pages
//
// Verification on Done (I4) checks, for every granted page: the header
// fence equals the fence of the grant (room, epoch), the header names the
// page and its ordinal, token counts add up to the agreed prompt length,
// the page count equals the agreed count, the checksum is present, matches
// the data and equals the one Done reports. Any failure fails the request
// closed.
//
// # Prefill side (PrefillMachine)
//
//	(none)      --Prefill, cannot ever fit-------> Fail, Reject to decode, tombstone
//	(none)      --Prefill, fits------------------> Queued
//	(none)      --Grant--------------------------> WaitPrefill (the grant overtook the prefill request)
//	WaitPrefill --Prefill, agrees----------------> Queued
//	Queued      --local pages free---------------> WaitGrant (or Running if the grant is here): RunPrefill
//	WaitGrant   --Grant, agrees------------------> Running: post writes for completed pages
//	Running     --Computed-----------------------> Running: post writes for newly completed pages
//	Running     --all landed, Sampled------------> closed: Done, free local pages, tombstone
//	any         --Grant or Prefill disagreeing---> closed: Reject(kv_integrity_error), tombstone
//	any         --Abort, nothing in flight-------> closed: StopPrefill, Drained, tombstone
//	any         --Abort, writes in flight--------> Aborting
//	Aborting    --last Landed--------------------> closed: Drained, tombstone
//	(none)      --Abort--------------------------> tombstone, Drained (the abort overtook everything)
//	tombstoned  --Prefill / Grant----------------> dropped: no write is ever posted for the room
//	any         --PeerEpoch of its decode peer---> closed: Fail(peer_lost), tombstone
//	WaitGrant, WaitPrefill, Queued --wait timeout-> closed: Reject(aborted) to decode, tombstone
//
// # Protections
//
// Protections (zero value: all on) switches each protection off so that
// tests and the simulator can reproduce the failures of DESIGN.md §1. With
// NoWindowRevocation and NoDeferredRelease an aborted room's pages are
// freed while writes for them can still land (late write after abort).
// With NoTombstones, Drained only means "nothing in flight now" and a Grant
// that arrives after the Abort still gets written. With
// NoAdmissionBeforeReservation and NoPageCountAgreement the decode side
// reserves pages for a prompt the prefill side replaces by a one-token
// placeholder, accepts a one-page Done and starts decoding from pages that
// hold other requests' KV (rejected but alive); NoFenceCheck removes the
// last check that would notice.
//
// # Windows
//
// A window is the set of pages one decode machine lets one prefill write
// for one room. WindowTable is the receiver's table: a receiver applies a
// write only through WindowTable.Apply or Land, which hold the table's read
// lock across the copy, so that Revoke (write lock) is a barrier: when it
// returns no write under the key is in progress or can land later.
package transfer
