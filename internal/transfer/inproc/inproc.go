package inproc

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// Config configures a Pair.
type Config struct {
	// Auth signs the PeerEpoch messages the transport makes and verifies
	// every write's MAC before it lands.
	Auth *transfer.Auth
	// QueueLen bounds each direction's queue (messages and writes). Default
	// 64.
	QueueLen int
}

// Side is one worker of a Pair.
type Side struct {
	ID   transfer.PeerID
	Sink link.Sink
}

// Pair is an in-process connection between one prefill and one decode
// worker. Its two ends are Prefill and Decode. It is safe for concurrent
// use.
type Pair struct {
	cfg     Config
	sides   [2]Side // [dirP2D] sender is the prefill side
	recv    link.Receiver
	prefill *End
	decode  *End

	// mu guards the connection state and serializes epoch changes so that
	// PeerEpochs reach the sinks in increasing order.
	mu     sync.Mutex
	conn   *conn // nil while down
	epoch  uint64
	closed bool // an end was closed: no reconnection
}

// End is one worker's end of a Pair; it implements link.Link.
type End struct {
	pair *Pair
	dir  int // the direction this end sends in
	mu   sync.Mutex
	// closed is guarded by mu.
	closed bool
}

const (
	dirP2D = 0 // prefill sends, decode receives (messages and writes)
	dirD2P = 1 // decode sends, prefill receives (messages only)
)

type item struct {
	msg   transfer.Message
	write transfer.PostWrite
}

// conn is one connection epoch: two queues and their goroutines.
type conn struct {
	epoch uint64
	q     [2]chan item
	dead  chan struct{} // closed when the connection goes down
	// senders counts Send/Post calls that may still put an item in a queue;
	// teardown waits for them before draining the queues.
	senders sync.WaitGroup
	done    sync.WaitGroup // the two delivery goroutines
	down    bool           // guarded by Pair.mu
}

// New connects prefill and decode: the first connection (epoch 1) is up
// when New returns, and both sinks have received PeerEpoch 1. recv is the
// decode worker's data path.
func New(cfg Config, prefill, decode Side, recv link.Receiver) *Pair {
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 64
	}
	p := &Pair{cfg: cfg, sides: [2]Side{prefill, decode}, recv: recv}
	p.prefill = &End{pair: p, dir: dirP2D}
	p.decode = &End{pair: p, dir: dirD2P}
	p.Connect()
	return p
}

// Prefill returns the prefill worker's end; Decode the decode worker's.
func (p *Pair) Prefill() *End { return p.prefill }
func (p *Pair) Decode() *End  { return p.decode }

// Connect establishes a new connection if none is up (after Disconnect):
// both sinks receive the new epoch. It does nothing when connected or
// closed.
func (p *Pair) Connect() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil || p.closed {
		return
	}
	p.epoch++
	c := &conn{epoch: p.epoch, dead: make(chan struct{})}
	for d := range c.q {
		c.q[d] = make(chan item, p.cfg.QueueLen)
	}
	p.announceLocked(p.epoch)
	p.conn = c
	c.done.Add(2)
	go p.deliver(c, dirP2D)
	go p.deliver(c, dirD2P)
}

// Disconnect drops the connection as a network failure would: queued
// messages are lost, queued writes are reported lost, and once nothing of
// the old connection can land both sinks receive a new epoch. Send then
// returns link.ErrPeerGone until Connect.
func (p *Pair) Disconnect() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.teardownLocked()
}

// Reconnect is Disconnect then Connect: the sinks see two epoch changes.
func (p *Pair) Reconnect() {
	p.Disconnect()
	p.Connect()
}

// Epoch returns the current epoch (the last one announced).
func (p *Pair) Epoch() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.epoch
}

func (p *Pair) teardownLocked() {
	c := p.conn
	if c == nil {
		return
	}
	p.conn = nil
	c.down = true
	close(c.dead)
	c.senders.Wait() // no Send/Post can add to the queues any more
	c.done.Wait()    // no write is being applied, no message delivered
	for d := range c.q {
		for {
			select {
			case it := <-c.q[d]:
				p.lose(it, link.ErrPeerGone)
				continue
			default:
			}
			break
		}
	}
	p.epoch++
	p.announceLocked(p.epoch)
}

