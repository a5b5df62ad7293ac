package engine

import (
	"sync"

	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// op is one input for a driver goroutine. Exactly one field group is set.
type op struct {
	kind   opKind
	from   transfer.PeerID
	msg    transfer.Message
	report link.Report
	link   link.Link
	gen    *dreq
	pre    *preq
	room   transfer.RoomID
}

type opKind uint8

const (
	opDeliver  opKind = iota // a message from a link (or the router, signed)
	opLanded                 // a write report from a link
	opLink                   // a link to add
	opGenerate               // a decode request to queue
	opPrefill                // a prefill request to start
	opClose                  // the client closed a stream
	opAbort                  // a local abort (prefill: ctx ended)
	opReject                 // an Open that can never fit: tell the prefill side
)

// inbox is a driver's input queue. Link sinks must not block (link.Sink),
// so deliveries append under a mutex and wake the driver; requests from the
// API are bounded by the worker's admission limits before they get here.
type inbox struct {
	// mu guards ops.
	mu   sync.Mutex
	ops  []op
	wake chan struct{} // capacity 1: "ops is not empty"
}

func newInbox() *inbox { return &inbox{wake: make(chan struct{}, 1)} }

func (b *inbox) put(o op) {
	b.mu.Lock()
	b.ops = append(b.ops, o)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// take swaps the pending ops out, reusing buf's memory.
func (b *inbox) take(buf []op) []op {
	b.mu.Lock()
	ops := b.ops
	b.ops = buf[:0]
	b.mu.Unlock()
	return ops
}
