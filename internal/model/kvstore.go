package model

// KVStore is where the forward pass keeps attention keys and values: fixed-size
// pages of PageSize token slots, each page holding K and V for every layer.
// Token position p of a sequence lives in page Pages[p/PageSize()], slot
// p%PageSize(), of that sequence's page table. The forward pass reaches KV only
// through a page table and this interface; it never learns whose pages they are.
//
// Implementations: internal/kvpool.Pool (the real, fenced pool) and
// model.SliceStore (a plain store for tests and local generation).
type KVStore interface {
	// PageSize is the number of token slots per page.
	PageSize() int
	// LayerKV returns the K and V of one layer of one page. Each slice holds
	// PageSize()*KVHeads*HeadDim float32s, slot-major: slot s, kv head h,
	// dimension d at index (s*KVHeads+h)*HeadDim+d. The slices alias the
	// store's memory: the forward pass writes new K/V through them and reads
	// past K/V from them. It MUST NOT allocate. A page id the store does not
	// have is a programmer error and panics.
	//
	// Forward calls LayerKV from its worker goroutines concurrently (many
	// readers of the same and of different pages at once, while no Forward
	// call is writing those pages' slots), so implementations MUST be safe
	// for concurrent calls. Within one Forward, the K/V of the batch's new
	// tokens are written before any attention reads them.
	LayerKV(page int32, layer int) (k, v []float32)
}