// announceLocked delivers PeerEpoch e to both sinks, each naming the other
// side as the peer.
func (p *Pair) announceLocked(e uint64) {
	for d, s := range p.sides {
		other := p.sides[1-d]
		m := &transfer.PeerEpoch{Peer: other.ID, Epoch: e}
		p.cfg.Auth.Sign(m)
		s.Sink.Deliver(other.ID, m)
	}
}

func (p *Pair) lose(it item, err error) {
	if it.msg == nil {
		p.sides[dirP2D].Sink.Landed(link.Report{Room: it.write.Msg.Room, Seq: it.write.Seq, Err: err})
	}
}

// deliver is direction d's receiving goroutine for connection c.
func (p *Pair) deliver(c *conn, d int) {
	defer c.done.Done()
	from := p.sides[d].ID
	to := p.sides[1-d].Sink
	for {
		select {
		case <-c.dead:
			return
		case it := <-c.q[d]:
			select {
			case <-c.dead:
				// Down while this item waited: it is lost like the rest
				// of the queue, not delivered by the luck of select.
				p.lose(it, link.ErrPeerGone)
				return
			default:
			}
			if it.msg != nil {
				to.Deliver(from, it.msg)
				continue
			}
			p.sides[dirP2D].Sink.Landed(link.Report{Room: it.write.Msg.Room, Seq: it.write.Seq, Err: p.land(it.write.Msg)})
		}
	}
}

// land is the NIC: MAC, window, copy. Nothing else.
func (p *Pair) land(w *transfer.Write) error {
	if p.recv.Auth != nil && !p.recv.Auth.Verify(w) {
		return fmt.Errorf("%w: bad MAC", link.ErrRefused)
	}
	if err := p.recv.Windows.Land(p.recv.Pool, w); err != nil {
		return fmt.Errorf("%w: %w", link.ErrRefused, err)
	}
	return nil
}

// enqueue puts it on the current connection's queue for direction d.
func (e *End) enqueue(ctx context.Context, it item) error {
	p := e.pair
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return link.ErrClosed
	}
	p.mu.Lock()
	c := p.conn
	if c == nil {
		p.mu.Unlock()
		return link.ErrPeerGone
	}
	c.senders.Add(1)
	p.mu.Unlock()
	defer c.senders.Done()
	// Prefer failing over queueing once the connection is down.
	select {
	case <-c.dead:
		return link.ErrPeerGone
	default:
	}
	select {
	case c.q[e.dir] <- it:
		return nil
	case <-c.dead:
		return link.ErrPeerGone
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Local implements link.Link.
func (e *End) Local() transfer.PeerID { return e.pair.sides[e.dir].ID }

// Peer implements link.Link.
func (e *End) Peer() transfer.PeerID { return e.pair.sides[1-e.dir].ID }

// Epoch implements link.Link.
func (e *End) Epoch() uint64 { return e.pair.Epoch() }

// Connected implements link.Link.
func (e *End) Connected() bool {
	p := e.pair
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn != nil
}

// Send implements link.Link.
func (e *End) Send(ctx context.Context, m transfer.Message) error {
	if _, ok := m.(*transfer.Write); ok {
		panic("inproc: Send of a Write (use Post)")
	}
	return e.enqueue(ctx, item{msg: m})
}

// Post implements link.Link. Only the prefill end posts writes.
func (e *End) Post(ctx context.Context, w transfer.PostWrite) {
	if e.dir != dirP2D {
		panic("inproc: Post from the decode end")
	}
	if err := e.enqueue(ctx, item{write: w}); err != nil {
		e.pair.lose(item{write: w}, err)
	}
}

// Close implements link.Link: it ends the whole Pair for good.
func (e *End) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	p := e.pair
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.teardownLocked()
	return nil
}

var _ link.Link = (*End)(nil)
