package kvpool

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/internal/invariants"
)

var tiny = Shape{Layers: 2, KVHeads: 2, HeadDim: 4, PageSize: 4}

func newTiny(t testing.TB, pages int) *Pool {
	t.Helper()
	p, err := New(Config{Shape: tiny, Pages: pages})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func room(b byte) RoomID { return RoomID{b, b, b} }

func TestLayoutMatchesContract(t *testing.T) {
	p := newTiny(t, 3)
	if got, want := tiny.PageBytes(), 64+2*2*4*2*4*4; got != want {
		t.Fatalf("PageBytes = %d, want %d", got, want)
	}
	// Write a distinct value through LayerKV and find it at the byte offset
	// the contract gives: header, then per layer K then V, slot-major.
	const pg, layer, slot, head, dim = 1, 1, 2, 1, 3
	k, v := p.LayerKV(pg, layer)
	if len(k) != tiny.BlockFloats() || len(v) != tiny.BlockFloats() || cap(k) != len(k) {
		t.Fatalf("len k %d v %d cap k %d, want %d", len(k), len(v), cap(k), tiny.BlockFloats())
	}
	idx := (slot*tiny.KVHeads+head)*tiny.HeadDim + dim
	k[idx], v[idx] = 1.5, -2.25
	data := p.PageData(pg)
	koff := (layer*2*tiny.BlockFloats() + idx) * 4
	voff := ((layer*2+1)*tiny.BlockFloats() + idx) * 4
	if got := math.Float32frombits(binary32(data[koff:])); got != 1.5 {
		t.Errorf("K at byte %d = %v, want 1.5", koff, got)
	}
	if got := math.Float32frombits(binary32(data[voff:])); got != -2.25 {
		t.Errorf("V at byte %d = %v, want -2.25", voff, got)
	}
	if &p.PageBytes(pg)[HeaderSize] != &data[0] || len(p.PageBytes(pg)) != tiny.PageBytes() {
		t.Error("PageData does not start right after the header")
	}
}

func TestLayerKVDoesNotAllocate(t *testing.T) {
	p := newTiny(t, 2)
	if n := testing.AllocsPerRun(100, func() { p.LayerKV(1, 1) }); n != 0 {
		t.Fatalf("LayerKV allocates %v times", n)
	}
}

func TestAllocAccountingAndEpochs(t *testing.T) {
	p := newTiny(t, 4)
	a, err := p.Alloc(room(1), 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{0, 1, 2}; !equal(a, want) {
		t.Fatalf("Alloc = %v, want %v", a, want)
	}
	if _, err := p.Alloc(room(2), 2, nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("over-allocation: %v, want ErrExhausted", err)
	}
	if c := p.Counts(); c != (Counts{Total: 4, Free: 1, Allocated: 3}) {
		t.Fatalf("after failed alloc counts = %+v (all or nothing)", c)
	}
	p.Defer(room(1), a[:1])
	p.Quarantine(room(1), a[1:2])
	p.Free(room(1), a[2:])
	if c := p.Counts(); c != (Counts{Total: 4, Free: 2, Deferred: 1, Quarantined: 1}) {
		t.Fatalf("counts = %+v", c)
	}
	if c := p.RoomCounts(room(1)); c != (Counts{Total: 2, Deferred: 1, Quarantined: 1}) {
		t.Fatalf("room counts = %+v", c)
	}
	p.Quarantine(room(1), a[:1]) // deferred -> quarantined is allowed (drain timeout)
	p.Release(room(1), a[:2])
	if c := p.Counts(); c != (Counts{Total: 4, Free: 4}) {
		t.Fatalf("at rest counts = %+v", c)
	}
	if s := p.Stats(); s.QuarantinedPages != 2 {
		t.Errorf("QuarantinedPages = %d, want 2", s.QuarantinedPages)
	}
	// Page 0 was freed last-in: it is reused first, with a new epoch.
	b, _ := p.Alloc(room(3), 1, nil)
	if f := p.Expected(b[0]); f.Room != room(3) || f.Epoch != 2 {
		t.Fatalf("reused page %d fence %v, want room 3 epoch 2", b[0], f)
	}
}

func TestWrongTransitionsPanic(t *testing.T) {
	tests := []struct {
		name string
		op   func(p *Pool, pages []int32)
	}{
		{"double free", func(p *Pool, pg []int32) { p.Free(room(1), pg); p.Free(room(1), pg) }},
		{"free by another room", func(p *Pool, pg []int32) { p.Free(room(2), pg) }},
		{"release allocated", func(p *Pool, pg []int32) { p.Release(room(1), pg) }},
		{"defer deferred", func(p *Pool, pg []int32) { p.Defer(room(1), pg); p.Defer(room(1), pg) }},
		{"free quarantined", func(p *Pool, pg []int32) { p.Quarantine(room(1), pg); p.Free(room(1), pg) }},
		{"free unknown page", func(p *Pool, pg []int32) { p.Free(room(1), []int32{9}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTiny(t, 2)
			pg, _ := p.Alloc(room(1), 1, nil)
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "invariant violated") {
					t.Fatalf("recovered %v, want an invariant panic", r)
				}
			}()
			tt.op(p, pg)
		})
	}
}

func TestVerifyFences(t *testing.T) {
	p := newTiny(t, 4)
	r := room(7)
	pages, _ := p.Alloc(r, 2, nil)
	if err := p.VerifyFences(r, pages); !errors.Is(err, ErrFenceMismatch) {
		t.Fatalf("unwritten pages verified: %v", err)
	}
	p.Stamp(pages[0], 0, 4)
	p.Stamp(pages[1], 1, 2)
	if err := p.VerifyFences(r, pages); err != nil {
		t.Fatalf("stamped pages: %v", err)
	}
	if n := testing.AllocsPerRun(50, func() { _ = p.VerifyFences(r, pages) }); n != 0 {
		t.Errorf("VerifyFences allocates %v times on success", n)
	}
	before := p.Stats().FenceMismatches
	tests := []struct {
		name   string
		room   RoomID
		pages  []int32
		reason string
	}{
		{"another room reads", room(8), pages, "another room"},
		{"swapped pages", r, []int32{pages[1], pages[0]}, "ordinal"},
		{"free page", r, []int32{pages[0], 3}, "free"},
	}
	for _, tt := range tests {
		var fe *FenceError
		err := p.VerifyFences(tt.room, tt.pages)
		if !errors.As(err, &fe) || !strings.Contains(fe.Reason, tt.reason) {
			t.Errorf("%s: %v, want reason containing %q", tt.name, err, tt.reason)
		}
	}
	if got := p.Stats().FenceMismatches - before; got != uint64(len(tests)) {
		t.Errorf("FenceMismatches rose by %d, want %d", got, len(tests))
	}

	// A late write from the previous owner after reuse carries the old
	// fence: the new owner's read fails closed.
	old := p.Expected(pages[0])
	var stale [HeaderSize]byte
	(&Header{Fence: old, Page: pages[0], Ordinal: 0, Tokens: 4, Flags: FlagLocal}).Put(stale[:])
	p.Free(r, pages)
	again, _ := p.Alloc(room(9), 1, nil)
	if again[0] != pages[1] && again[0] != pages[0] {
		t.Fatalf("expected reuse of a freed page, got %v", again)
	}
	p.Stamp(again[0], 0, 4)
	copy(p.PageBytes(again[0]), stale[:]) // the late write lands
	var fe *FenceError
	if err := p.VerifyFences(room(9), again); !errors.As(err, &fe) || fe.Reason != "room differs" {
		t.Fatalf("late write after reuse: %v, want room differs", err)
	}
}

func TestChecksum(t *testing.T) {
	p := newTiny(t, 3)
	src, _ := p.Alloc(room(1), 1, nil)
	dst, _ := p.Alloc(room(2), 1, nil)
	k, _ := p.LayerKV(src[0], 0)
	for i := range k {
		k[i] = float32(i)
	}
	h := Header{Fence: p.Expected(dst[0]), Page: dst[0], Tokens: 3}
	hdr := p.Seal(src[0], h)
	pb := p.PageBytes(dst[0])
	copy(pb, hdr[:])
	copy(pb[HeaderSize:], p.PageData(src[0]))
	if err := p.VerifyChecksum(dst[0]); err != nil {
		t.Fatalf("sealed copy: %v", err)
	}
	if err := p.VerifyFences(room(2), dst); err != nil {
		t.Fatalf("sealed copy fences: %v", err)
	}
	got, _ := p.Header(dst[0])
	if got.Flags != FlagChecksum|FlagTransfer || got.Checksum != p.Checksum(dst[0]) {
		t.Fatalf("header %+v", got)
	}

	var ce *ChecksumError
	pb[HeaderSize+5] ^= 1
	if err := p.VerifyChecksum(dst[0]); !errors.As(err, &ce) || ce.Missing {
		t.Errorf("flipped data bit: %v", err)
	}
	pb[HeaderSize+5] ^= 1
	pb[offTokens] ^= 1 // the header is covered too
	if err := p.VerifyChecksum(dst[0]); !errors.As(err, &ce) || ce.Missing {
		t.Errorf("flipped header bit: %v", err)
	}
	p.Stamp(dst[0], 0, 3) // no checksum flag
	if err := p.VerifyChecksum(dst[0]); !errors.As(err, &ce) || !ce.Missing {
		t.Errorf("missing checksum: %v, want Missing", err)
	}
	if n := p.Stats().ChecksumFailures; n != 3 {
		t.Errorf("ChecksumFailures = %d, want 3", n)
	}
}

func TestFreedPagesArePoisonedOrScrubbed(t *testing.T) {
	for _, scrub := range []bool{false, true} {
		p, _ := New(Config{Shape: tiny, Pages: 1, Scrub: scrub})
		pg, _ := p.Alloc(room(1), 1, nil)
		p.Stamp(pg[0], 0, 1)
		k, _ := p.LayerKV(pg[0], 0)
		k[0] = 42
		p.Free(room(1), pg)
		k, _ = p.LayerKV(pg[0], 0)
		switch {
		case scrub:
			if k[0] != 0 {
				t.Errorf("scrubbed page holds %v", k[0])
			}
		case invariants.Enabled:
			if !math.IsNaN(float64(k[0])) {
				t.Errorf("poisoned page holds %v, want NaN", k[0])
			}
			if _, err := p.Header(pg[0]); !errors.Is(err, ErrBadHeader) {
				t.Errorf("poisoned header parses: %v", err)
			}
		default:
			if k[0] != 42 {
				t.Errorf("page changed on free without scrub: %v", k[0])
			}
		}
	}
}

func TestHeaderRoundTripAndRejects(t *testing.T) {
	h := Header{Fence: Fence{Room: room(3), Epoch: 1<<40 + 5}, Page: 12, Ordinal: 3, Tokens: 16, Checksum: 0xdeadbeef, Flags: FlagChecksum | FlagTransfer}
	var b [HeaderSize]byte
	h.Put(b[:])
	if got, err := ParseHeader(b[:]); err != nil || got != h {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	corrupt := []struct {
		name string
		off  int
	}{{"magic", offMagic}, {"version", offVersion}, {"flags", offFlags + 1}, {"reserved", offReserved + 7}}
	for _, c := range corrupt {
		bad := b
		bad[c.off] ^= 0x80
		if _, err := ParseHeader(bad[:]); !errors.Is(err, ErrBadHeader) {
			t.Errorf("%s corrupted: %v", c.name, err)
		}
	}
	if _, err := ParseHeader(b[:10]); !errors.Is(err, ErrBadHeader) {
		t.Error("short header parsed")
	}
}

func FuzzParseHeader(f *testing.F) {
	var b [HeaderSize]byte
	(&Header{Fence: Fence{Room: room(1), Epoch: 2}, Page: 3, Tokens: 4, Flags: FlagLocal}).Put(b[:])
	f.Add(b[:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseHeader(data)
		if err != nil {
			return
		}
		var out [HeaderSize]byte
		h.Put(out[:])
		if string(out[:]) != string(data[:HeaderSize]) {
			t.Fatalf("accepted header does not re-encode to itself")
		}
	})
}

func TestCapacity(t *testing.T) {
	qwen := Shape{Layers: 28, KVHeads: 8, HeadDim: 128, PageSize: 16}
	if got := qwen.PageBytes(); got != 64+28*2*16*8*128*4 {
		t.Fatalf("qwen3-0.6b page bytes = %d", got)
	}
	if got := PagesFor(int64(qwen.PageBytes())*10+5, qwen); got != 10 {
		t.Errorf("PagesFor = %d, want 10", got)
	}
	_, _, err := CheckWindow(681280, 1048576, false)
	var ce *CapacityError
	if !errors.As(err, &ce) || !errors.Is(err, ErrPoolTooSmall) {
		t.Fatalf("small pool: %v", err)
	}
	for _, n := range []string{"681280", "1048576"} {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not name %s", err, n)
		}
	}
	eff, note, err := CheckWindow(681280, 1048576, true)
	if err != nil || eff != 681280 || !strings.Contains(note, "lowered from 1048576 to 681280") {
		t.Errorf("lowered: %d %q %v", eff, note, err)
	}
	if eff, note, err := CheckWindow(4096, 4096, false); eff != 4096 || note != "" || err != nil {
		t.Errorf("equal: %d %q %v", eff, note, err)
	}
	if _, err := New(Config{Shape: qwen, Budget: 100}); err == nil {
		t.Error("pool with no page created")
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
