package tcp

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

	"github.com/kvfence/kvfence/internal/invariants"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// Config configures the links of one worker. The zero values of the
// optional fields are the defaults.
type Config struct {
	Self transfer.PeerID
	// Secret is the cluster secret (at least transfer.MinSecret bytes): it
	// authenticates handshakes and signs the PeerEpoch messages the
	// transport makes.
	Secret []byte
	Sink   link.Sink
	// Receiver is the decode side's data path. Without it (prefill side) a
	// Write frame from the peer is a protocol violation.
	Receiver *link.Receiver
	Logger   *slog.Logger
	// OnLink (Listener only) is called once for each link the listener
	// makes, before that link delivers anything: a decode worker registers
	// the prefill workers that connect to it (engine AddLink) there.
	OnLink func(*Link)

	// QueueFrames and QueueBytes bound each connection's send queue; a page
	// write counts against them until it is acknowledged. Defaults 1024
	// frames and 64 MiB. A single frame larger than QueueBytes is taken
	// when the queue is empty.
	QueueFrames int
	QueueBytes  int
	// MaxFrame bounds the frames read from an authenticated peer; default
	// transfer.MaxFrame.
	MaxFrame int
	// HandshakeTimeout bounds dialing plus the handshake; default 5 s.
	HandshakeTimeout time.Duration
	// MinBackoff and MaxBackoff bound the dialer's reconnect delays;
	// defaults 50 ms and 2 s.
	MinBackoff, MaxBackoff time.Duration
	// MaxHandshakes bounds the handshakes a listener runs at once; more
	// connections are closed at once. Default 64.
	MaxHandshakes int
	// Incarnation names this process's life in handshakes (logged by the
	// peer); random when zero.
	Incarnation uint64
}

// maxAcksQueued bounds the acks a receiver holds for a peer that does not
// read them; the peer's own queue bound keeps an honest peer far below it.
const maxAcksQueued = 1 << 16

type config struct {
	Config
	auth *transfer.Auth
	log  *slog.Logger
	// testHookLand, when set, runs in the receiver before each write lands
	// (tests stall the receiver with it).
	testHookLand func()
}

func (c Config) resolve() (*config, error) {
	if c.Sink == nil {
		return nil, errors.New("tcp: Config.Sink is nil")
	}
	auth, err := transfer.NewAuth(c.Secret)
	if err != nil {
		return nil, err
	}
	if c.Receiver != nil && (c.Receiver.Pool == nil || c.Receiver.Windows == nil) {
		return nil, errors.New("tcp: Config.Receiver without Pool or Windows")
	}
	r := &config{Config: c, auth: auth, log: c.Logger}
	r.Secret = append([]byte(nil), c.Secret...)
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.QueueFrames <= 0 {
		r.QueueFrames = 1024
	}
	if r.QueueBytes <= 0 {
		r.QueueBytes = 64 << 20
	}
	if r.MaxFrame <= 0 || r.MaxFrame > transfer.MaxFrame {
		r.MaxFrame = transfer.MaxFrame
	}
	if r.HandshakeTimeout <= 0 {
		r.HandshakeTimeout = 5 * time.Second
	}
	if r.MinBackoff <= 0 {
		r.MinBackoff = 50 * time.Millisecond
	}
	if r.MaxBackoff < r.MinBackoff {
		r.MaxBackoff = max(2*time.Second, r.MinBackoff)
	}
	if r.MaxHandshakes <= 0 {
		r.MaxHandshakes = 64
	}
	if r.Incarnation == 0 {
		var b [8]byte
		rand.Read(b[:])
		r.Incarnation = binary.LittleEndian.Uint64(b[:]) | 1
	}
	return r, nil
}

// Stats counts what a link did. Counters only grow.
type Stats struct {
	Connections    uint64 // connections established
	Losses         uint64 // connections lost or replaced
	FramesSent     uint64 // transfer frames written (control and writes)
	FramesReceived uint64
	WritesPosted   uint64
	WritesApplied  uint64 // sender: writes the receiver acknowledged as applied
	WritesRefused  uint64 // sender: writes the receiver refused
	WritesLost     uint64 // sender: writes reported lost (connection gone, link closed, ctx)
	Landed         uint64 // receiver: writes copied into the pool
	Refused        uint64 // receiver: writes refused (MAC, window)
	ProtocolErrors uint64 // connections closed for a malformed or unexpected frame
}

type stats struct {
	connections, losses, framesSent, framesReceived, writesPosted, writesApplied,
	writesRefused, writesLost, landed, refused, protocolErrors atomic.Uint64
}

