package tcp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// FuzzReader feeds arbitrary bytes to a connection's reader as an
// authenticated peer would send them: it must end with an error (never a
// panic), and pool memory may change only through the open window.
func FuzzReader(f *testing.F) {
	auth, _ := transfer.NewAuth(testSecret)
	shape := kvpool.Shape{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: 2}
	pool, err := kvpool.New(kvpool.Config{Shape: shape, Pages: 4})
	if err != nil {
		f.Fatal(err)
	}
	w := &transfer.Write{Envelope: transfer.Envelope{Room: room(1)}, Key: 5, Page: 1, Data: make([]byte, shape.PageBytes()-kvpool.HeaderSize)}
	auth.Sign(w)
	d := &transfer.Drained{Envelope: transfer.Envelope{Room: room(2)}}
	auth.Sign(d)
	f.Add(transfer.Encode(w))
	f.Add(append(transfer.Encode(d), transfer.Encode(w)...))
	f.Add(appendAck(nil, 1, 0))
	f.Add(appendHello(nil, hello{from: 1, to: 2}, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(transfer.Encode(&transfer.PeerEpoch{Peer: 1, Epoch: 2}))
	f.Fuzz(func(t *testing.T, data []byte) {
		windows := transfer.NewWindowTable(0)
		windows.Open(5, room(1), []int32{1})
		outside := bytes.Clone(pool.PageBytes(2))
		sink := newRecSink()
		cfg, err := Config{Self: 1, Secret: testSecret, Sink: sink, MaxFrame: 1 << 16,
			Receiver: &link.Receiver{Pool: pool, Windows: windows, Auth: auth}}.resolve()
		if err != nil {
			t.Fatal(err)
		}
		l := newLink(cfg, 2, "")
		c := newConn(l, &netConn{br: bufio.NewReader(bytes.NewReader(data))})
		err = c.readLoop()
		if err == nil {
			t.Fatal("readLoop ended without an error")
		}
		var pe protocolError
		if !errors.As(err, &pe) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("unexpected error %v", err)
		}
		if !bytes.Equal(pool.PageBytes(2), outside) {
			t.Fatal("a page outside every window changed")
		}
		for _, e := range sink.snapshot() {
			if e.msg != nil && e.msg.Type() == transfer.TypeWrite {
				t.Fatal("a Write was delivered as a control message")
			}
		}
	})
}

// FuzzLinkFrames checks the link frame decoders: no panic, and whatever
// parses re-encodes to the same bytes.
func FuzzLinkFrames(f *testing.F) {
	h := hello{from: 1, to: 2, incarnation: 3, lastEpoch: 4}
	f.Add(appendHello(nil, h, nil)[4:])
	f.Add(appendHello(nil, h, make([]byte, proofSize))[4:])
	f.Add(appendProof(nil, make([]byte, proofSize))[4:])
	f.Add(appendAck(nil, 9, 1)[4:])
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, p, err := parseHello(b, false); err == nil {
			if !bytes.Equal(appendHello(nil, h, p)[4:], b) {
				t.Fatal("hello does not round-trip")
			}
		}
		if h, p, err := parseHello(b, true); err == nil {
			if !bytes.Equal(appendHello(nil, h, p)[4:], b) {
				t.Fatal("hello with proof does not round-trip")
			}
		}
		if p, err := parseProof(b); err == nil {
			if !bytes.Equal(appendProof(nil, p)[4:], b) {
				t.Fatal("proof does not round-trip")
			}
		}
		if len(b) > 0 && b[0] == linkVersion {
			if seq, st, err := parseAck(b); err == nil {
				if !bytes.Equal(appendAck(nil, seq, st)[4:], b) {
					t.Fatal("ack does not round-trip")
				}
			}
		}
	})
}
