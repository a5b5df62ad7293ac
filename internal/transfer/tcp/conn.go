package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// netConn is an authenticated connection with the reader that ran the
// handshake (it may hold bytes the peer sent right after it).
type netConn struct {
	net.Conn
	br *bufio.Reader
}

// item is one frame in a connection's send queue: an encoded control
// frame or ack, or a page write encoded by the writer.
type item struct {
	frame []byte
	ack   bool // frame is an ack: not counted against the queue bound
	write *transfer.Write
	seq   uint64 // the write's sequence on this connection
}

// pending is a posted write not yet reported. It is reported once the
// receiver acknowledged it AND the writer is done with its data (the ack
// can overtake the return of the socket write that carried it).
type pending struct {
	room    transfer.RoomID
	seq     uint64 // transfer.PostWrite.Seq
	linkSeq uint64
	size    int
	status  byte // the ack's status, once acked
}

// conn is one TCP connection of a link, with its reader and writer
// goroutines and its send queue.
type conn struct {
	l     *Link
	nc    *netConn
	epoch uint64 // set by attach under l.mu, read-only afterwards

	// Guarded by l.mu.
	q          []item
	qFrames    int // queued control frames plus unreported writes
	qBytes     int
	acksQueued int
	pending    []pending // writes in post order
	acked      int       // pending[:acked] are acknowledged
	written    uint64    // writes with linkSeq <= written are off the writer's hands
	nextSeq    uint64

	recvSeq uint64 // writes received (reader only)
	retired bool   // guarded by l.life

	wake       chan struct{} // cap 1: the writer has work
	stopOnce   chan struct{} // cap 1 token: the first stop takes it
	stopped    chan struct{} // closed by stop
	readerDone chan struct{}
	writerDone chan struct{}
	retiredCh  chan struct{} // closed by retireLocked
}

func newConn(l *Link, nc *netConn) *conn {
	c := &conn{
		l: l, nc: nc,
		wake:       make(chan struct{}, 1),
		stopOnce:   make(chan struct{}, 1),
		stopped:    make(chan struct{}),
		readerDone: make(chan struct{}),
		writerDone: make(chan struct{}),
		retiredCh:  make(chan struct{}),
	}
	c.stopOnce <- struct{}{}
	return c
}

// roomLocked reports whether a frame of size bytes fits the queue bound.
func (c *conn) roomLocked(size int) bool {
	cfg := c.l.cfg
	return c.qFrames < cfg.QueueFrames && (c.qBytes+size <= cfg.QueueBytes || c.qBytes == 0)
}