// Link is one worker's end of the link to one peer (link.Link). Links are
// made by Dial (the prefill side: it connects and reconnects) and by a
// Listener (the decode side: connections come to it).
type Link struct {
	cfg  *config
	peer transfer.PeerID
	addr string // where the dialer connects; "" for a listener's link

	// life serializes connection changes (attach, retire, Close), so that
	// an epoch's PeerEpoch is delivered after the previous connection was
	// retired and before the next one carries anything.
	life sync.Mutex
	// deliverMu makes Sink.Deliver calls of this link one at a time;
	// reportMu does the same for Sink.Landed.
	deliverMu sync.Mutex
	reportMu  sync.Mutex

	mu struct {
		sync.Mutex
		closed    bool
		connected bool   // a connection was ever established
		epoch     uint64 // the last epoch delivered
		cur       *conn  // the live connection, nil when down
		// changed is closed and replaced whenever queue room, the live
		// connection or closed change; blocked Send and Post wait on it.
		changed chan struct{}
	}

	// attached is the connection attached and not yet retired (guarded
	// by life); unlike mu.cur it stays set while a stopped connection
	// waits to be retired.
	attached *conn

	cancelDial context.CancelFunc
	dialDone   chan struct{} // closed when the dial loop exits (dialer only)
	// ready is closed once a listener's OnLink returned for this link;
	// others asking the listener for the link wait for it (listener only).
	ready chan struct{}

	stats stats
}

var _ link.Link = (*Link)(nil)

func newLink(cfg *config, peer transfer.PeerID, addr string) *Link {
	l := &Link{cfg: cfg, peer: peer, addr: addr}
	l.mu.changed = make(chan struct{})
	return l
}

// Local implements link.Link.
func (l *Link) Local() transfer.PeerID { return l.cfg.Self }

// Peer implements link.Link.
func (l *Link) Peer() transfer.PeerID { return l.peer }

// Epoch implements link.Link.
func (l *Link) Epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.epoch
}

// Connected reports whether a connection is up.
func (l *Link) Connected() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.cur != nil
}

// WaitConnected waits until a connection is up, ctx ends (its error) or
// the link is closed (link.ErrClosed). A prefill worker that dials a
// decode worker for a request waits here, so the request's messages are
// not dropped for want of a connection.
func (l *Link) WaitConnected(ctx context.Context) error {
	for {
		l.mu.Lock()
		up, closed, ch := l.mu.cur != nil, l.mu.closed, l.mu.changed
		l.mu.Unlock()
		switch {
		case closed:
			return link.ErrClosed
		case up:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Stats returns the link's counters.
func (l *Link) Stats() Stats {
	s := &l.stats
	return Stats{
		Connections: s.connections.Load(), Losses: s.losses.Load(),
		FramesSent: s.framesSent.Load(), FramesReceived: s.framesReceived.Load(),
		WritesPosted: s.writesPosted.Load(), WritesApplied: s.writesApplied.Load(),
		WritesRefused: s.writesRefused.Load(), WritesLost: s.writesLost.Load(),
		Landed: s.landed.Load(), Refused: s.refused.Load(), ProtocolErrors: s.protocolErrors.Load(),
	}
}

func (l *Link) notifyLocked() {
	close(l.mu.changed)
	l.mu.changed = make(chan struct{})
}

// Send implements link.Link.
func (l *Link) Send(ctx context.Context, m transfer.Message) error {
	_, isWrite := m.(*transfer.Write)
	invariants.Assert(!isWrite, "tcp: Send of a Write (use Post)")
	frame := transfer.Encode(m)
	l.mu.Lock()
	c := l.mu.cur
	for {
		switch {
		case l.mu.closed:
			l.mu.Unlock()
			return link.ErrClosed
		case l.mu.cur == nil || l.mu.cur != c:
			// Bound to the connection current at the call: a message
			// must not move to the next connection (a new epoch) while
			// it waits.
			l.mu.Unlock()
			return link.ErrPeerGone
		case c.roomLocked(len(frame)):
			c.q = append(c.q, item{frame: frame})
			c.qFrames++
			c.qBytes += len(frame)
			l.mu.Unlock()
			c.wakeWriter()
			return nil
		}
		ch := l.mu.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		l.mu.Lock()
	}
}

// Post implements link.Link.
func (l *Link) Post(ctx context.Context, w transfer.PostWrite) {
	invariants.Assert(w.Msg != nil, "tcp: Post without a message")
	l.stats.writesPosted.Add(1)
	size := writeHeadLen + len(w.Msg.Data)
	l.mu.Lock()
	c := l.mu.cur
	for {
		var lost error
		switch {
		case l.mu.closed:
			lost = link.ErrClosed
		case l.mu.cur == nil || l.mu.cur != c:
			lost = link.ErrPeerGone
		case c.roomLocked(size):
			c.nextSeq++
			c.q = append(c.q, item{write: w.Msg, seq: c.nextSeq})
			c.pending = append(c.pending, pending{room: w.Msg.Room, seq: w.Seq, linkSeq: c.nextSeq, size: size})
			c.qFrames++
			c.qBytes += size
			l.mu.Unlock()
			c.wakeWriter()
			return
		}
		if lost != nil {
			l.mu.Unlock()
			l.report(link.Report{Room: w.Msg.Room, Seq: w.Seq, Err: lost})
			return
		}
		ch := l.mu.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			l.report(link.Report{Room: w.Msg.Room, Seq: w.Seq, Err: ctx.Err()})
			return
		}
		l.mu.Lock()
	}
}

func (l *Link) report(r link.Report) {
	switch {
	case r.Err == nil:
		l.stats.writesApplied.Add(1)
	case errors.Is(r.Err, link.ErrRefused):
		l.stats.writesRefused.Add(1)
	default:
		l.stats.writesLost.Add(1)
	}
	l.reportMu.Lock()
	defer l.reportMu.Unlock()
	l.cfg.Sink.Landed(r)
}

func (l *Link) deliver(m transfer.Message) {
	l.deliverMu.Lock()
	defer l.deliverMu.Unlock()
	l.cfg.Sink.Deliver(l.peer, m)
}

func (l *Link) deliverEpoch(epoch uint64) {
	m := &transfer.PeerEpoch{Peer: l.peer, Epoch: epoch}
	l.cfg.auth.Sign(m)
	l.deliver(m)
}

// Close implements link.Link.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return nil
	}
	l.mu.closed = true
	l.notifyLocked()
	l.mu.Unlock()
	if l.cancelDial != nil {
		l.cancelDial()
	}
	l.life.Lock()
	l.mu.Lock()
	connected := l.mu.connected
	l.mu.Unlock()
	if c := l.attached; c != nil {
		l.retireLocked(c, link.ErrClosed, "link closed")
	} else if connected {
		// The loss was delivered already; the contract promises a final
		// epoch all the same, and a newer epoch is always harmless.
		l.mu.Lock()
		l.mu.epoch++
		e := l.mu.epoch
		l.mu.Unlock()
		l.deliverEpoch(e)
	}
	l.life.Unlock()
	if l.dialDone != nil {
		<-l.dialDone
	}
	return nil
}

