package link

import (
	"context"
	"errors"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/transfer"
)

// Errors of Send and of write reports.
var (
	// ErrClosed: the link was closed by its owner (Link.Close). Nothing more
	// is sent or delivered through it.
	ErrClosed = errors.New("link: closed")
	// ErrPeerGone: the connection to the peer is down. A message given to
	// Send was not sent; a write reported with it never landed. The
	// transport delivers (or has delivered) a PeerEpoch for the change.
	ErrPeerGone = errors.New("link: peer connection lost")
	// ErrRefused is wrapped by the report of a write the receiver refused:
	// its MAC did not verify or its window was not open or did not hold the
	// page (transfer.ErrNoWindow, ErrPageNotInWindow, ErrWriteSize). The
	// write did not touch the decode pool.
	ErrRefused = errors.New("link: write refused by the receiver")
)

// Report is the completion of one posted write.
type Report struct {
	Room transfer.RoomID
	Seq  uint64 // transfer.PostWrite.Seq
	// Err is nil when the write was applied to the decode pool; it wraps
	// ErrRefused when the receiver refused it, and is ErrPeerGone, ErrClosed
	// or a context error when it was lost before it could land. In every
	// case the transport no longer references the write's data.
	Err error
}

// Sink is what a worker gives a transport: where the link delivers what
// arrives for the worker. One Sink may serve many links (the from argument
// names the peer).
//
// Sink methods are called from the transport's goroutines, and MAY be
// called from the goroutine calling Send, Post or Close before those
// return. They MUST NOT block, and MUST NOT call back into the link: a
// worker queues what it receives for its driver goroutine (the machines are
// not safe for concurrent use). The volume is bounded by the protocol: a
// room produces a bounded number of messages and reports.
//
// For one link, Deliver calls are made one at a time, in the order the
// peer sent the messages, and Landed reports one at a time; a Deliver and
// a Landed of the same link may run concurrently.
type Sink interface {
	// Deliver hands over a control message from peer from: any transfer
	// message but a Write, or a *transfer.PeerEpoch made by the transport
	// (signed under the cluster secret, Room zero). The transport does not
	// verify the MAC of peer messages; the machines do.
	Deliver(from transfer.PeerID, m transfer.Message)
	// Landed reports a write posted through a link of this Sink, exactly
	// once per Post.
	Landed(r Report)
}

// Receiver is the decode side's data path: where a transport applies the
// page writes it receives, without consulting the decode worker.
type Receiver struct {
	Pool    *kvpool.Pool
	Windows *transfer.WindowTable
	// Auth verifies each write's MAC before it lands; a write that fails is
	// refused (ErrRefused).
	Auth *transfer.Auth
}

// Link is one worker's end of the connection to one peer.
//
// Methods are safe for concurrent use, though a worker normally calls Send
// and Post from its one driver goroutine. Messages and writes given to Send
// and Post by one goroutine reach the peer in that order (one FIFO per
// direction for both).
type Link interface {
	// Local is this worker's id; Peer the remote worker's.
	Local() transfer.PeerID
	Peer() transfer.PeerID
	// Epoch is the current connection's epoch (0 before the first
	// connection).
	Epoch() uint64
	// Connected reports whether a connection is up now. It is a hint for
	// scheduling (the connection may drop right after); what was lost is
	// always told by the PeerEpoch that follows.
	Connected() bool

	// Send queues a signed control message for the peer. It blocks while
	// the queue is full. It returns nil once the message is queued on the
	// current connection (which may still be lost before delivery: the
	// PeerEpoch that follows says so); ErrPeerGone when no connection is up
	// (the message is dropped); ErrClosed after Close; ctx's error when ctx
	// ends while waiting for room. An error MUST mean the message was not
	// queued and will never be transmitted, on this connection or a later
	// one: the decode worker frees a refused Grant's pages on that promise
	// (transfer.DecodeMachine.GrantUnsent). m MUST NOT be a *transfer.Write
	// (use Post) and MUST NOT be modified afterwards.
	Send(ctx context.Context, m transfer.Message) error

	// Post queues a page write for the peer. w.Msg.Data aliases a page of
	// the sender's pool; the sender MUST NOT reuse that page until the
	// write is reported. Post never fails by return value: every write is
	// reported exactly once through the sender's Sink.Landed, including a
	// write that could not be queued (link closed, connection down, ctx
	// ended while waiting for room), which is reported at once, possibly
	// before Post returns.
	Post(ctx context.Context, w transfer.PostWrite)

	// Close ends the link for good: queued messages are dropped, writes not
	// yet applied are reported with ErrClosed, and the peer sees the
	// connection lost (a PeerEpoch). The local Sink receives a final
	// PeerEpoch too, unless the link never connected, and then nothing more
	// from this link once Close returns. Close is idempotent.
	Close() error
}
