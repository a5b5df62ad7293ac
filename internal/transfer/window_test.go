package transfer

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvfence/kvfence/internal/kvpool"
)

func TestWindowTableChecks(t *testing.T) {
	pool, err := kvpool.New(kvpool.Config{Shape: kvpool.Shape{Layers: 1, KVHeads: 1, HeadDim: 2, PageSize: 2}, Pages: 4})
	if err != nil {
		t.Fatal(err)
	}
	tab := NewWindowTable(2)
	room := RoomID{1}
	tab.Open(10, room, []int32{1, 2})
	data := make([]byte, pool.Shape().PageBytes()-kvpool.HeaderSize)
	data[0] = 0x5a
	w := &Write{Envelope: Envelope{Room: room}, Key: 10, Page: 2, Data: data}
	w.Header[0] = 0xee
	if err := tab.Land(pool, w); err != nil {
		t.Fatalf("write into an open window: %v", err)
	}
	if pb := pool.PageBytes(2); pb[0] != 0xee || pb[kvpool.HeaderSize] != 0x5a {
		t.Fatal("Land did not copy header and data")
	}
	tests := []struct {
		name string
		w    Write
		want error
	}{
		{"page outside window", Write{Key: 10, Page: 3, Data: data}, ErrPageNotInWindow},
		{"page outside pool", Write{Key: 10, Page: 99, Data: data}, ErrPageNotInWindow},
		{"unknown key", Write{Key: 11, Page: 1, Data: data}, ErrNoWindow},
		{"short data", Write{Key: 10, Page: 1, Data: data[1:]}, ErrWriteSize},
	}
	for _, tt := range tests {
		if err := tab.Land(pool, &tt.w); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	tab.Revoke(10)
	tab.Revoke(10) // idempotent
	if err := tab.Land(pool, w); !errors.Is(err, ErrNoWindow) {
		t.Errorf("write after revoke: %v", err)
	}
	// The bound evicts the oldest window.
	tab.Open(20, room, []int32{0})
	tab.Open(21, room, []int32{0})
	tab.Open(22, room, []int32{0})
	if tab.IsOpen(20) || !tab.IsOpen(21) || !tab.IsOpen(22) || tab.Evicted() != 1 || tab.Len() != 2 {
		t.Errorf("bound: open 20=%v 21=%v 22=%v evicted=%d len=%d", tab.IsOpen(20), tab.IsOpen(21), tab.IsOpen(22), tab.Evicted(), tab.Len())
	}
}

// TestRevokeIsABarrier races writers against Revoke: once Revoke has
// returned, no write under the key may still be copying or start copying.
func TestRevokeIsABarrier(t *testing.T) {
	for range 20 {
		tab := NewWindowTable(0)
		tab.Open(1, RoomID{}, []int32{0})
		var revoked atomic.Bool
		var late, applied atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					err := tab.Apply(1, 0, func() {
						applied.Add(1)
						runtime.Gosched() // a copy takes a while
						if revoked.Load() {
							late.Add(1)
						}
					})
					if err != nil {
						return
					}
				}
			})
		}
		for applied.Load() < 100 {
			runtime.Gosched() // let the writers get going
		}
		tab.Revoke(1)
		revoked.Store(true)
		wg.Wait()
		if n := late.Load(); n != 0 {
			t.Fatalf("%d writes applied after Revoke returned", n)
		}
	}
}

// BenchmarkLand is the receiver's cost of applying one qwen3-0.6b page
// write (3.67 MB) through the window table.
func BenchmarkLand(b *testing.B) {
	shape := kvpool.Shape{Layers: 28, KVHeads: 8, HeadDim: 128, PageSize: 16}
	pool, err := kvpool.New(kvpool.Config{Shape: shape, Pages: 2})
	if err != nil {
		b.Fatal(err)
	}
	tab := NewWindowTable(0)
	tab.Open(1, RoomID{}, []int32{1})
	w := &Write{Key: 1, Page: 1, Data: pool.PageData(0)}
	b.SetBytes(int64(shape.PageBytes()))
	b.ReportAllocs()
	for b.Loop() {
		if err := tab.Land(pool, w); err != nil {
			b.Fatal(err)
		}
	}
}
