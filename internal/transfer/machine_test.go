package transfer

import (
	"errors"
	"testing"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

var testShape = kvpool.Shape{Layers: 2, KVHeads: 1, HeadDim: 4, PageSize: 4}

type decodeRig struct {
	t     *testing.T
	auth  *Auth
	pool  *kvpool.Pool
	src   *kvpool.Pool // stands in for the prefill pool when sealing pages
	table *WindowTable
	d     *DecodeMachine
}

func newDecodeRig(t *testing.T, prot Protections, pages, window int) *decodeRig {
	t.Helper()
	r := &decodeRig{t: t, auth: testAuth(t), table: NewWindowTable(0)}
	var err error
	if r.pool, err = kvpool.New(kvpool.Config{Shape: testShape, Pages: pages}); err != nil {
		t.Fatal(err)
	}
	if r.src, err = kvpool.New(kvpool.Config{Shape: testShape, Pages: pages}); err != nil {
		t.Fatal(err)
	}
	r.d, err = NewDecodeMachine(DecodeConfig{Self: peerDecode, Pool: r.pool, Windows: r.table, Auth: r.auth,
		Protections: prot, ContextWindow: window, KeyBase: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *decodeRig) step(from PeerID, m Message) []Output {
	r.auth.Sign(m)
	return r.d.Step(from, m)
}

func find[T Output](outs []Output) (T, bool) {
	for _, o := range outs {
		if v, ok := o.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// open opens room with prompt tokens and returns the grant.
func (r *decodeRig) open(room RoomID, prompt int) *Grant {
	outs := r.step(peerRouter, &Open{Envelope: Envelope{Room: room}, Prefill: peerPrefill, PromptTokens: uint32(prompt), MaxTokens: 1})
	s, ok := find[Send](outs)
	g, isGrant := s.Msg.(*Grant)
	if !ok || !isGrant {
		r.t.Fatalf("Open did not grant: %v", outs)
	}
	return g
}

// write writes page i of grant g as a correct prefill would, with header
// h (changed by the caller's defect), and returns the sealed checksum.
func (r *decodeRig) write(g *Grant, i int, edit func(h *kvpool.Header)) uint32 {
	ps := testShape.PageSize
	h := kvpool.Header{Fence: Fence{Room: g.Room, Epoch: g.Epochs[i]}, Page: g.Pages[i], Ordinal: uint32(i),
		Tokens: uint32(min(ps, int(g.PromptTokens)-i*ps))}
	if edit != nil {
		edit(&h)
	}
	data := r.src.PageData(int32(i))
	data[0] = byte(i + 1)
	hdr := r.src.Seal(int32(i), h)
	w := &Write{Envelope: Envelope{Room: g.Room}, Key: g.Key, Page: g.Pages[i], Header: hdr, Data: data}
	if err := r.table.Land(r.pool, w); err != nil {
		r.t.Fatalf("write page %d: %v", i, err)
	}
	sealed, _ := kvpool.ParseHeader(hdr[:])
	return sealed.Checksum
}

func TestDoneVerification(t *testing.T) {
	other := RoomID{9, 9}
	tests := []struct {
		name string
		// defect changes what is written or what Done says.
		defect func(r *decodeRig, g *Grant, d *Done)
		// off is a set of switched-off protections under which the defect
		// goes unnoticed (showing which protection catches it).
		off Protections
	}{
		{"none", func(*decodeRig, *Grant, *Done) {}, Protections{}},
		{"done reports a page less", func(_ *decodeRig, _ *Grant, d *Done) { d.Pages--; d.Checksums = d.Checksums[:2] },
			Protections{NoPageCountAgreement: true}},
		{"done reports fewer tokens", func(_ *decodeRig, _ *Grant, d *Done) { d.Tokens-- },
			Protections{NoPageCountAgreement: true}},
		{"header token count", func(r *decodeRig, g *Grant, d *Done) {
			d.Checksums[2] = r.write(g, 2, func(h *kvpool.Header) { h.Tokens = 4 })
		}, Protections{NoPageCountAgreement: true}},
		{"page never written", func(r *decodeRig, g *Grant, d *Done) {
			// Another request's memory is left in page 1.
			(&kvpool.Header{Fence: Fence{Room: other, Epoch: 1}, Page: g.Pages[1], Ordinal: 1, Tokens: 4}).Put(r.pool.PageBytes(g.Pages[1]))
		}, Protections{NoFenceCheck: true, NoChecksum: true}},
		{"pages swapped", func(r *decodeRig, g *Grant, d *Done) {
			d.Checksums[0] = r.write(g, 0, func(h *kvpool.Header) { h.Ordinal = 1 })
			d.Checksums[1] = r.write(g, 1, func(h *kvpool.Header) { h.Ordinal = 0 })
		}, Protections{NoFenceCheck: true}},
		{"another room's fence", func(r *decodeRig, g *Grant, d *Done) {
			d.Checksums[1] = r.write(g, 1, func(h *kvpool.Header) { h.Fence.Room = other })
		}, Protections{NoFenceCheck: true}},
		{"stale epoch", func(r *decodeRig, g *Grant, d *Done) {
			d.Checksums[1] = r.write(g, 1, func(h *kvpool.Header) { h.Fence.Epoch-- })
		}, Protections{NoFenceCheck: true}},
		{"data corrupted after the write", func(r *decodeRig, g *Grant, d *Done) { r.pool.PageData(g.Pages[2])[7] ^= 1 },
			Protections{NoChecksum: true}},
		{"done carries another checksum", func(_ *decodeRig, _ *Grant, d *Done) { d.Checksums[0] ^= 1 },
			Protections{NoChecksum: true}},
	}
	room := RoomID{1}
	for _, tt := range tests {
		for _, prot := range []Protections{{}, tt.off} {
			caught := prot.Safe() && tt.name != "none"
			r := newDecodeRig(t, prot, 8, 64)
			g := r.open(room, 10)
			d := &Done{Envelope: Envelope{Room: room}, Pages: 3, Tokens: 10, FirstToken: 5}
			for i := range g.Pages {
				d.Checksums = append(d.Checksums, r.write(g, i, nil))
			}
			tt.defect(r, g, d)
			outs := r.step(peerPrefill, d)
			start, started := find[StartDecode](outs)
			fail, failed := find[Fail](outs)
			c := r.pool.Counts()
			switch {
			case caught:
				if started || !failed || reqerr.KindOf(fail.Err) != reqerr.KindIntegrity || c.Quarantined != 3 {
					t.Errorf("%s (%v): not caught: %v, pools %+v", tt.name, prot, outs, c)
				}
			default:
				if !started || failed || len(start.Pages) != 3 || start.FirstToken != 5 || c.Allocated != 3 {
					t.Errorf("%s (%v): did not start: %v, pools %+v", tt.name, prot, outs, c)
				}
			}
			if r.table.IsOpen(g.Key) {
				t.Errorf("%s (%v): window still open after Done", tt.name, prot)
			}
		}
	}
}

func TestRejectedMeansNeverReserved(t *testing.T) {
	r := newDecodeRig(t, Protections{}, 4, 64) // the pool holds 16 tokens
	room := RoomID{3}
	before := r.pool.Counts()
	outs := r.step(peerRouter, &Open{Envelope: Envelope{Room: room}, Prefill: peerPrefill, PromptTokens: 12, MaxTokens: 8})
	fail, ok := find[Fail](outs)
	var cl *reqerr.ContextLengthError
	if !ok || !errors.As(fail.Err, &cl) || *cl != (reqerr.ContextLengthError{Prompt: 12, MaxTokens: 8, Limit: 16}) {
		t.Fatalf("want the original ContextLengthError, got %v", outs)
	}
	s, _ := find[Send](outs)
	if rj, ok := s.Msg.(*Reject); !ok || rj.Kind != reqerr.KindContextLength || rj.Prompt != 12 || rj.Limit != 16 {
		t.Fatalf("prefill side not told with the numbers: %v", s.Msg)
	}
	if _, ok := find[OpenWindow](outs); ok || r.pool.Counts() != before || r.d.Rooms() != 0 {
		t.Fatalf("a rejected request reserved something: %v, %+v", outs, r.pool.Counts())
	}
	for pg := range int32(4) {
		if e := r.pool.Expected(pg).Epoch; e != 0 {
			t.Fatalf("page %d was allocated (epoch %d)", pg, e)
		}
	}
	// The unsafe configuration reserves the pages of the whole prompt.
	u := newDecodeRig(t, Protections{NoAdmissionBeforeReservation: true}, 4, 64)
	g := u.open(room, 12)
	if len(g.Pages) != 3 {
		t.Fatalf("unsafe admission granted %v", g.Pages)
	}
}

func TestPrefillRejectsBeforeReserving(t *testing.T) {
	auth := testAuth(t)
	pool, _ := kvpool.New(kvpool.Config{Shape: testShape, Pages: 2})
	for _, prot := range []Protections{{}, {NoAdmissionBeforeReservation: true}} {
		p, err := NewPrefillMachine(PrefillConfig{Self: peerPrefill, Pool: pool, Auth: auth, Protections: prot, ContextWindow: 64})
		if err != nil {
			t.Fatal(err)
		}
		m := &Prefill{Envelope: Envelope{Room: RoomID{4}}, Decode: peerDecode, PromptTokens: 30, MaxTokens: 2}
		auth.Sign(m)
		outs := p.Step(peerRouter, m)
		run, running := find[RunPrefill](outs)
		if prot.Safe() {
			s, _ := find[Send](outs)
			rj, _ := s.Msg.(*Reject)
			if running || rj == nil || rj.Kind != reqerr.KindContextLength || rj.Limit != 8 || pool.Counts().Allocated != 0 {
				t.Errorf("safe: %v", outs)
			}
			continue
		}
		if !running || run.PromptTokens != 1 || p.Stats().Placeholders != 1 {
			t.Errorf("unsafe: want a one-token placeholder, got %v", outs)
		}
	}
}

func TestDropsAreCounted(t *testing.T) {
	r := newDecodeRig(t, Protections{}, 4, 64)
	room := RoomID{5}
	g := r.open(room, 4)
	// Done from a peer that is not the room's prefill.
	outs := r.step(PeerID(77), &Done{Envelope: Envelope{Room: room}, Pages: 1, Tokens: 4, Checksums: []uint32{0}})
	if d, ok := find[Dropped](outs); !ok || d.Reason != DropWrongPeer {
		t.Errorf("wrong peer: %v", outs)
	}
	// Unsigned message.
	outs = r.d.Step(peerPrefill, &Drained{Envelope: Envelope{Room: room}})
	if d, ok := find[Dropped](outs); !ok || d.Reason != DropBadMAC {
		t.Errorf("unsigned: %v", outs)
	}
	// A type the decode side never receives.
	outs = r.step(peerPrefill, g)
	if d, ok := find[Dropped](outs); !ok || d.Reason != DropUnexpected {
		t.Errorf("grant to decode: %v", outs)
	}
	// Stale epoch.
	r.step(peerPrefill, &PeerEpoch{Peer: peerPrefill, Epoch: 3})
	outs = r.step(peerPrefill, &PeerEpoch{Peer: peerPrefill, Epoch: 2})
	if d, ok := find[Dropped](outs); !ok || d.Reason != DropStaleEpoch {
		t.Errorf("stale epoch: %v", outs)
	}
	st := r.d.Stats()
	if st.Dropped[DropWrongPeer] != 1 || st.Dropped[DropBadMAC] != 1 || st.Dropped[DropUnexpected] != 1 || st.Dropped[DropStaleEpoch] != 1 {
		t.Errorf("counters: %+v", st.Dropped)
	}
}

func TestOriginalErrorBeforeOverload(t *testing.T) {
	auth := testAuth(t)
	pool, _ := kvpool.New(kvpool.Config{Shape: testShape, Pages: 4})
	d, err := NewDecodeMachine(DecodeConfig{Self: peerDecode, Pool: pool, Windows: NewWindowTable(0), Auth: auth,
		ContextWindow: 16, MaxRooms: 1})
	if err != nil {
		t.Fatal(err)
	}
	open := func(room byte, prompt uint32) reqerr.Kind {
		m := &Open{Envelope: Envelope{Room: RoomID{room}}, Prefill: peerPrefill, PromptTokens: prompt, MaxTokens: 1}
		auth.Sign(m)
		if f, ok := find[Fail](d.Step(peerRouter, m)); ok {
			return reqerr.KindOf(f.Err)
		}
		return reqerr.KindUnknown
	}
	if k := open(1, 4); k != reqerr.KindUnknown {
		t.Fatalf("first open failed: %v", k)
	}
	if k := open(2, 40); k != reqerr.KindContextLength {
		t.Errorf("too long while full: %v, want context_length_exceeded", k)
	}
	if k := open(3, 4); k != reqerr.KindOverloaded {
		t.Errorf("fits but full: %v, want overloaded", k)
	}
}
