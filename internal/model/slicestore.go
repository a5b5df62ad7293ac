package model

import "fmt"

// SliceStore is a KVStore in one plain float32 slice: pages numbered
// 0..pages-1, each holding K then V of every layer. It is for tests and
// local generation; it has no fences and no owners.
type SliceStore struct {
	pageSize int
	layers   int
	slot     int // float32s of K (or V) per slot per layer
	data     []float32
}

// NewSliceStore allocates pages pages of pageSize token slots for cfg.
func NewSliceStore(cfg Config, pageSize, pages int) *SliceStore {
	if pageSize <= 0 || pages < 0 {
		panic(fmt.Sprintf("model: NewSliceStore(%d, %d)", pageSize, pages))
	}
	slot := cfg.KVFloats()
	return &SliceStore{
		pageSize: pageSize,
		layers:   cfg.Layers,
		slot:     slot,
		data:     make([]float32, pages*cfg.Layers*2*pageSize*slot),
	}
}

// PageSize implements KVStore.
func (s *SliceStore) PageSize() int { return s.pageSize }

// Pages is the number of pages.
func (s *SliceStore) Pages() int {
	if s.layers == 0 || s.slot == 0 {
		return 0
	}
	return len(s.data) / (s.layers * 2 * s.pageSize * s.slot)
}

// LayerKV implements KVStore. It is safe for concurrent use.
func (s *SliceStore) LayerKV(page int32, layer int) (k, v []float32) {
	n := s.pageSize * s.slot
	if page < 0 || int(page) >= s.Pages() || layer < 0 || layer >= s.layers {
		panic(fmt.Sprintf("model: SliceStore has no page %d layer %d", page, layer))
	}
	base := (int(page)*s.layers + layer) * 2 * n
	return s.data[base : base+n : base+n], s.data[base+n : base+2*n : base+2*n]
}
