package tcp

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/kvfence/kvfence/internal/transfer"
)

// Listener accepts the connections of prefill workers for one decode
// worker. Each authenticated peer gets one Link (Link), which outlives
// its connections.
type Listener struct {
	cfg *config
	ln  net.Listener

	mu struct {
		sync.Mutex
		closed bool
		links  map[transfer.PeerID]*Link
		shakes map[net.Conn]struct{} // connections in the handshake
	}
	slots chan struct{}  // handshakes in progress (MaxHandshakes)
	wg    sync.WaitGroup // the accept loop and handshakes
}

// Listen listens on addr (host:port; port 0 picks one) for peers holding
// the cluster secret.
func Listen(cfg Config, addr string) (*Listener, error) {
	if _, err := cfg.resolve(); err != nil {
		return nil, err
	}
	nl, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ln, err := NewListener(cfg, nl)
	if err != nil {
		nl.Close()
	}
	return ln, err
}

// NewListener serves peers on nl, which it closes on Close (a worker that
// must know its transfer address before it can build its Sink listens
// first, then calls NewListener).
func NewListener(cfg Config, nl net.Listener) (*Listener, error) {
	rc, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	ln := &Listener{cfg: rc, ln: nl, slots: make(chan struct{}, rc.MaxHandshakes)}
	ln.mu.links = make(map[transfer.PeerID]*Link)
	ln.mu.shakes = make(map[net.Conn]struct{})
	ln.wg.Add(1)
	go ln.acceptLoop()
	return ln, nil
}

// Addr is the address the listener listens on.
func (ln *Listener) Addr() net.Addr { return ln.ln.Addr() }

// Link returns the link to peer, made on first use: a decode worker sends
// to a prefill worker through it (link.ErrPeerGone until that worker has
// connected). After Close it returns a closed link.
func (ln *Listener) Link(peer transfer.PeerID) *Link {
	ln.mu.Lock()
	l, ok := ln.mu.links[peer]
	if ok {
		ln.mu.Unlock()
		<-l.ready
		return l
	}
	l = newLink(ln.cfg, peer, "")
	l.ready = make(chan struct{})
	closed := ln.mu.closed
	ln.mu.links[peer] = l
	ln.mu.Unlock()
	if closed {
		l.Close()
	}
	if ln.cfg.OnLink != nil {
		ln.cfg.OnLink(l)
	}
	close(l.ready)
	return l
}

// lastEpoch is the epoch of peer's link, without making one: the peer is
// not authenticated yet.
func (ln *Listener) lastEpoch(peer transfer.PeerID) uint64 {
	ln.mu.Lock()
	l := ln.mu.links[peer]
	ln.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.Epoch()
}

// Close stops accepting, waits for handshakes in progress and closes every
// link (links.Close: writes reported, final epochs delivered).
func (ln *Listener) Close() error {
	ln.mu.Lock()
	if ln.mu.closed {
		ln.mu.Unlock()
		return nil
	}
	ln.mu.closed = true
	for nc := range ln.mu.shakes {
		nc.Close()
	}
	ln.mu.Unlock()
	err := ln.ln.Close()
	ln.wg.Wait()
	ln.mu.Lock()
	links := make([]*Link, 0, len(ln.mu.links))
	for _, l := range ln.mu.links {
		links = append(links, l)
	}
	ln.mu.Unlock()
	for _, l := range links {
		l.Close()
	}
	return err
}

func (ln *Listener) acceptLoop() {
	defer ln.wg.Done()
	for {
		nc, err := ln.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			ln.cfg.log.Warn("transfer listener: accept", "err", err)
			time.Sleep(50 * time.Millisecond) // e.g. out of file descriptors: do not spin
			continue
		}
		select {
		case ln.slots <- struct{}{}:
		default:
			ln.cfg.log.Warn("transfer listener: too many handshakes in progress; connection dropped",
				"remote", nc.RemoteAddr().String())
			nc.Close()
			continue
		}
		ln.wg.Add(1)
		go func() {
			defer ln.wg.Done()
			defer func() { <-ln.slots }()
			ln.serve(nc)
		}()
	}
}

func (ln *Listener) serve(nc net.Conn) {
	ln.mu.Lock()
	if ln.mu.closed {
		ln.mu.Unlock()
		nc.Close()
		return
	}
	ln.mu.shakes[nc] = struct{}{}
	ln.mu.Unlock()
	hc, remote, err := ln.acceptHandshake(nc, time.Now().Add(ln.cfg.HandshakeTimeout))
	ln.mu.Lock()
	delete(ln.mu.shakes, nc)
	ln.mu.Unlock()
	if err != nil {
		nc.Close()
		ln.cfg.log.Warn("transfer listener: peer refused", "remote", nc.RemoteAddr().String(), "reason", err)
		return
	}
	ln.Link(remote.from).attach(hc, remote)
}
