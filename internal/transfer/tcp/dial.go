package tcp

import (
	"context"
	"math/rand/v2"
	"net"
	"time"

	"github.com/kvfence/kvfence/internal/transfer"
)

// Dial returns the link to peer, which listens at addr (host:port), and
// connects in the background: at once, and again with capped exponential
// backoff whenever the connection is lost, until Close. Send returns
// link.ErrPeerGone (and Post reports it) while no connection is up; the
// Sink's PeerEpoch says when one is.
func Dial(cfg Config, peer transfer.PeerID, addr string) (*Link, error) {
	rc, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	l := newLink(rc, peer, addr)
	ctx, cancel := context.WithCancel(context.Background())
	l.cancelDial = cancel
	l.dialDone = make(chan struct{})
	go l.dialLoop(ctx)
	return l, nil
}

func (l *Link) dialLoop(ctx context.Context) {
	defer close(l.dialDone)
	cfg := l.cfg
	backoff := cfg.MinBackoff
	wait := func() bool {
		d := backoff/2 + rand.N(backoff/2+1) // jitter: peers that lost one decode worker do not redial in step
		backoff = min(2*backoff, cfg.MaxBackoff)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		nc, remote, err := l.dialOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			cfg.log.Debug("transfer link: dial failed", "self", cfg.Self, "peer", l.peer, "addr", l.addr, "err", err)
			if !wait() {
				return
			}
			continue
		}
		c := l.attach(nc, remote)
		if c == nil {
			return
		}
		up := time.Now()
		select {
		case <-c.retiredCh:
		case <-ctx.Done():
			return
		}
		if time.Since(up) > cfg.MaxBackoff {
			backoff = cfg.MinBackoff
		}
		if !wait() {
			return
		}
	}
}

func (l *Link) dialOnce(ctx context.Context) (*netConn, hello, error) {
	deadline := time.Now().Add(l.cfg.HandshakeTimeout)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", l.addr)
	if err != nil {
		return nil, hello{}, err
	}
	// Closing the socket is how a Close interrupts a handshake in progress.
	stop := context.AfterFunc(dctx, func() { nc.Close() })
	hc, remote, err := l.dialHandshake(nc, deadline)
	if !stop() || err != nil {
		nc.Close()
		if err == nil {
			err = dctx.Err()
		}
		return nil, hello{}, err
	}
	return hc, remote, nil
}
