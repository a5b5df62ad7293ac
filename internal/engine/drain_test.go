package engine

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/inproc"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// TestDrainTimeoutQuarantinesUntilNewEpoch runs under synctest's fake
// clock: a granted room whose prefill peer received the Grant but never
// answers (a hung peer: its sink drops everything) is aborted; no Drained
// comes, so after the drain timeout its pages go to quarantine (outcome
// timeout), and only a new connection epoch with that peer frees them.
func TestDrainTimeoutQuarantinesUntilNewEpoch(t *testing.T) {
	m := tinyModel(t)
	synctest.Test(t, func(t *testing.T) {
		auth, _ := transfer.NewAuth(secret)
		pool, err := kvpool.New(kvpool.Config{Shape: PoolShape(m, 4), Pages: 40})
		if err != nil {
			t.Fatal(err)
		}
		dw, err := NewDecodeWorker(DecodeConfig{Model: m, Pool: pool, Auth: auth, Self: decodeID, ContextWindow: 100,
			Threads: 1, TickInterval: 10 * time.Millisecond, DrainTimeout: 50, TransferTimeout: 100000})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { // the bubble ends only when the driver has
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			dw.Close(ctx)
		}()
		// The prefill peer is connected but hung: the Grant and the Abort
		// reach it, and nothing comes back, so no Drained comes.
		pair := inproc.New(inproc.Config{Auth: auth}, inproc.Side{ID: prefillID, Sink: nullSink{}}, inproc.Side{ID: decodeID, Sink: dw}, dw.Receiver())
		defer pair.Decode().Close()
		dw.AddLink(pair.Decode())
		h := &pd{t: t, m: m, auth: auth}
		r := &req{tenant: "a", prompt: prompt(rand.New(rand.NewPCG(1, 1)), 10), max: 5}
		g, _ := h.open(r)
		ctx := context.Background()
		s, err := dw.Generate(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st := dw.Stats(); st.Machine.Granted != 1 || st.Pool.Allocated != 4 {
			t.Fatalf("granted %d, allocated %d", st.Machine.Granted, st.Pool.Allocated)
		}
		dw.Abort(h.abortMsg(r.room))
		if _, err := s.Next(ctx); reqerr.KindOf(err) != reqerr.KindAborted {
			t.Fatalf("stream: %v", err)
		}
		s.Close()
		synctest.Wait()
		if c := pool.Counts(); c.Deferred != 3 || c.Allocated != 0 {
			t.Fatalf("after the abort: %+v, want the 3 prompt pages deferred and the growth page free", c)
		}
		time.Sleep(49 * 10 * time.Millisecond)
		synctest.Wait()
		if c := pool.Counts(); c.Deferred != 3 {
			t.Fatalf("before the drain timeout: %+v", c)
		}
		time.Sleep(2 * 10 * time.Millisecond)
		synctest.Wait()
		if c, st := pool.Counts(), dw.Stats(); c.Quarantined != 3 || c.Deferred != 0 || st.DeferredTimeout != 1 || st.DeferredDrained != 0 {
			t.Fatalf("after the drain timeout: %+v, timeout %d drained %d", c, st.DeferredTimeout, st.DeferredDrained)
		}
		// The connection to the prefill peer is replaced: nothing of the
		// old one can land any more.
		pair.Reconnect()
		synctest.Wait()
		if c := pool.Counts(); c.Free != c.Total {
			t.Errorf("after the new epoch: %+v", c)
		}
		if err := dw.Close(ctx); err != nil {
			t.Error(err)
		}
	})
}

// TestRequestForDownPeerWaitsThenFails: the prefill peer connected once,
// then its connection dropped. A new request for it holds no page while it
// waits for the peer to come back, and fails with peer_lost once the
// reconnect grace has passed.
func TestRequestForDownPeerWaitsThenFails(t *testing.T) {
	testDownPeer(t, false, "is not connected")
}

// TestGrantToDownPeerFreesPagesAtOnce: the link claims to be up, so the
// request is granted, but it refuses the Grant (the connection dropped in
// between): nothing was transmitted, so the request fails with peer_lost
// and its pages are free at once, not deferred and then quarantined until
// a peer that may never come back reconnects.
func TestGrantToDownPeerFreesPagesAtOnce(t *testing.T) {
	testDownPeer(t, true, "grant not sent")
}

func testDownPeer(t *testing.T, lie bool, wantErr string) {
	m := tinyModel(t)
	synctest.Test(t, func(t *testing.T) {
		auth, _ := transfer.NewAuth(secret)
		pool, err := kvpool.New(kvpool.Config{Shape: PoolShape(m, 4), Pages: 40})
		if err != nil {
			t.Fatal(err)
		}
		dw, err := NewDecodeWorker(DecodeConfig{Model: m, Pool: pool, Auth: auth, Self: decodeID, ContextWindow: 100,
			Threads: 1, TickInterval: 10 * time.Millisecond, DrainTimeout: 50, TransferTimeout: 100000, ReconnectGrace: 300})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		defer dw.Close(ctx)
		pair := inproc.New(inproc.Config{Auth: auth}, inproc.Side{ID: prefillID, Sink: nullSink{}}, inproc.Side{ID: decodeID, Sink: dw}, dw.Receiver())
		defer pair.Decode().Close()
		var l link.Link = pair.Decode()
		if lie {
			l = upLink{l}
		}
		dw.AddLink(l)
		synctest.Wait()
		pair.Disconnect()
		synctest.Wait()
		h := &pd{t: t, m: m, auth: auth}
		r := &req{tenant: "a", prompt: prompt(rand.New(rand.NewPCG(1, 1)), 10), max: 5}
		g, _ := h.open(r)
		start := time.Now()
		s, err := dw.Generate(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if !lie {
			synctest.Wait()
			if c := pool.Counts(); c.Free != c.Total {
				t.Fatalf("a request waiting for its peer holds pages: %+v", c)
			}
		}
		_, err = s.Next(ctx)
		if reqerr.KindOf(err) != reqerr.KindPeerLost || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("stream: %v, want peer_lost (%s)", err, wantErr)
		}
		waited := time.Since(start)
		if lie && waited != 0 || !lie && waited < 3*time.Second {
			t.Errorf("failed after %v of fake time", waited)
		}
		s.Close()
		synctest.Wait()
		if c, st := pool.Counts(), dw.Stats(); c.Free != c.Total || st.DeferredTimeout != 0 {
			t.Fatalf("after the failure: %+v, timeouts %d; want every page free", c, st.DeferredTimeout)
		}
	})
}

// upLink claims its connection is up whatever it is: the window between a
// worker's readiness check and its Send, made wide.
type upLink struct{ link.Link }

func (upLink) Connected() bool { return true }

type nullSink struct{}

func (nullSink) Deliver(transfer.PeerID, transfer.Message) {}
func (nullSink) Landed(link.Report)                        {}
