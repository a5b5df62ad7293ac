package kvpool

import (
	"hash/adler32"
	"hash/crc32"
	"hash/crc64"
	"hash/fnv"
	"hash/maphash"
	"testing"
)

// qwen3-0.6b: 28 layers, 8 kv heads, head dim 128, page size 16 (3.67 MB
// per page).
var qwen3 = Shape{Layers: 28, KVHeads: 8, HeadDim: 128, PageSize: 16}

const benchPages = 8

func benchPool(b *testing.B) (*Pool, []int32) {
	b.Helper()
	p, err := New(Config{Shape: qwen3, Pages: benchPages})
	if err != nil {
		b.Fatal(err)
	}
	pages, _ := p.Alloc(room(1), benchPages, nil)
	for i, pg := range pages {
		p.Stamp(pg, uint32(i), 16)
		data := p.PageData(pg)
		for j := range data {
			data[j] = byte(j*31 + i)
		}
	}
	return p, pages
}

// BenchmarkVerifyFences is the per-read cost: one call per sequence per
// step over its page table; ns/page is what matters.
func BenchmarkVerifyFences(b *testing.B) {
	p, pages := benchPool(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := p.VerifyFences(room(1), pages); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(pages)), "ns/page")
}

// BenchmarkChecksum compares the standard library's candidates over one
// whole page (header + data). CRC-32 IEEE is the chosen one; maphash is listed
// as a speed reference only: its seed cannot be shared between processes,
// so it cannot check a transfer.
func BenchmarkChecksum(b *testing.B) {
	p, pages := benchPool(b)
	pb := p.PageBytes(pages[0])
	ieee := crc32.MakeTable(crc32.IEEE)
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	ecma := crc64.MakeTable(crc64.ECMA)
	seed := maphash.MakeSeed()
	var sink uint64
	cands := []struct {
		name string
		fn   func([]byte) uint64
	}{
		{"crc32c", func(d []byte) uint64 { return uint64(crc32.Update(0, castagnoli, d)) }},
		{"crc32-ieee", func(d []byte) uint64 { return uint64(crc32.Update(0, ieee, d)) }},
		{"crc64-ecma", func(d []byte) uint64 { return crc64.Update(0, ecma, d) }},
		{"adler32", func(d []byte) uint64 { return uint64(adler32.Checksum(d)) }},
		{"fnv1a-64", func(d []byte) uint64 { h := fnv.New64a(); h.Write(d); return h.Sum64() }},
		{"maphash-ref", func(d []byte) uint64 { return maphash.Bytes(seed, d) }},
	}
	for _, c := range cands {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(pb)))
			b.ReportAllocs()
			for b.Loop() {
				sink += c.fn(pb)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/page")
		})
	}
	_ = sink
}

// BenchmarkVerifyChecksum is the pool's own path (header parse + CRC-32).
func BenchmarkVerifyChecksum(b *testing.B) {
	p, pages := benchPool(b)
	h := Header{Fence: p.Expected(pages[1]), Page: pages[1], Ordinal: 0, Tokens: 16}
	hdr := p.Seal(pages[0], h)
	copy(p.PageBytes(pages[1]), hdr[:])
	copy(p.PageData(pages[1]), p.PageData(pages[0]))
	b.SetBytes(int64(qwen3.PageBytes()))
	b.ReportAllocs()
	for b.Loop() {
		if err := p.VerifyChecksum(pages[1]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/page")
}
