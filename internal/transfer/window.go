package transfer

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvfence/kvfence/internal/kvpool"
)

// Windows is what a decode machine needs from the receiving side of its
// transport: the memory-window operations an RDMA NIC offers. *WindowTable
// implements it for the in-process and TCP transports.
type Windows interface {
	// Open makes pages writable under key for room. key is fresh (never
	// opened before on this table).
	Open(key WindowKey, room RoomID, pages []int32)
	// Revoke closes key. When Revoke returns, no write under key is in
	// progress and none will land later: it is a barrier, not a hint.
	// Revoking an unknown or already revoked key does nothing.
	Revoke(key WindowKey)
}

// Errors of WindowTable.Apply: the write was refused and did not touch
// pool memory.
var (
	ErrNoWindow         = errors.New("transfer: write under a window that is not open")
	ErrPageNotInWindow  = errors.New("transfer: write to a page outside its window")
	ErrWriteSize        = errors.New("transfer: write data is not one page")
	defaultWindowsLimit = 4096
)

// WindowTable is the receiver's table of open windows. It is safe for
// concurrent use.
//
// A receiver MUST apply every page write through Apply (or Land), which
// runs the copy while holding the table's read lock; Revoke takes the
// write lock, so it waits for copies in progress under any key and, once
// it returns, the key is gone and every later Apply under it fails. That
// is what makes revocation a barrier: a receiver that checked the key and
// then copied outside the lock could land a write after Revoke returned.
// Copies run concurrently with each other; a Revoke waits for the copies
// in progress (at most one page each).
//
// The table is bounded: opening a window when Limit windows are open
// evicts the oldest (which only happens when revocation is switched off,
// or the limit is below the decode machine's MaxRooms).
type WindowTable struct {
	limit int
	// mu guards windows and order. Apply holds it for reading across the
	// copy into pool memory; Open and Revoke hold it for writing.
	mu      sync.RWMutex
	windows map[WindowKey]*window
	order   []WindowKey // open keys, oldest first
	evicted uint64
}

type window struct {
	room  RoomID
	pages []int32
}

// NewWindowTable returns a table holding at most limit windows (a default
// of 4096 when limit <= 0).
func NewWindowTable(limit int) *WindowTable {
	if limit <= 0 {
		limit = defaultWindowsLimit
	}
	return &WindowTable{limit: limit, windows: make(map[WindowKey]*window)}
}

// Open implements Windows.
func (t *WindowTable) Open(key WindowKey, room RoomID, pages []int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.windows[key]; ok {
		panic(fmt.Sprintf("kvfence: invariant violated: window key %d opened twice", key))
	}
	for len(t.order) >= t.limit {
		delete(t.windows, t.order[0])
		t.order = t.order[1:]
		t.evicted++
	}
	t.windows[key] = &window{room: room, pages: slices.Clone(pages)}
	t.order = append(t.order, key)
}

// Revoke implements Windows.
func (t *WindowTable) Revoke(key WindowKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.windows[key]; !ok {
		return
	}
	delete(t.windows, key)
	if i := slices.Index(t.order, key); i >= 0 {
		t.order = slices.Delete(t.order, i, i+1)
	}
}

// IsOpen reports whether key is open.
func (t *WindowTable) IsOpen(key WindowKey) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.windows[key]
	return ok
}

// Len is the number of open windows; Evicted counts windows closed by the
// bound.
func (t *WindowTable) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.windows)
}

// Evicted counts windows closed because the table was full.
func (t *WindowTable) Evicted() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.evicted
}

// Apply runs apply, which writes one page, if window key is open and holds
// page; it holds the table's read lock while apply runs. It checks nothing
// else: like a NIC, it neither reads the header nor knows the fence.
func (t *WindowTable) Apply(key WindowKey, page int32, apply func()) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	w, ok := t.windows[key]
	if !ok {
		return ErrNoWindow
	}
	if !slices.Contains(w.pages, page) {
		return ErrPageNotInWindow
	}
	apply()
	return nil
}

// Land applies a Write to pool through the table: the header and data are
// copied into page w.Page if the window allows it. It does not check the
// MAC; a TCP receiver verifies it (Auth.Verify) before calling Land.
func (t *WindowTable) Land(pool *kvpool.Pool, w *Write) error {
	if w.Page < 0 || int(w.Page) >= pool.Total() {
		return ErrPageNotInWindow
	}
	if len(w.Data) != pool.Shape().PageBytes()-kvpool.HeaderSize {
		return ErrWriteSize
	}
	return t.Apply(w.Key, w.Page, func() {
		dst := pool.PageBytes(w.Page)
		copy(dst[:kvpool.HeaderSize], w.Header[:])
		copy(dst[kvpool.HeaderSize:], w.Data)
	})
}
