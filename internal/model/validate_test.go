package model

import (
	"errors"
	"hash/crc32"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/internal/gguf"
)

func storeSum(s *SliceStore) uint32 {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s.data))), len(s.data)*4)
	return crc32.ChecksumIEEE(b)
}

// TestForwardRejectsBadBatches: caller input never panics; a bad batch is
// an ErrBatch error and nothing is written, even when an earlier chunk of
// the batch was fine.
func TestForwardRejectsBadBatches(t *testing.T) {
	m, _ := tinySpec("qwen3", gguf.TypeF32, false).load(t)
	kv := NewSliceStore(m.Config, 16, 20)
	ws := m.NewWorkspace(32, 3, 2)
	defer ws.Close()
	good := Seq{Tokens: []int32{1, 2, 3}, Pos: 0, Pages: []int32{0}, Logits: LogitsLast}
	many := make([]int32, 33)
	tests := []struct {
		name string
		bad  Seq
		want string
	}{
		{"empty chunk", Seq{Pages: []int32{1}}, "no tokens"},
		{"token past vocab", Seq{Tokens: []int32{1, int32(m.Config.Vocab)}, Pages: []int32{1}}, "outside the vocabulary"},
		{"negative token", Seq{Tokens: []int32{-1}, Pages: []int32{1}}, "outside the vocabulary"},
		{"too many tokens", Seq{Tokens: many, Pages: []int32{1, 2, 3}}, "more than 32 tokens"},
		{"negative position", Seq{Tokens: []int32{1}, Pos: -1, Pages: []int32{1}}, "positions"},
		{"past context", Seq{Tokens: []int32{1, 2}, Pos: m.Config.ContextLength - 1, Pages: make([]int32, 20)}, "context window"},
		{"page table short", Seq{Tokens: []int32{1, 2}, Pos: 15, Pages: []int32{1}}, "page table covers 16"},
		{"no page table", Seq{Tokens: []int32{1}}, "page table covers 0"},
		{"negative page", Seq{Tokens: []int32{1}, Pos: 16, Pages: []int32{1, -2}}, "negative"},
		{"logit mode", Seq{Tokens: []int32{1}, Pages: []int32{1}, Logits: 7}, "logit mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := storeSum(kv)
			err := m.Forward(ws, kv, []Seq{good, tt.bad})
			if !errors.Is(err, ErrBatch) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrBatch mentioning %q", err, tt.want)
			}
			if storeSum(kv) != before {
				t.Fatalf("a refused batch wrote to the store")
			}
		})
	}
	if err := m.Forward(ws, kv, []Seq{good, good, good, good}); !errors.Is(err, ErrBatch) {
		t.Fatalf("4 chunks in a workspace of 3: err = %v", err)
	}
	other, _ := tinySpec("qwen3", gguf.TypeF32, false).load(t)
	if err := other.Forward(ws, kv, []Seq{good}); !errors.Is(err, ErrBatch) {
		t.Fatalf("workspace of another model: err = %v", err)
	}
	// The good chunk alone runs, and its logits are finite.
	if err := m.Forward(ws, kv, []Seq{good}); err != nil {
		t.Fatal(err)
	}
	for _, v := range ws.Logits(0, 0) {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatal("non-finite logit")
		}
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		s    func() spec
		want []string
	}{
		{"unknown arch", func() spec { s := tinySpec("llama", gguf.TypeF32, false); s.arch = "mamba"; return s },
			[]string{"mamba", "llama, qwen2, qwen3"}},
		{"missing key", func() spec {
			s := tinySpec("llama", gguf.TypeF32, false)
			s.skipKeys = map[string]bool{"llama.embedding_length": true}
			return s
		}, []string{"llama.embedding_length"}},
		{"wrong shape", func() spec {
			s := tinySpec("qwen2", gguf.TypeF32, false)
			s.mutate = func(name string, _ *gguf.TensorType, dims *[]uint64) {
				if name == "blk.1.attn_k.weight" {
					*dims = []uint64{64, 48}
				}
			}
			return s
		}, []string{"blk.1.attn_k.weight", "[64 48]"}},
		{"unsupported matrix type", func() spec {
			s := tinySpec("qwen3", gguf.TypeF32, false)
			s.mutate = func(name string, typ *gguf.TensorType, _ *[]uint64) {
				if name == "blk.0.ffn_up.weight" {
					*typ = gguf.TypeQ4_1
				}
			}
			return s
		}, []string{"blk.0.ffn_up.weight", "Q4_1"}},
		{"quantized norm", func() spec {
			s := tinySpec("llama", gguf.TypeF32, false)
			s.mutate = func(name string, typ *gguf.TensorType, _ *[]uint64) {
				if name == "blk.0.attn_norm.weight" {
					*typ = gguf.TypeQ8_0
				}
			}
			return s
		}, []string{"blk.0.attn_norm.weight", "Q8_0"}},
		{"partial rope", func() spec {
			s := tinySpec("llama", gguf.TypeF32, false)
			s.extraKeys = map[string]any{"llama.rope.dimension_count": uint32(8)}
			return s
		}, []string{"rope.dimension_count 8", "16"}},
		{"yarn rope", func() spec {
			s := tinySpec("qwen2", gguf.TypeF32, false)
			s.extraKeys = map[string]any{"qwen2.rope.scaling.type": "yarn"}
			return s
		}, []string{"yarn", "none, linear"}},
		{"string where a number belongs", func() spec {
			s := tinySpec("qwen3", gguf.TypeF32, false)
			s.extraKeys = map[string]any{"qwen3.block_count": "two"}
			return s
		}, []string{"qwen3.block_count"}},
		{"missing bias", func() spec {
			s := tinySpec("qwen2", gguf.TypeF32, false)
			s.skipKeys = map[string]bool{"blk.1.attn_q.bias": true}
			return s
		}, []string{"blk.1.attn_q.bias", "missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := gguf.Parse(tt.s().build(t))
			if err != nil {
				t.Fatal(err)
			}
			_, err = FromGGUF(f)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestConfigFromBuiltModel(t *testing.T) {
	m, _ := loadBuilt(t, tinyOptions("qwen3", gguf.TypeQ8_0, true))
	c := m.Config
	want := Config{Arch: "qwen3", Name: c.Name, Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 96, Vocab: 320,
		ContextLength: 160, RopeBase: 1e6, RopeScale: 1, RMSEps: float64(float32(1e-6)), NeoXRope: true, QKNorm: true, TiedEmbeddings: true}
	if c != want {
		t.Fatalf("config\n got %+v\nwant %+v", c, want)
	}
	if m.Tok == nil || m.Tok.VocabSize() != 320 {
		t.Fatalf("tokenizer not loaded")
	}
	ids := m.Tok.Encode("the cat", struct{ AddSpecial, ParseSpecial bool }{})
	if len(ids) == 0 {
		t.Fatal("tokenizer encodes nothing")
	}
}

// TestForwardAllocatesNothing: steady-state Forward (decode steps and
// prefill chunks, two threads) allocates nothing.
func TestForwardAllocatesNothing(t *testing.T) {
	m, _ := loadBuilt(t, tinyOptions("qwen2", gguf.TypeQ8_0, false))
	kv := NewSliceStore(m.Config, 16, 64)
	ws := m.NewWorkspace(64, 8, 2)
	defer ws.Close()
	prefill := []Seq{{Tokens: make([]int32, 40), Pages: []int32{0, 1, 2}, Logits: LogitsLast}}
	var decode []Seq
	for i := range 8 {
		decode = append(decode, Seq{Tokens: []int32{int32(i)}, Pos: 20 + i, Pages: []int32{int32(8 + 2*i), int32(9 + 2*i)}, Logits: LogitsLast})
	}
	for _, b := range [][]Seq{prefill, decode} {
		if err := m.Forward(ws, kv, b); err != nil { // warm up
			t.Fatal(err)
		}
		if a := testing.AllocsPerRun(20, func() {
			if err := m.Forward(ws, kv, b); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Fatalf("Forward of %d chunks allocates %v times per call", len(b), a)
		}
	}
}

// TestDroppedWorkspaceStopsWorkers: a Workspace that is never closed does
// not leak its worker goroutines once it is garbage.
func TestDroppedWorkspaceStopsWorkers(t *testing.T) {
	m, _ := tinySpec("llama", gguf.TypeF32, false).load(t)
	before := runtime.NumGoroutine()
	for range 5 {
		ws := m.NewWorkspace(4, 1, 4)
		_ = ws
	}
	if runtime.NumGoroutine() < before+15 {
		t.Fatalf("workers did not start: %d goroutines, %d before", runtime.NumGoroutine(), before)
	}
	for i := 0; i < 100 && runtime.NumGoroutine() > before; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines remain, %d before", n, before)
	}
}
