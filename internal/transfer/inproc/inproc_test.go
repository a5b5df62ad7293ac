package inproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

const (
	pID transfer.PeerID = 1
	dID transfer.PeerID = 2
)

// sink records what a link delivers, in order.
type sink struct {
	mu     sync.Mutex
	events []string
	// hold, when set, blocks Deliver of non-epoch messages until closed
	// (a contract violation the tests use to keep a queue full).
	hold chan struct{}
}

func (s *sink) Deliver(from transfer.PeerID, m transfer.Message) {
	if pe, ok := m.(*transfer.PeerEpoch); ok {
		s.add(fmt.Sprintf("epoch %d peer %d from %d", pe.Epoch, pe.Peer, from))
		return
	}
	if s.hold != nil {
		<-s.hold
	}
	s.add(fmt.Sprintf("%v room %x from %d", m.Type(), m.Env().Room[0], from))
}

func (s *sink) Landed(r link.Report) {
	e := "nil"
	switch {
	case r.Err == nil:
	case errors.Is(r.Err, link.ErrRefused):
		e = "refused"
	default:
		e = r.Err.Error()
	}
	s.add(fmt.Sprintf("landed %d room %x: %s", r.Seq, r.Room[0], e))
}

func (s *sink) add(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *sink) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

// waitFor polls until s has n events.
func (s *sink) waitFor(t *testing.T, n int) []string {
	t.Helper()
	for range 10000 {
		if ev := s.got(); len(ev) >= n {
			return ev
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatalf("sink has %v, want %d events", s.got(), n)
	return nil
}

type env struct {
	auth       *transfer.Auth
	src, dst   *kvpool.Pool
	windows    *transfer.WindowTable
	ps, ds     *sink
	pair       *Pair
	P, D       *End
	srcPage    int32
	dstPages   []int32
	room       transfer.RoomID
	key        transfer.WindowKey
	prefillCtx context.Context
}

func newEnv(t *testing.T, queue int, hold chan struct{}) *env {
	auth, err := transfer.NewAuth([]byte("inproc test secret of 32 bytes.."))
	if err != nil {
		t.Fatal(err)
	}
	shape := kvpool.Shape{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: 2}
	mk := func() *kvpool.Pool {
		p, err := kvpool.New(kvpool.Config{Shape: shape, Pages: 4})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	e := &env{auth: auth, src: mk(), dst: mk(), windows: transfer.NewWindowTable(0), ps: &sink{}, ds: &sink{hold: hold}, room: transfer.RoomID{0xaa}, key: 7}
	e.pair = New(Config{Auth: auth, QueueLen: queue}, Side{ID: pID, Sink: e.ps}, Side{ID: dID, Sink: e.ds},
		link.Receiver{Pool: e.dst, Windows: e.windows, Auth: auth})
	e.P, e.D = e.pair.Prefill(), e.pair.Decode()
	src, _ := e.src.Alloc(e.room, 1, nil)
	e.srcPage = src[0]
	k, _ := e.src.LayerKV(e.srcPage, 0)
	for i := range k {
		k[i] = float32(i) + 0.5
	}
	e.dstPages, _ = e.dst.Alloc(e.room, 2, nil)
	e.windows.Open(e.key, e.room, e.dstPages)
	return e
}

func (e *env) write(seq uint64, page int32) transfer.PostWrite {
	h := kvpool.Header{Fence: e.dst.Expected(page), Page: page, Tokens: 2}
	w := &transfer.Write{Envelope: transfer.Envelope{Room: e.room}, Key: e.key, Page: page, Header: e.src.Seal(e.srcPage, h), Data: e.src.PageData(e.srcPage)}
	e.auth.Sign(w)
	return transfer.PostWrite{To: dID, Seq: seq, LocalPage: e.srcPage, Msg: w}
}

func (e *env) msg(room byte) transfer.Message {
	m := &transfer.Drained{Envelope: transfer.Envelope{Room: transfer.RoomID{room}}}
	e.auth.Sign(m)
	return m
}

func TestDeliveryOrderAndWrites(t *testing.T) {
	e := newEnv(t, 4, nil)
	defer e.P.Close()
	ctx := t.Context()
	if e.P.Local() != pID || e.P.Peer() != dID || e.D.Local() != dID || e.D.Peer() != pID || e.P.Epoch() != 1 {
		t.Fatalf("ids %d %d %d %d epoch %d", e.P.Local(), e.P.Peer(), e.D.Local(), e.D.Peer(), e.P.Epoch())
	}
	// Messages and writes share one FIFO per direction.
	for i := range 20 {
		if err := e.P.Send(ctx, e.msg(byte(i))); err != nil {
			t.Fatal(err)
		}
		if err := e.D.Send(ctx, e.msg(byte(100+i))); err != nil {
			t.Fatal(err)
		}
	}
	e.P.Post(ctx, e.write(1, e.dstPages[1]))
	ds := e.ds.waitFor(t, 21)
	all := e.ps.waitFor(t, 22)
	// Reports and deliveries to the prefill side come from different
	// directions: only each one's own order is defined.
	var ps []string
	var reports []string
	for _, ev := range all {
		if strings.HasPrefix(ev, "landed") {
			reports = append(reports, ev)
		} else {
			ps = append(ps, ev)
		}
	}
	for i := range 20 {
		if want := fmt.Sprintf("Drained room %x from %d", i, pID); ds[1+i] != want {
			t.Fatalf("decode event %d: %q, want %q", i, ds[1+i], want)
		}
		if want := fmt.Sprintf("Drained room %x from %d", 100+i, dID); ps[1+i] != want {
			t.Fatalf("prefill event %d: %q, want %q", i, ps[1+i], want)
		}
	}
	if ds[0] != "epoch 1 peer 1 from 1" || ps[0] != "epoch 1 peer 2 from 2" {
		t.Errorf("first events %q %q, want the first epoch", ds[0], ps[0])
	}
	if len(reports) != 1 || reports[0] != "landed 1 room aa: nil" {
		t.Errorf("reports %q", reports)
	}
	// The write landed: header and data are the sender's.
	got := e.dst.PageBytes(e.dstPages[1])
	if !bytes.Equal(got[kvpool.HeaderSize:], e.src.PageData(e.srcPage)) {
		t.Error("page data did not land")
	}
	if err := e.dst.VerifyChecksum(e.dstPages[1]); err != nil {
		t.Error(err)
	}
	// A revoked window refuses; so does a bad MAC; neither touches memory.
	before := bytes.Clone(e.dst.PageBytes(e.dstPages[0]))
	bad := e.write(2, e.dstPages[0])
	bad.Msg.MAC[0] ^= 1
	e.P.Post(ctx, bad)
	e.windows.Revoke(e.key)
	e.P.Post(ctx, e.write(3, e.dstPages[0]))
	all = e.ps.waitFor(t, 24)
	if all[22] != "landed 2 room aa: refused" || all[23] != "landed 3 room aa: refused" {
		t.Errorf("reports %q", all[22:])
	}
	if !bytes.Equal(before, e.dst.PageBytes(e.dstPages[0])) {
		t.Error("a refused write changed the page")
	}
}

// TestDisconnectLosesQueuedWrites: writes queued on a connection that goes
// down are reported lost, each once, before the new epoch reaches the
// sender; Send fails while down; Connect brings the next epoch.
func TestDisconnectLosesQueuedWrites(t *testing.T) {
	synctest.Test(t, testDisconnect)
}

func testDisconnect(t *testing.T) {
	hold := make(chan struct{})
	e := newEnv(t, 8, hold)
	defer e.P.Close()
	ctx := t.Context()
	if err := e.P.Send(ctx, e.msg(1)); err != nil { // held in Deliver
		t.Fatal(err)
	}
	for s := range uint64(3) {
		e.P.Post(ctx, e.write(10+s, e.dstPages[0]))
	}
	down := make(chan struct{})
	go func() { e.pair.Disconnect(); close(down) }()
	synctest.Wait() // Disconnect waits for the delivery held in Deliver
	close(hold)
	<-down
	ps := e.ps.got()
	want := []string{"epoch 1 peer 2 from 2", "landed 10 room aa: link: peer connection lost", "landed 11 room aa: link: peer connection lost", "landed 12 room aa: link: peer connection lost", "epoch 2 peer 2 from 2"}
	if fmt.Sprint(ps) != fmt.Sprint(want) {
		t.Errorf("prefill sink %q, want %q", ps, want)
	}
	if ds := e.ds.got(); ds[len(ds)-1] != "epoch 2 peer 1 from 1" {
		t.Errorf("decode sink %q", ds)
	}
	if err := e.P.Send(ctx, e.msg(2)); !errors.Is(err, link.ErrPeerGone) {
		t.Errorf("Send while down: %v", err)
	}
	e.P.Post(ctx, e.write(20, e.dstPages[0]))
	if ps := e.ps.got(); ps[len(ps)-1] != "landed 20 room aa: link: peer connection lost" {
		t.Errorf("Post while down: %q", ps[len(ps)-1])
	}
	e.pair.Connect()
	if e.pair.Epoch() != 3 {
		t.Errorf("epoch %d after Connect", e.pair.Epoch())
	}
	if err := e.D.Send(ctx, e.msg(3)); err != nil {
		t.Errorf("Send after Connect: %v", err)
	}
	e.ps.waitFor(t, 8)
}

func TestClose(t *testing.T) {
	e := newEnv(t, 4, nil)
	ctx := t.Context()
	if err := e.D.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.D.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.D.Send(ctx, e.msg(1)); !errors.Is(err, link.ErrClosed) {
		t.Errorf("Send on the closed end: %v", err)
	}
	if err := e.P.Send(ctx, e.msg(1)); !errors.Is(err, link.ErrPeerGone) {
		t.Errorf("Send on the other end: %v", err)
	}
	e.pair.Connect() // a closed pair stays down
	if e.pair.Epoch() != 2 {
		t.Errorf("epoch %d", e.pair.Epoch())
	}
	if ps, ds := e.ps.got(), e.ds.got(); ps[len(ps)-1] != "epoch 2 peer 2 from 2" || ds[len(ds)-1] != "epoch 2 peer 1 from 1" {
		t.Errorf("final epochs: %q %q", ps, ds)
	}
}

// TestBackpressure: Send blocks while the queue is full and gives up when
// its context ends.
func TestBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		e := newEnv(t, 2, hold)
		ctx := context.Background()
		for i := range 3 { // one held in Deliver, two queued
			if err := e.P.Send(ctx, e.msg(byte(i))); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := e.P.Send(short, e.msg(9)); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Send on a full queue: %v", err)
		}
		close(hold)
		if err := e.P.Send(ctx, e.msg(10)); err != nil {
			t.Errorf("Send after the queue drained: %v", err)
		}
		e.P.Close()
	})
}
