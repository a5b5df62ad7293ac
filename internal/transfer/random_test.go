package transfer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

// TestRandomInterleavings is a small randomized check of the machines
// together (the full fault simulator lives in internal/sim): one prefill,
// one decode, tiny pools, a network that reorders, duplicates and loses
// control messages, writes that land late, and aborts at any time. With
// every protection on, no started sequence may ever hold another
// request's KV (I1, I4), the decode side decides each request at most
// once, and once everything settles both pools are back to full (I5).
func TestRandomInterleavings(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 50
	}
	for seed := range uint64(seeds) {
		// Prompts up to 12 tokens: some exceed the 12-token window with
		// their max_tokens and must be rejected before reservation.
		if v := runRandom(t, seed, Protections{}, 12); v != "" {
			t.Fatalf("seed %d: %s", seed, v)
		}
	}
}

// TestRandomInterleavingsFindUnsafe checks that the same driver finds the
// failure each unsafe configuration allows: a test that cannot fail is a
// defect.
func TestRandomInterleavingsFindUnsafe(t *testing.T) {
	for _, tt := range []struct {
		prot      Protections
		maxPrompt int
	}{
		{Protections{NoWindowRevocation: true, NoDeferredRelease: true, NoFenceCheck: true, NoChecksum: true}, 9},
		{Protections{NoWindowRevocation: true, NoTombstones: true, NoFenceCheck: true, NoChecksum: true}, 9},
		{Protections{NoAdmissionBeforeReservation: true, NoPageCountAgreement: true, NoFenceCheck: true}, 12},
	} {
		prot := tt.prot
		found := -1
		for seed := uint64(0); seed < 1000 && found < 0; seed++ {
			if v := runRandom(t, seed, prot, tt.maxPrompt); v != "" {
				found = int(seed)
				t.Logf("%v: seed %d: %s", prot, seed, v)
			}
		}
		if found < 0 {
			t.Errorf("%v: no violation found", prot)
		}
	}
}

type rnet struct {
	from, to PeerID
	msg      Message
}

