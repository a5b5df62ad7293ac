package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

func randTokens(rng *rand.Rand, n, vocab int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(rng.IntN(vocab))
	}
	return t
}

// pageTable returns a shuffled page table of n pages out of a store of
// total, so that a sequence's pages are neither contiguous nor in order.
func pageTable(rng *rand.Rand, n, total int) []int32 {
	perm := rng.Perm(total)
	pt := make([]int32, n)
	for i := range pt {
		pt[i] = int32(perm[i])
	}
	return pt
}

// runChunked feeds tokens through Forward chunk tokens at a time and returns
// copies of every position's logits.
func runChunked(t testing.TB, m *Model, ws *Workspace, kv KVStore, pages []int32, tokens []int32, chunk int) [][]float32 {
	t.Helper()
	var out [][]float32
	for pos := 0; pos < len(tokens); pos += chunk {
		end := min(pos+chunk, len(tokens))
		batch := []Seq{{Tokens: tokens[pos:end], Pos: pos, Pages: pages, Logits: LogitsAll}}
		if err := m.Forward(ws, kv, batch); err != nil {
			t.Fatalf("Forward at %d: %v", pos, err)
		}
		for i := range end - pos {
			out = append(out, append([]float32(nil), ws.Logits(0, i)...))
		}
	}
	return out
}

// refTolerance is how far the fast path's logits may be from the float64
// reference, relative to the largest reference logit. Both read the same
// dequantized weights, so the difference is float32 rounding alone: about
// 2⁻²⁴ per operation, grown by sums of ~100 terms, a few layers and the
// final normalisation. Measured worst cases are below 6e-7 for every
// architecture and weight type (reported with -v); 1e-5 leaves a margin of
// more than ten and still catches any wrong formula (a rope pairing, a
// missing frequency factor, an off-by-one in the attended range), each of
// which moves logits by 1e-2 or more.
const refTolerance = 1e-5

// testModels lists the reference test's models: every architecture ×
// weight type × tied/untied as internal/modelbuild writes them (loaded
// through Load, the mmap path), and this package's own llama with Llama 3.1
// frequency factors and linear rope scaling, which the builder does not
// write.
func testModels() []struct {
	name string
	load func(t testing.TB) (*Model, *gguf.File, spec)
} {
	type entry = struct {
		name string
		load func(t testing.TB) (*Model, *gguf.File, spec)
	}
	var out []entry
	for _, arch := range []string{"llama", "qwen2", "qwen3"} {
		for _, typ := range []gguf.TensorType{gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16, gguf.TypeQ8_0} {
			for _, tied := range []bool{false, true} {
				o := tinyOptions(arch, typ, tied)
				out = append(out, entry{fmt.Sprintf("built/%s/%v/tied=%v", arch, typ, tied), func(t testing.TB) (*Model, *gguf.File, spec) {
					m, f := loadBuilt(t, o)
					return m, f, specOf(o)
				}})
			}
		}
	}
	// Q4_0 is supported beyond the required types: one model of it.
	q4 := tinyOptions("qwen2", gguf.TypeQ4_0, false)
	out = append(out, entry{"built/qwen2/Q4_0/tied=false", func(t testing.TB) (*Model, *gguf.File, spec) {
		m, f := loadBuilt(t, q4)
		return m, f, specOf(q4)
	}})
	for _, typ := range []gguf.TensorType{gguf.TypeF32, gguf.TypeQ8_0} {
		s := tinySpec("llama", typ, false)
		out = append(out, entry{"own/llama-rope-factors/" + typ.String(), func(t testing.TB) (*Model, *gguf.File, spec) {
			m, f := s.load(t)
			return m, f, s
		}})
	}
	return out
}

func TestForwardMatchesReference(t *testing.T) {
	const n = 70
	for _, tm := range testModels() {
		t.Run(tm.name, func(t *testing.T) {
			t.Parallel()
			m, f, s := tm.load(t)
			rng := rand.New(rand.NewPCG(3, 99))
			tokens := randTokens(rng, n, s.vocab)
			ref := refForward(t, s, f, tokens)
			var worst float64
			for _, ps := range []int{1, 16, 64} {
				for _, chunk := range []int{1, 7, 64} {
					total := (n+ps-1)/ps + 3
					kv := NewSliceStore(m.Config, ps, total)
					ws := m.NewWorkspace(64, 1, 2)
					got := runChunked(t, m, ws, kv, pageTable(rng, total-3, total), tokens, chunk)
					ws.Close()
					for p := range n {
						var scale, diff float64
						for i := range ref[p] {
							scale = math.Max(scale, math.Abs(ref[p][i]))
							diff = math.Max(diff, math.Abs(float64(got[p][i])-ref[p][i]))
						}
						rel := diff / scale
						worst = math.Max(worst, rel)
						if rel > refTolerance {
							t.Fatalf("page %d chunk %d position %d: max |fast-ref| = %g of max |ref| %g (rel %g > %g)", ps, chunk, p, diff, scale, rel, refTolerance)
						}
					}
				}
			}
			t.Logf("worst relative logit error %.2g", worst)
		})
	}
}
