package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

var testSecret = []byte("kvfence-test-cluster-secret-0123")

const (
	decodeID  transfer.PeerID = 7
	prefillID transfer.PeerID = 3
)

// event is one thing a sink received, in order.
type event struct {
	from   transfer.PeerID
	msg    transfer.Message // Deliver
	report *link.Report     // Landed
}

// recSink records what a link hands a worker. It never blocks.
type recSink struct {
	mu     sync.Mutex
	events []event
	poke   chan struct{}
}

func newRecSink() *recSink { return &recSink{poke: make(chan struct{}, 1)} }

func (s *recSink) add(e event) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

func (s *recSink) Deliver(from transfer.PeerID, m transfer.Message) { s.add(event{from: from, msg: m}) }
func (s *recSink) Landed(r link.Report)                             { s.add(event{report: &r}) }

func (s *recSink) snapshot() []event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]event(nil), s.events...)
}

// waitFor waits until cond holds for the events so far.
func (s *recSink) waitFor(t *testing.T, what string, cond func([]event) bool) []event {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		ev := s.snapshot()
		if cond(ev) {
			return ev
		}
		select {
		case <-s.poke:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s; have %d events: %s", what, len(ev), describe(ev))
		}
	}
}

func describe(ev []event) string {
	var b bytes.Buffer
	for i, e := range ev {
		if i > 12 {
			fmt.Fprintf(&b, "... ")
			break
		}
		if e.msg != nil {
			fmt.Fprintf(&b, "[%v] ", e.msg)
		} else {
			fmt.Fprintf(&b, "[landed %d %v] ", e.report.Seq, e.report.Err)
		}
	}
	return b.String()
}

func epochs(ev []event) []uint64 {
	var out []uint64
	for _, e := range ev {
		if pe, ok := e.msg.(*transfer.PeerEpoch); ok {
			out = append(out, pe.Epoch)
		}
	}
	return out
}

func hasEpoch(n int) func([]event) bool {
	return func(ev []event) bool { return len(epochs(ev)) >= n }
}

func reports(ev []event) []link.Report {
	var out []link.Report
	for _, e := range ev {
		if e.report != nil {
			out = append(out, *e.report)
		}
	}
	return out
}

func controls(ev []event) []transfer.Message {
	var out []transfer.Message
	for _, e := range ev {
		if e.msg != nil && e.msg.Type() != transfer.TypePeerEpoch {
			out = append(out, e.msg)
		}
	}
	return out
}

// fixture is one prefill worker linked to one decode worker on loopback.
type fixture struct {
	auth             *transfer.Auth
	decPool, prePool *kvpool.Pool
	windows          *transfer.WindowTable
	ln               *Listener
	pre              *Link // the prefill side's link (dialer)
	dec              *Link // the decode side's link to the prefill worker
	decSink, preSink *recSink
	onLink           []*Link // links the listener announced
}

var testShape = kvpool.Shape{Layers: 2, KVHeads: 2, HeadDim: 8, PageSize: 4}

type fixOpts struct {
	shape       kvpool.Shape
	pages       int
	queueFrames int
	hookLand    func()
	noConnect   bool
}