func (c *conn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// stop takes the connection down (once): it stops taking frames, closes
// the socket (which ends the reader and the writer) and wakes waiters.
func (c *conn) stop() {
	select {
	case <-c.stopOnce:
	default:
		return
	}
	l := c.l
	l.mu.Lock()
	if l.mu.cur == c {
		l.mu.cur = nil
	}
	l.notifyLocked()
	l.mu.Unlock()
	close(c.stopped)
	c.nc.Close()
}

// protocolError is a peer that broke the link protocol; the connection is
// closed and the reason logged.
type protocolError struct{ err error }

func (e protocolError) Error() string { return "protocol violation: " + e.err.Error() }
func (e protocolError) Unwrap() error { return e.err }

var errStopped = errors.New("tcp: connection stopped")

// start runs the reader and the writer; when either ends, the connection
// is stopped and retired (unless someone retired it first).
func (c *conn) start() {
	errc := make(chan error, 2)
	go func() {
		errc <- c.readLoop()
		close(c.readerDone)
	}()
	go func() {
		errc <- c.writeLoop()
		close(c.writerDone)
	}()
	go func() {
		err := <-errc
		c.stop()
		l := c.l
		why := "stopped"
		var pe protocolError
		switch {
		case errors.As(err, &pe):
			l.stats.protocolErrors.Add(1)
			why = pe.Error()
			l.cfg.log.Warn("transfer link: closing connection", "self", l.cfg.Self, "peer", l.peer,
				"epoch", c.epoch, "reason", why)
		case errors.Is(err, io.EOF):
			why = "closed by the peer"
		case err != nil && !errors.Is(err, errStopped) && !errors.Is(err, net.ErrClosed):
			why = err.Error()
		}
		l.life.Lock()
		l.retireLocked(c, link.ErrPeerGone, why)
		l.life.Unlock()
	}()
}

func (c *conn) writeLoop() error {
	l := c.l
	bw := bufio.NewWriterSize(c.nc, 256<<10)
	var batch []item
	var head []byte
	for {
		l.mu.Lock()
		batch, c.q = c.q, batch[:0]
		freed := false
		for i := range batch {
			switch {
			case batch[i].ack:
				c.acksQueued--
			case batch[i].write == nil:
				c.qFrames--
				c.qBytes -= len(batch[i].frame)
				freed = true
			}
		}
		if freed {
			l.notifyLocked()
		}
		l.mu.Unlock()
		if len(batch) == 0 {
			if bw.Buffered() > 0 {
				if err := bw.Flush(); err != nil {
					return err
				}
				continue
			}
			select {
			case <-c.wake:
				continue
			case <-c.stopped:
				return errStopped
			}
		}
		for i := range batch {
			it := &batch[i]
			if it.write != nil {
				head = appendWriteHead(head[:0], it.write)
				if _, err := bw.Write(head); err != nil {
					return err
				}
				if _, err := bw.Write(it.write.Data); err != nil {
					return err
				}
				l.stats.framesSent.Add(1)
				c.markWritten(it.seq)
			} else {
				if _, err := bw.Write(it.frame); err != nil {
					return err
				}
				if !it.ack {
					l.stats.framesSent.Add(1)
				}
			}
			*it = item{}
		}
	}
}

// markWritten records that the writer is done with the data of write seq
// (the data sits in the socket or in bw's buffer, which is flushed before
// the writer waits; it no longer reads pool memory) and reports the
// writes that are now complete.
func (c *conn) markWritten(seq uint64) {
	c.l.mu.Lock()
	c.written = seq
	done := c.completeLocked()
	c.l.mu.Unlock()
	c.reportAll(done)
}

// completeLocked pops the writes that are both acknowledged and written.
func (c *conn) completeLocked() []pending {
	n := 0
	for n < c.acked && c.pending[n].linkSeq <= c.written {
		n++
	}
	if n == 0 {
		return nil
	}
	done := make([]pending, n)
	copy(done, c.pending[:n])
	clear(c.pending[:n])
	c.pending = c.pending[n:]
	c.acked -= n
	for _, p := range done {
		c.qFrames--
		c.qBytes -= p.size
	}
	c.l.notifyLocked()
	return done
}

func (c *conn) reportAll(done []pending) {
	for _, p := range done {
		c.l.report(link.Report{Room: p.room, Seq: p.seq, Err: statusReportErr(p.status)})
	}
}

// statusReportErr is the report error of an acknowledged write.
func statusReportErr(status byte) error {
	if status == ackApplied {
		return nil
	}
	return fmt.Errorf("%w: %w", link.ErrRefused, statusErr[status])
}

func (c *conn) readLoop() error {
	l := c.l
	br := c.nc.br
	var pre [4]byte
	buf := make([]byte, 0, 4096)
	for {
		if _, err := io.ReadFull(br, pre[:]); err != nil {
			return err
		}
		n := binary.LittleEndian.Uint32(pre[:])
		if uint64(n) > uint64(l.cfg.MaxFrame) {
			return protocolError{malformed("frame of %d bytes exceeds %d", n, l.cfg.MaxFrame)}
		}
		if n < 2 {
			return protocolError{malformed("frame of %d bytes", n)}
		}
		total := 4 + int(n)
		if cap(buf) < total {
			buf = make([]byte, total)
		}
		buf = buf[:total]
		copy(buf, pre[:])
		if _, err := io.ReadFull(br, buf[4:]); err != nil {
			return err
		}
		if buf[4] == linkVersion {
			if err := c.readAck(buf[4:]); err != nil {
				return err
			}
			continue
		}
		m, used, err := transfer.Decode(buf)
		if err != nil {
			return protocolError{err}
		}
		if used != total {
			return protocolError{malformed("frame uses %d of %d bytes", used, total)}
		}
		l.stats.framesReceived.Add(1)
		switch m := m.(type) {
		case *transfer.Write:
			if err := c.land(m); err != nil {
				return err
			}
		case *transfer.PeerEpoch:
			return protocolError{malformed("the peer sent a PeerEpoch (only the transport makes them)")}
		default:
			l.deliver(m)
		}
	}
}

// land is the NIC: verify the MAC, copy through the window table, ack.
func (c *conn) land(w *transfer.Write) error {
	l := c.l
	rc := l.cfg.Receiver
	if rc == nil {
		return protocolError{malformed("a Write frame for a side without a receiver")}
	}
	c.recvSeq++
	if l.cfg.testHookLand != nil {
		l.cfg.testHookLand()
	}
	auth := rc.Auth
	if auth == nil {
		auth = l.cfg.auth
	}
	var err error
	if !auth.Verify(w) {
		err = errBadMAC
	} else {
		err = rc.Windows.Land(rc.Pool, w)
	}
	if err == nil {
		l.stats.landed.Add(1)
	} else {
		l.stats.refused.Add(1)
		l.cfg.log.Debug("transfer link: write refused", "self", l.cfg.Self, "peer", l.peer,
			"room", w.Room, "key", uint64(w.Key), "page", w.Page, "reason", err)
	}
	ack := appendAck(make([]byte, 0, ackFrame), c.recvSeq, ackStatus(err))
	l.mu.Lock()
	if c.acksQueued >= maxAcksQueued {
		l.mu.Unlock()
		return protocolError{malformed("the peer leaves %d acks unread", c.acksQueued)}
	}
	c.acksQueued++
	c.q = append(c.q, item{frame: ack, ack: true})
	l.mu.Unlock()
	c.wakeWriter()
	return nil
}

// readAck takes the receiver's ack of the next unacknowledged write.
func (c *conn) readAck(f []byte) error {
	seq, status, err := parseAck(f)
	if err != nil {
		return protocolError{err}
	}
	l := c.l
	l.mu.Lock()
	if c.acked >= len(c.pending) || c.pending[c.acked].linkSeq != seq {
		l.mu.Unlock()
		return protocolError{malformed("ack of write %d out of sequence", seq)}
	}
	c.pending[c.acked].status = status
	c.acked++
	done := c.completeLocked()
	l.mu.Unlock()
	c.reportAll(done)
	return nil
}