// Disconnect drops the current connection as if it were lost (both sides
// see a new epoch; a dialer reconnects). It is for tests and operators.
func (l *Link) Disconnect() {
	l.mu.Lock()
	c := l.mu.cur
	l.mu.Unlock()
	if c != nil {
		c.stop()
	}
}

// attach makes an authenticated connection the link's live one: it
// retires the previous connection, if any, delivers the new epoch, then
// starts the connection's reader and writer. It returns nil (and closes
// the connection) when the link is closed.
func (l *Link) attach(nc *netConn, remote hello) *conn {
	l.life.Lock()
	defer l.life.Unlock()
	l.mu.Lock()
	closed := l.mu.closed
	l.mu.Unlock()
	old := l.attached
	if closed {
		nc.Close()
		return nil
	}
	if old != nil {
		l.retireLocked(old, link.ErrPeerGone, "replaced by a new connection")
	}
	c := newConn(l, nc)
	l.mu.Lock()
	l.mu.epoch = max(l.mu.epoch, remote.lastEpoch) + 1
	c.epoch = l.mu.epoch
	l.mu.cur = c
	l.mu.connected = true
	l.attached = c
	l.notifyLocked()
	l.mu.Unlock()
	l.stats.connections.Add(1)
	l.cfg.log.Info("transfer link up", "self", l.cfg.Self, "peer", l.peer, "epoch", c.epoch,
		"remote", nc.RemoteAddr().String(), "peer_incarnation", fmt.Sprintf("%016x", remote.incarnation))
	l.deliverEpoch(c.epoch)
	c.start()
	return c
}

// retireLocked ends connection c (l.life held): it stops c, waits for its
// reader and writer, reports every write still pending with cause and
// delivers the new epoch. Retiring twice does nothing.
func (l *Link) retireLocked(c *conn, cause error, why string) {
	if c.retired {
		return
	}
	c.retired = true
	if l.attached == c {
		l.attached = nil
	}
	c.stop()
	<-c.readerDone
	<-c.writerDone
	l.mu.Lock()
	pend, acked := c.pending, c.acked
	c.pending, c.q = nil, nil
	c.acked = 0
	l.mu.epoch++
	epoch := l.mu.epoch
	l.notifyLocked()
	l.mu.Unlock()
	l.stats.losses.Add(1)
	l.cfg.log.Info("transfer link down", "self", l.cfg.Self, "peer", l.peer, "epoch", c.epoch,
		"new_epoch", epoch, "reason", why, "writes_lost", len(pend))
	for i, p := range pend {
		err := cause
		if i < acked {
			// Acknowledged but the writer had not marked it written
			// when it stopped: the receiver's answer is the truth.
			err = statusReportErr(p.status)
		}
		l.report(link.Report{Room: p.room, Seq: p.seq, Err: err})
	}
	l.deliverEpoch(epoch)
	close(c.retiredCh)
}