func newFixture(t testing.TB, o fixOpts) *fixture {
	t.Helper()
	if o.shape == (kvpool.Shape{}) {
		o.shape = testShape
	}
	if o.pages == 0 {
		o.pages = 16
	}
	auth, err := transfer.NewAuth(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{auth: auth, windows: transfer.NewWindowTable(0), decSink: newRecSink(), preSink: newRecSink()}
	if f.decPool, err = kvpool.New(kvpool.Config{Shape: o.shape, Pages: o.pages}); err != nil {
		t.Fatal(err)
	}
	if f.prePool, err = kvpool.New(kvpool.Config{Shape: o.shape, Pages: o.pages}); err != nil {
		t.Fatal(err)
	}
	f.ln, err = Listen(Config{
		Self: decodeID, Secret: testSecret, Sink: f.decSink,
		Receiver:    &link.Receiver{Pool: f.decPool, Windows: f.windows, Auth: auth},
		QueueFrames: o.queueFrames,
		OnLink:      func(l *Link) { f.onLink = append(f.onLink, l) },
	}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.ln.cfg.testHookLand = o.hookLand
	f.dec = f.ln.Link(prefillID)
	t.Cleanup(func() { f.ln.Close() })
	if o.noConnect {
		return f
	}
	f.pre, err = Dial(Config{Self: prefillID, Secret: testSecret, Sink: f.preSink, QueueFrames: o.queueFrames,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, decodeID, f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.pre.Close() })
	f.preSink.waitFor(t.(*testing.T), "prefill side connected", hasEpoch(1))
	f.decSink.waitFor(t.(*testing.T), "decode side connected", hasEpoch(1))
	return f
}

func room(i int) transfer.RoomID {
	var r transfer.RoomID
	r[0], r[1], r[15] = byte(i), byte(i>>8), 0xAA
	return r
}

// write makes a signed write of local prefill page `local` into decode
// page `page` under key, with recognisable data.
func (f *fixture) write(key transfer.WindowKey, rm transfer.RoomID, local, page int32, seq uint64, fill byte) transfer.PostWrite {
	data := f.prePool.PageData(local)
	for i := range data {
		data[i] = fill + byte(i*7)
	}
	w := &transfer.Write{Envelope: transfer.Envelope{Room: rm}, Key: key, Page: page, Data: data}
	for i := range w.Header {
		w.Header[i] = fill ^ byte(i)
	}
	f.auth.Sign(w)
	return transfer.PostWrite{To: decodeID, Seq: seq, LocalPage: local, Msg: w}
}

func TestWriteHeadIsEncodePrefix(t *testing.T) {
	f := newFixture(t, fixOpts{noConnect: true})
	pw := f.write(9, room(1), 2, 5, 1, 0x33)
	want := transfer.Encode(pw.Msg)
	head := appendWriteHead([]byte("junk"), pw.Msg)[4:]
	if len(head) != writeHeadLen {
		t.Fatalf("head is %d bytes, want %d", len(head), writeHeadLen)
	}
	if !bytes.Equal(append(head, pw.Msg.Data...), want) {
		t.Fatal("head + data differs from transfer.Encode")
	}
}

func TestOrderedDeliveryBothWays(t *testing.T) {
	f := newFixture(t, fixOpts{})
	if len(f.onLink) != 1 || f.onLink[0] != f.dec || f.ln.Link(prefillID) != f.dec {
		t.Fatalf("OnLink announced %v, want the one link to the prefill worker", f.onLink)
	}
	if got := epochs(f.preSink.snapshot()); len(got) != 1 || got[0] != 1 {
		t.Fatalf("prefill epochs %v, want [1]", got)
	}
	if got := epochs(f.decSink.snapshot()); len(got) != 1 || got[0] != 1 {
		t.Fatalf("decode epochs %v, want [1]", got)
	}
	for _, e := range f.decSink.snapshot() {
		if pe := e.msg.(*transfer.PeerEpoch); pe.Peer != prefillID || !f.auth.Verify(pe) || e.from != prefillID {
			t.Fatalf("decode side PeerEpoch %v from %d: wrong peer or MAC", pe, e.from)
		}
	}
	const n = 300
	ctx := context.Background()
	var toDec, toPre [][]byte
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range n {
			var m transfer.Message
			switch i % 3 {
			case 0:
				m = &transfer.Drained{Envelope: transfer.Envelope{Room: room(i)}}
			case 1:
				m = &transfer.Done{Envelope: transfer.Envelope{Room: room(i)}, Pages: uint32(i), Tokens: 3, Checksums: []uint32{uint32(i), 9}}
			default:
				m = &transfer.Reject{Envelope: transfer.Envelope{Room: room(i)}, Kind: reqerr.KindContextLength, Prompt: uint32(i), Limit: 8}
			}
			f.auth.Sign(m)
			toDec = append(toDec, transfer.Encode(m))
			if err := f.pre.Send(ctx, m); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := range n {
			m := &transfer.Grant{Envelope: transfer.Envelope{Room: room(i)}, Key: transfer.WindowKey(i), PromptTokens: 5,
				PageCount: 2, Pages: []int32{int32(i), 1}, Epochs: []uint64{4, uint64(i)}}
			f.auth.Sign(m)
			toPre = append(toPre, transfer.Encode(m))
			if err := f.dec.Send(ctx, m); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	check := func(s *recSink, sent [][]byte, from transfer.PeerID) {
		ev := s.waitFor(t, "all messages", func(ev []event) bool { return len(controls(ev)) >= n })
		got := controls(ev)
		if len(got) != n {
			t.Fatalf("got %d messages, want %d", len(got), n)
		}
		for i, m := range got {
			if !bytes.Equal(transfer.Encode(m), sent[i]) {
				t.Fatalf("message %d is %v, not what was sent %d-th", i, m, i)
			}
			if !f.auth.Verify(m) {
				t.Fatalf("message %d lost its MAC", i)
			}
		}
		for _, e := range ev {
			if e.msg != nil && e.from != from {
				t.Fatalf("message from %d, want %d", e.from, from)
			}
		}
	}
	check(f.decSink, toDec, prefillID)
	check(f.preSink, toPre, decodeID)
}

func TestWritesLandExactlyAndBeforeLaterMessages(t *testing.T) {
	f := newFixture(t, fixOpts{})
	rm := room(1)
	pages := []int32{3, 4, 5, 6, 7, 8}
	f.windows.Open(41, rm, pages)
	ctx := context.Background()
	var posted []transfer.PostWrite
	for i, pg := range pages {
		pw := f.write(41, rm, int32(i), pg, uint64(100+i), byte(16*i+1))
		posted = append(posted, pw)
		f.pre.Post(ctx, pw)
	}
	done := &transfer.Done{Envelope: transfer.Envelope{Room: rm}, Pages: uint32(len(pages))}
	f.auth.Sign(done)
	if err := f.pre.Send(ctx, done); err != nil {
		t.Fatal(err)
	}
	// The Done follows the writes on the link: when it is delivered every
	// write has landed. Check the pool the moment the Done shows up.
	var snap [][]byte
	f.decSink.waitFor(t, "Done", func(ev []event) bool {
		if len(controls(ev)) == 0 {
			return false
		}
		for _, pg := range pages {
			snap = append(snap, bytes.Clone(f.decPool.PageBytes(pg)))
		}
		return true
	})
	for i, pw := range posted {
		want := append(pw.Msg.Header[:], pw.Msg.Data...)
		if !bytes.Equal(snap[i], want) {
			t.Fatalf("decode page %d does not hold write %d's header and data", pages[i], i)
		}
	}
	ev := f.preSink.waitFor(t, "reports", func(ev []event) bool { return len(reports(ev)) == len(pages) })
	seen := map[uint64]int{}
	for _, r := range reports(ev) {
		if r.Err != nil || r.Room != rm {
			t.Fatalf("report %+v, want applied for room 1", r)
		}
		seen[r.Seq]++
	}
	for i := range pages {
		if seen[uint64(100+i)] != 1 {
			t.Fatalf("write seq %d reported %d times", 100+i, seen[uint64(100+i)])
		}
	}
	if s := f.dec.Stats(); s.Landed != uint64(len(pages)) || s.Refused != 0 {
		t.Fatalf("receiver stats %+v", s)
	}
}

func TestRefusedWritesAreReportedAndTouchNothing(t *testing.T) {
	f := newFixture(t, fixOpts{})
	rm := room(2)
	f.windows.Open(50, rm, []int32{1, 2})
	f.windows.Open(51, rm, []int32{3})
	f.windows.Revoke(51)
	before := bytes.Clone(f.decPool.PageBytes(3))
	beforeOut := bytes.Clone(f.decPool.PageBytes(9))
	badMAC := f.write(50, rm, 4, 2, 4, 0x77)
	badMAC.Msg.MAC[0] ^= 1
	tests := []struct {
		name string
		pw   transfer.PostWrite
		want error // nil: applied
	}{
		{"revoked window", f.write(51, rm, 0, 3, 1, 0x11), transfer.ErrNoWindow},
		{"never opened", f.write(999, rm, 1, 3, 2, 0x22), transfer.ErrNoWindow},
		{"page outside window", f.write(50, rm, 2, 9, 3, 0x33), transfer.ErrPageNotInWindow},
		{"bad MAC", badMAC, errBadMAC},
		{"open window", f.write(50, rm, 3, 1, 5, 0x44), nil},
	}
	for _, tt := range tests {
		f.pre.Post(context.Background(), tt.pw)
	}
	ev := f.preSink.waitFor(t, "reports", func(ev []event) bool { return len(reports(ev)) == len(tests) })
	bySeq := map[uint64]error{}
	for _, r := range reports(ev) {
		bySeq[r.Seq] = r.Err
	}
	for _, tt := range tests {
		err := bySeq[tt.pw.Seq]
		if tt.want == nil {
			if err != nil {
				t.Errorf("%s: %v, want applied", tt.name, err)
			}
			continue
		}
		if !errors.Is(err, link.ErrRefused) || !errors.Is(err, tt.want) {
			t.Errorf("%s: report %v, want ErrRefused wrapping %v", tt.name, err, tt.want)
		}
	}
	if !bytes.Equal(f.decPool.PageBytes(3), before) || !bytes.Equal(f.decPool.PageBytes(9), beforeOut) {
		t.Fatal("a refused write changed pool memory")
	}
	if !bytes.Equal(f.decPool.PageData(1), tests[4].pw.Msg.Data) {
		t.Fatal("the write through the open window did not land")
	}
	if s := f.pre.Stats(); s.WritesRefused != 4 || s.WritesApplied != 1 {
		t.Fatalf("sender stats %+v", s)
	}
}

// TestLossReportsOutstandingWritesOnceThenEpoch stalls the receiver inside
// its first write, kills the connection from the sending side, and checks
// that every posted write is reported lost exactly once before the new
// epoch, on both sides, and that the dialer reconnects.
func TestLossReportsOutstandingWritesOnceThenEpoch(t *testing.T) {
	stall := make(chan struct{})
	entered := make(chan struct{}, 1)
	var once sync.Once
	f := newFixture(t, fixOpts{hookLand: func() {
		select {
		case entered <- struct{}{}:
		default:
		}
		once.Do(func() { <-stall })
	}})
	rm := room(3)
	f.windows.Open(60, rm, []int32{0, 1, 2, 3, 4, 5, 6, 7})
	const n = 8
	for i := range n {
		f.pre.Post(context.Background(), f.write(60, rm, int32(i), int32(i), uint64(i+1), byte(i)))
	}
	<-entered
	f.pre.Disconnect()
	ev := f.preSink.waitFor(t, "loss epoch on the prefill side", hasEpoch(2))
	// Every write is reported lost, exactly once, before the loss epoch.
	seen := map[uint64]int{}
	lossAt := -1
	for i, e := range ev {
		if pe, ok := e.msg.(*transfer.PeerEpoch); ok && pe.Epoch == 2 {
			lossAt = i
			break
		}
		if e.report != nil {
			if !errors.Is(e.report.Err, link.ErrPeerGone) {
				t.Fatalf("write %d reported %v, want ErrPeerGone", e.report.Seq, e.report.Err)
			}
			seen[e.report.Seq]++
		}
	}
	if lossAt < 0 || len(seen) != n {
		t.Fatalf("before the loss epoch: %d writes reported, want %d (%s)", len(seen), n, describe(ev))
	}
	for seq, k := range seen {
		if k != 1 {
			t.Fatalf("write %d reported %d times", seq, k)
		}
	}
	// The decode side's epoch waits for its reader, stalled in a write.
	if got := epochs(f.decSink.snapshot()); len(got) != 1 {
		t.Fatalf("decode side saw epochs %v while its reader was still landing a write", got)
	}
	close(stall)
	f.decSink.waitFor(t, "loss epoch on the decode side", hasEpoch(2))
	pev := f.preSink.waitFor(t, "reconnect on the prefill side", hasEpoch(3))
	dev := f.decSink.waitFor(t, "reconnect on the decode side", hasEpoch(3))
	for _, ep := range [][]uint64{epochs(pev), epochs(dev)} {
		for i := 1; i < len(ep); i++ {
			if ep[i] <= ep[i-1] {
				t.Fatalf("epochs not strictly increasing: %v", ep)
			}
		}
	}
	if r := reports(f.preSink.snapshot()); len(r) != n {
		t.Fatalf("%d reports after reconnect, want %d", len(r), n)
	}
	// The new connection works.
	f.pre.Post(context.Background(), f.write(60, rm, 0, 0, 99, 0x5A))
	f.preSink.waitFor(t, "write on the new connection", func(ev []event) bool {
		r := reports(ev)
		return len(r) == n+1 && r[n].Seq == 99 && r[n].Err == nil
	})
}

func TestLossMidStreamUnderLoad(t *testing.T) {
	f := newFixture(t, fixOpts{shape: kvpool.Shape{Layers: 4, KVHeads: 4, HeadDim: 64, PageSize: 16}, pages: 32})
	rm := room(4)
	pages := make([]int32, 32)
	for i := range pages {
		pages[i] = int32(i)
	}
	f.windows.Open(70, rm, pages)
	const n = 400
	go func() {
		time.Sleep(time.Millisecond)
		f.dec.Disconnect() // from the receiving side this time
	}()
	for i := range n {
		f.pre.Post(context.Background(), f.write(70, rm, int32(i%32), int32(i%32), uint64(i+1), byte(i)))
	}
	ev := f.preSink.waitFor(t, "every write reported", func(ev []event) bool { return len(reports(ev)) == n })
	seen := map[uint64]int{}
	for _, r := range reports(ev) {
		seen[r.Seq]++
		if r.Err != nil && !errors.Is(r.Err, link.ErrPeerGone) {
			t.Fatalf("report %v", r.Err)
		}
	}
	for i := 1; i <= n; i++ {
		if seen[uint64(i)] != 1 {
			t.Fatalf("write %d reported %d times", i, seen[uint64(i)])
		}
	}
	f.decSink.waitFor(t, "decode loss epoch", hasEpoch(2))
	f.preSink.waitFor(t, "prefill loss epoch", hasEpoch(2))
}

func TestCloseReportsAndEndsDelivery(t *testing.T) {
	f := newFixture(t, fixOpts{})
	f.pre.Close()
	ev := f.preSink.snapshot()
	if got := epochs(ev); len(got) != 2 || got[1] != 2 {
		t.Fatalf("prefill epochs after Close %v, want [1 2]", got)
	}
	m := &transfer.Drained{Envelope: transfer.Envelope{Room: room(1)}}
	f.auth.Sign(m)
	if err := f.pre.Send(context.Background(), m); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	f.pre.Post(context.Background(), f.write(1, room(1), 0, 0, 5, 1))
	r := reports(f.preSink.snapshot())
	if len(r) != 1 || !errors.Is(r[0].Err, link.ErrClosed) {
		t.Fatalf("Post after Close reported %v", r)
	}
	f.decSink.waitFor(t, "decode side sees the loss", hasEpoch(2))
	if err := f.dec.Send(context.Background(), m); !errors.Is(err, link.ErrPeerGone) {
		t.Fatalf("decode Send to a gone peer: %v", err)
	}
	if len(f.preSink.snapshot()) != len(ev)+1 {
		t.Fatal("something was delivered after Close returned")
	}
}

func TestBackpressureBlocksPostUntilCtx(t *testing.T) {
	stall := make(chan struct{})
	f := newFixture(t, fixOpts{queueFrames: 4, hookLand: func() { <-stall }})
	defer close(stall)
	rm := room(5)
	f.windows.Open(80, rm, []int32{0, 1, 2, 3, 4})
	for i := range 4 {
		f.pre.Post(context.Background(), f.write(80, rm, int32(i), int32(i), uint64(i+1), 1))
	}
	// Four writes are unacknowledged: the queue is full and the fifth
	// waits for room until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	f.pre.Post(ctx, f.write(80, rm, 4, 4, 5, 1))
	r := reports(f.preSink.snapshot())
	if len(r) != 1 || r[0].Seq != 5 || !errors.Is(r[0].Err, context.DeadlineExceeded) {
		t.Fatalf("reports %+v, want only write 5 with DeadlineExceeded", r)
	}
	m := &transfer.Drained{Envelope: transfer.Envelope{Room: rm}}
	f.auth.Sign(m)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	if err := f.pre.Send(ctx2, m); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send on a full queue: %v", err)
	}
}

func TestHandshakeRefusesStrangers(t *testing.T) {
	f := newFixture(t, fixOpts{noConnect: true})
	tests := []struct {
		name   string
		secret []byte
		self   transfer.PeerID
		peer   transfer.PeerID
	}{
		{"wrong secret", []byte("another-cluster-secret-00000000"), prefillID, decodeID},
		{"wrong listener id", testSecret, prefillID, decodeID + 1},
		{"impersonates the listener", testSecret, decodeID, decodeID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := newRecSink()
			l, err := Dial(Config{Self: tt.self, Secret: tt.secret, Sink: sink,
				MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, tt.peer, f.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // several attempts
			l.Close()
			if len(sink.snapshot()) != 0 || l.Stats().Connections != 0 {
				t.Fatalf("refused dialer got %s", describe(sink.snapshot()))
			}
			if ev := f.decSink.snapshot(); len(ev) != 0 {
				t.Fatalf("listener delivered %s to a stranger's link", describe(ev))
			}
		})
	}
	// A listener with another secret is refused by an honest dialer.
	other, err := Listen(Config{Self: decodeID, Secret: []byte("another-cluster-secret-00000000"), Sink: newRecSink()}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	sink := newRecSink()
	l, err := Dial(Config{Self: prefillID, Secret: testSecret, Sink: sink, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond},
		decodeID, other.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	l.Close()
	if l.Stats().Connections != 0 || len(sink.snapshot()) != 0 {
		t.Fatal("dialer accepted a listener without the cluster secret")
	}
}

// authedConn is a raw connection that passed the handshake, for feeding
// the listener bytes no honest peer sends.
func authedConn(t *testing.T, f *fixture) net.Conn {
	t.Helper()
	cfg, err := Config{Self: prefillID, Secret: testSecret, Sink: newRecSink()}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	l := newLink(cfg, decodeID, "")
	nc, err := net.Dial("tcp", f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.dialHandshake(nc, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	return nc
}

func TestMalformedFramesCloseTheConnection(t *testing.T) {
	f := newFixture(t, fixOpts{noConnect: true})
	valid := &transfer.Drained{Envelope: transfer.Envelope{Room: room(1)}}
	f.auth.Sign(valid)
	good := transfer.Encode(valid)
	bad := func(mut func([]byte) []byte) []byte { return mut(bytes.Clone(good)) }
	tests := []struct {
		name  string
		bytes []byte
	}{
		{"unknown version", bad(func(b []byte) []byte { b[4] = 9; return b })},
		{"unknown type", bad(func(b []byte) []byte { b[5] = 77; return b })},
		{"length beyond MaxFrame", []byte{0xff, 0xff, 0xff, 0x7f, 1}},
		{"tiny length", []byte{1, 0, 0, 0, 1}},
		{"long body", bad(func(b []byte) []byte { b[0]++; return append(b, 0) })},
		{"ack nobody waits for", appendAck(nil, 1, ackApplied)},
		{"hello after the handshake", appendHello(nil, hello{}, nil)},
		{"peer epoch from the peer", transfer.Encode(&transfer.PeerEpoch{Peer: 1, Epoch: 9})},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc := authedConn(t, f)
			defer nc.Close()
			nc.Write(good) // delivered: the connection works until the bad frame
			nc.Write(tt.bytes)
			nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, nc); err != nil {
				t.Fatalf("connection not closed by the listener: %v", err)
			}
			f.decSink.waitFor(t, "loss epoch", hasEpoch(2*(i+1)))
			if got := f.dec.Stats().ProtocolErrors; got != uint64(i+1) {
				t.Fatalf("protocol errors %d, want %d", got, i+1)
			}
		})
	}
	if got := len(controls(f.decSink.snapshot())); got != len(tests) {
		t.Fatalf("%d good frames delivered, want %d", got, len(tests))
	}
}

// TestRandomBytesDoNotCrashTheListener feeds the listener random and
// truncated byte streams, before and after authentication, then checks
// that an honest peer still connects.
func TestRandomBytesDoNotCrashTheListener(t *testing.T) {
	f := newFixture(t, fixOpts{noConnect: true})
	rng := rand.New(rand.NewPCG(1, 2))
	valid := &transfer.Grant{Envelope: transfer.Envelope{Room: room(1)}, Pages: []int32{1}, Epochs: []uint64{2}}
	f.auth.Sign(valid)
	frame := transfer.Encode(valid)
	var wg sync.WaitGroup
	for i := range 60 {
		var b []byte
		switch i % 4 {
		case 0: // noise
			b = make([]byte, rng.IntN(300))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
		case 1: // a truncated hello
			h := appendHello(nil, hello{from: 1, to: decodeID}, nil)
			b = h[:rng.IntN(len(h))]
		case 2: // a hello with a wrong length prefix
			b = appendHello(nil, hello{from: 1, to: decodeID}, nil)
			b[rng.IntN(4)] ^= byte(1 + rng.IntN(255))
		case 3: // a transfer frame where a hello belongs
			b = frame
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := net.Dial("tcp", f.ln.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			nc.Write(b)
			if i%2 == 0 {
				nc.(*net.TCPConn).CloseWrite() // truncated: the peer stops mid-frame
			}
			nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.Copy(io.Discard, nc)
		}()
	}
	wg.Wait()
	// Authenticated peers sending noise.
	for i := range 20 {
		nc := authedConn(t, f)
		n := 1 + rng.IntN(200)
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if i%2 == 0 {
			b = append(frame[:rng.IntN(len(frame))], b...) // a truncated frame, then noise
		}
		nc.Write(b)
		nc.(*net.TCPConn).CloseWrite()
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, nc)
		nc.Close()
	}
	if n := len(controls(f.decSink.snapshot())); n > 20 {
		t.Fatalf("%d messages delivered from noise", n)
	}
	// The listener still serves an honest peer.
	sink := newRecSink()
	l, err := Dial(Config{Self: prefillID, Secret: testSecret, Sink: sink}, decodeID, f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sink.waitFor(t, "honest peer connects", hasEpoch(1))
	m := &transfer.Drained{Envelope: transfer.Envelope{Room: room(42)}}
	f.auth.Sign(m)
	if err := l.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	f.decSink.waitFor(t, "honest message", func(ev []event) bool {
		c := controls(ev)
		return len(c) > 0 && c[len(c)-1].Env().Room == room(42)
	})
}

func TestWaitConnected(t *testing.T) {
	f := newFixture(t, fixOpts{noConnect: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := f.dec.WaitConnected(ctx); err != context.DeadlineExceeded {
		t.Fatalf("WaitConnected with no peer: %v", err)
	}
	l, err := Dial(Config{Self: prefillID, Secret: testSecret, Sink: newRecSink()}, decodeID, f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WaitConnected(context.Background()); err != nil || !l.Connected() {
		t.Fatalf("WaitConnected: %v", err)
	}
	if err := f.dec.WaitConnected(context.Background()); err != nil {
		t.Fatalf("listener side WaitConnected: %v", err)
	}
	l.Close()
	if err := l.WaitConnected(context.Background()); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("WaitConnected after Close: %v", err)
	}
}