func runRandom(t *testing.T, seed uint64, prot Protections, maxPrompt int) (violation string) {
	rng := rand.New(rand.NewPCG(seed, 0x6b76))
	auth := testAuth(t)
	shape := kvpool.Shape{Layers: 1, KVHeads: 1, HeadDim: 2, PageSize: 2}
	dpool, _ := kvpool.New(kvpool.Config{Shape: shape, Pages: 6})
	ppool, _ := kvpool.New(kvpool.Config{Shape: shape, Pages: 6})
	table := NewWindowTable(64)
	d, _ := NewDecodeMachine(DecodeConfig{Self: peerDecode, Pool: dpool, Windows: table, Auth: auth, Protections: prot,
		ContextWindow: 12, TransferTimeout: 40, DrainTimeout: 20, KeyBase: 1})
	p, _ := NewPrefillMachine(PrefillConfig{Self: peerPrefill, Pool: ppool, Auth: auth, Protections: prot,
		ContextWindow: 12, WaitTimeout: 60})

	var (
		net      []rnet
		writes   []PostWrite
		now      int64
		running  = map[RoomID][]int32{} // prefill engine: room -> local pages
		prompt   = map[RoomID]int{}
		computed = map[RoomID]int{}
		started  = map[RoomID][]int32{} // decode engine: sequences
		decided  = map[RoomID]int{}
		admitted = map[RoomID]bool{}
		rooms    []RoomID
	)
	fill := func(pool *kvpool.Pool, pg int32, r RoomID) {
		k, v := pool.LayerKV(pg, 0)
		for i := range k {
			k[i], v[i] = float32(r[0]), float32(r[0])
		}
	}
	check := func() string {
		for r, pages := range started {
			for _, pg := range pages {
				if k, _ := dpool.LayerKV(pg, 0); k[0] != float32(r[0]) {
					return fmt.Sprintf("I1: room %d reads page %d holding %v", r[0], pg, k[0])
				}
			}
		}
		c := dpool.Counts()
		if c.Free+c.Allocated+c.Deferred+c.Quarantined != c.Total {
			return "I5 drift"
		}
		return ""
	}
	var decodeOut, prefillOut func([]Output)
	send := func(from PeerID, o Output) {
		if s, ok := o.(Send); ok {
			net = append(net, rnet{from, s.To, s.Msg})
		}
	}
	decodeOut = func(outs []Output) {
		for _, o := range outs {
			send(peerDecode, o)
			switch o := o.(type) {
			case StartDecode:
				decided[o.Room]++
				started[o.Room] = o.Pages
			case Fail:
				if _, active := started[o.Room]; active {
					delete(started, o.Room)
					decodeOut(d.Finish(o.Room))
				} else {
					decided[o.Room]++
				}
			}
		}
	}
	prefillOut = func(outs []Output) {
		for _, o := range outs {
			send(peerPrefill, o)
			switch o := o.(type) {
			case RunPrefill:
				running[o.Room] = o.Pages
				prompt[o.Room] = o.PromptTokens
				computed[o.Room] = 0
			case StopPrefill:
				delete(running, o.Room)
			case Fail:
				delete(running, o.Room)
			case PostWrite:
				if h, err := kvpool.ParseHeader(o.Msg.Header[:]); err != nil || h.Fence != o.Fence || h.Page != o.Msg.Page {
					panic("PostWrite fence differs from its header")
				}
				writes = append(writes, o)
			}
		}
	}
	deliver := func(e rnet) {
		if e.to == peerDecode {
			if o, ok := e.msg.(*Open); ok && !admitted[o.Room] {
				admitted[o.Room] = true
			}
			decodeOut(d.Step(e.from, e.msg))
		} else {
			prefillOut(p.Step(e.from, e.msg))
		}
	}
	land := func(i int) {
		w := writes[i]
		writes = slices.Delete(writes, i, i+1)
		_ = table.Land(dpool, w.Msg)
		prefillOut(p.Landed(w.Msg.Room, w.Seq))
	}

	const requests = 8
	for step := 0; step < 400; step++ {
		switch x := rng.IntN(100); {
		case x < 8 && len(rooms) < requests:
			r := RoomID{byte(len(rooms) + 'A'), byte(seed), byte(seed >> 8)}
			rooms = append(rooms, r)
			pr, mx := uint32(1+rng.IntN(maxPrompt)), uint32(rng.IntN(4))
			o := &Open{Envelope: Envelope{Room: r}, Prefill: peerPrefill, PromptTokens: pr, MaxTokens: mx}
			pf := &Prefill{Envelope: Envelope{Room: r}, Decode: peerDecode, PromptTokens: pr, MaxTokens: mx}
			auth.Sign(o)
			auth.Sign(pf)
			net = append(net, rnet{peerRouter, peerDecode, o}, rnet{peerRouter, peerPrefill, pf})
		case x < 45 && len(net) > 0:
			i := rng.IntN(len(net))
			e := net[i]
			if rng.IntN(10) > 0 { // else: delivered and kept: a duplicate
				net = slices.Delete(net, i, i+1)
			}
			deliver(e)
		case x < 47 && len(net) > 0:
			i := rng.IntN(len(net))
			net = slices.Delete(net, i, i+1) // lost
		case x < 65 && len(writes) > 0:
			land(rng.IntN(len(writes)))
		case x < 80 && len(running) > 0:
			var ids []RoomID
			for r := range running {
				ids = append(ids, r)
			}
			slices.SortFunc(ids, func(a, b RoomID) int { return int(a[0]) - int(b[0]) })
			r := ids[rng.IntN(len(ids))]
			if computed[r] < prompt[r] {
				for _, pg := range running[r] {
					fill(ppool, pg, r)
				}
				computed[r] = min(prompt[r], computed[r]+1+rng.IntN(3))
				prefillOut(p.Computed(r, computed[r]))
			} else {
				prefillOut(p.Sampled(r, 1))
				delete(running, r)
			}
		case x < 85 && len(rooms) > 0:
			r := rooms[rng.IntN(len(rooms))]
			for _, to := range []PeerID{peerDecode, peerPrefill} {
				a := &Abort{Envelope: Envelope{Room: r}, Reason: reqerr.KindAborted, Decode: peerDecode}
				auth.Sign(a)
				net = append(net, rnet{peerRouter, to, a})
			}
		case x < 95:
			now++
			decodeOut(d.Tick(now))
			prefillOut(p.Tick(now))
		default:
			for r := range started {
				delete(started, r)
				decodeOut(d.Finish(r))
				break
			}
		}
		if v := check(); v != "" {
			return v
		}
	}
	// Settle: finish the prefill work that is running, deliver and land
	// everything, let every timeout fire, then reconnect both sides.
	for range 5 {
		for r := range running {
			if computed[r] < prompt[r] {
				for _, pg := range running[r] {
					fill(ppool, pg, r)
				}
				computed[r] = prompt[r]
				prefillOut(p.Computed(r, prompt[r]))
			}
			if _, ok := running[r]; ok {
				prefillOut(p.Sampled(r, 1))
				delete(running, r)
			}
		}
		for len(net) > 0 || len(writes) > 0 {
			if len(writes) > 0 {
				land(0)
			}
			if len(net) > 0 {
				e := net[0]
				net = net[1:]
				deliver(e)
			}
			if v := check(); v != "" {
				return v
			}
		}
		now += 100
		decodeOut(d.Tick(now))
		prefillOut(p.Tick(now))
	}
	for _, side := range []struct {
		peer PeerID
		step func(PeerID, Message) []Output
		out  func([]Output)
	}{{peerPrefill, d.Step, decodeOut}, {peerDecode, p.Step, prefillOut}} {
		m := &PeerEpoch{Peer: side.peer, Epoch: 1}
		auth.Sign(m)
		side.out(side.step(side.peer, m))
	}
	for len(net) > 0 {
		e := net[0]
		net = net[1:]
		deliver(e)
	}
	for r := range started {
		decodeOut(d.Finish(r))
	}
	if v := check(); v != "" {
		return v
	}
	for r, n := range decided {
		if n > 1 {
			return fmt.Sprintf("room %d decided %d times", r[0], n)
		}
	}
	if prot.Safe() {
		if c := dpool.Counts(); c.Free != c.Total {
			return fmt.Sprintf("decode pool not back to full at rest: %+v (rooms %d)", c, d.Rooms())
		}
		if c := ppool.Counts(); c.Free != c.Total {
			return fmt.Sprintf("prefill pool not back to full at rest: %+v (rooms %d)", c, p.Rooms())
		}
		if p.InFlight() != 0 {
			return "writes still in flight"
		}
	}
	return ""
}
