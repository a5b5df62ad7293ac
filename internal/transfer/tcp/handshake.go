package tcp

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/kvfence/kvfence/internal/transfer"
)

// errAuth is a handshake whose proof does not verify: the peer does not
// hold the cluster secret (or is replaying someone else's handshake).
var errAuth = errors.New("tcp: handshake proof does not verify (wrong cluster secret?)")

// readSmallFrame reads one frame of at most limit bytes (with its prefix)
// and returns it without the length prefix.
func readSmallFrame(br *bufio.Reader, limit int) ([]byte, error) {
	var pre [4]byte
	if _, err := io.ReadFull(br, pre[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(pre[:])
	if uint64(n)+4 > uint64(limit) {
		return nil, malformed("handshake frame of %d bytes", n)
	}
	f := make([]byte, n)
	if _, err := io.ReadFull(br, f); err != nil {
		return nil, err
	}
	return f, nil
}

func (l *Link) localHello(to transfer.PeerID) hello {
	h := hello{from: l.cfg.Self, to: to, incarnation: l.cfg.Incarnation, lastEpoch: l.Epoch()}
	rand.Read(h.nonce[:])
	return h
}

// dialHandshake runs the dialer's side on a fresh connection.
func (l *Link) dialHandshake(nc net.Conn, deadline time.Time) (*netConn, hello, error) {
	nc.SetDeadline(deadline)
	br := bufio.NewReaderSize(nc, 64<<10)
	mine := l.localHello(l.peer)
	if _, err := nc.Write(appendHello(nil, mine, nil)); err != nil {
		return nil, hello{}, err
	}
	f, err := readSmallFrame(br, maxHandshakeFrame)
	if err != nil {
		return nil, hello{}, err
	}
	theirs, proof, err := parseHello(f, true)
	if err != nil {
		return nil, hello{}, err
	}
	if !hmac.Equal(proof, handshakeMAC(l.cfg.Secret, "listener", mine, theirs)) {
		return nil, hello{}, errAuth
	}
	if theirs.from != l.peer || theirs.to != l.cfg.Self {
		return nil, hello{}, fmt.Errorf("tcp: listener says it is peer %d talking to %d, want %d talking to %d",
			theirs.from, theirs.to, l.peer, l.cfg.Self)
	}
	if _, err := nc.Write(appendProof(nil, handshakeMAC(l.cfg.Secret, "dialer", mine, theirs))); err != nil {
		return nil, hello{}, err
	}
	nc.SetDeadline(time.Time{})
	return &netConn{Conn: nc, br: br}, theirs, nil
}

// acceptHandshake runs the listener's side; lookup gives the link of the
// peer the dialer claims to be (for its last epoch).
func (ln *Listener) acceptHandshake(nc net.Conn, deadline time.Time) (*netConn, hello, error) {
	cfg := ln.cfg
	nc.SetDeadline(deadline)
	br := bufio.NewReaderSize(nc, 64<<10)
	f, err := readSmallFrame(br, helloFrame)
	if err != nil {
		return nil, hello{}, err
	}
	theirs, _, err := parseHello(f, false)
	if err != nil {
		return nil, hello{}, err
	}
	if theirs.to != cfg.Self || theirs.from == cfg.Self {
		return nil, hello{}, fmt.Errorf("tcp: dialer %d asks for peer %d, this is %d", theirs.from, theirs.to, cfg.Self)
	}
	mine := hello{from: cfg.Self, to: theirs.from, incarnation: cfg.Incarnation, lastEpoch: ln.lastEpoch(theirs.from)}
	rand.Read(mine.nonce[:])
	if _, err := nc.Write(appendHello(nil, mine, handshakeMAC(cfg.Secret, "listener", theirs, mine))); err != nil {
		return nil, hello{}, err
	}
	f, err = readSmallFrame(br, proofFrame)
	if err != nil {
		return nil, hello{}, err
	}
	proof, err := parseProof(f)
	if err != nil {
		return nil, hello{}, err
	}
	if !hmac.Equal(proof, handshakeMAC(cfg.Secret, "dialer", theirs, mine)) {
		return nil, hello{}, errAuth
	}
	nc.SetDeadline(time.Time{})
	return &netConn{Conn: nc, br: br}, theirs, nil
}
