package model

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/modelbuild"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if presetDir != "" {
		os.RemoveAll(presetDir)
	}
	os.Exit(code)
}

// The qwen3-0.6b preset files are built once per test process, on first
// use, into presetDir (removed by TestMain).
var (
	presetMu    sync.Mutex
	presetDir   string
	presetFiles = map[gguf.TensorType]string{}
)

func presetModel(b *testing.B, typ gguf.TensorType) *Model {
	b.Helper()
	if testing.Short() {
		b.Skip("the qwen3-0.6b preset is large; skipped with -short")
	}
	presetMu.Lock()
	defer presetMu.Unlock()
	path, ok := presetFiles[typ]
	if !ok {
		if presetDir == "" {
			d, err := os.MkdirTemp("", "kvfence-model-bench-")
			if err != nil {
				b.Fatal(err)
			}
			presetDir = d
		}
		o, err := modelbuild.Preset("qwen3-0.6b")
		if err != nil {
			b.Fatal(err)
		}
		o.Type = typ
		path = filepath.Join(presetDir, "qwen3-0.6b-"+typ.String()+".gguf")
		if err := modelbuild.Write(o, path); err != nil {
			b.Fatal(err)
		}
		presetFiles[typ] = path
	}
	m, err := Load(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkPrefill512 is one 512-token prefill chunk, logits for the last
// token only.
func BenchmarkPrefill512(b *testing.B) {
	for _, typ := range []gguf.TensorType{gguf.TypeQ8_0, gguf.TypeF16} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%v/threads=%d", typ, threads), func(b *testing.B) {
				m := presetModel(b, typ)
				const n = 512
				kv := NewSliceStore(m.Config, 64, n/64)
				pages := make([]int32, n/64)
				for i := range pages {
					pages[i] = int32(i)
				}
				tokens := make([]int32, n)
				for i := range tokens {
					tokens[i] = int32(i * 37 % 151000)
				}
				ws := m.NewWorkspace(n, 1, threads)
				defer ws.Close()
				batch := []Seq{{Tokens: tokens, Pages: pages, Logits: LogitsLast}}
				// Warm up cheaply: a 4-token chunk at the end of the window
				// grows the scratch (attention scores, weight tiles) to what
				// the measured calls need.
				warm := []Seq{{Tokens: tokens[:4], Pos: n - 4, Pages: pages, Logits: LogitsLast}}
				if err := m.Forward(ws, kv, warm); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					if err := m.Forward(ws, kv, batch); err != nil {
						b.Fatal(err)
					}
				}
				reportRates(b, n, cpu0)
			})
		}
	}
}

// BenchmarkDecode is one decode step of a batch of sequences, each at
// position 256 (their earlier K/V are zeros: the cost of attention over 256
// positions is what matters here, not what it reads).
func BenchmarkDecode(b *testing.B) {
	const pos = 256
	for _, typ := range []gguf.TensorType{gguf.TypeQ8_0, gguf.TypeF16} {
		for _, batchSize := range []int{1, 8} {
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%v/batch=%d/threads=%d", typ, batchSize, threads), func(b *testing.B) {
					m := presetModel(b, typ)
					perSeq := pos/64 + 1
					kv := NewSliceStore(m.Config, 64, perSeq*batchSize)
					var batch []Seq
					for s := range batchSize {
						pages := make([]int32, perSeq)
						for i := range pages {
							pages[i] = int32(s*perSeq + i)
						}
						batch = append(batch, Seq{Tokens: []int32{int32(1000 + s)}, Pos: pos, Pages: pages, Logits: LogitsLast})
					}
					ws := m.NewWorkspace(batchSize, batchSize, threads)
					defer ws.Close()
					if err := m.Forward(ws, kv, batch); err != nil { // warm up: grow scratch to this context
						b.Fatal(err)
					}
					b.ReportAllocs()
					cpu0 := cpuTime()
					for b.Loop() {
						if err := m.Forward(ws, kv, batch); err != nil {
							b.Fatal(err)
						}
					}
					reportRates(b, batchSize, cpu0)
				})
			}
		}
	}
}

// reportRates reports tokens per wall-clock second and per CPU second of
// the process. On a shared machine the wall-clock rate depends on the
// neighbours; the CPU rate much less (it is what one core delivers while
// it runs this code).
func reportRates(b *testing.B, tokensPerOp int, cpu0 time.Duration) {
	tokens := float64(tokensPerOp * b.N)
	b.ReportMetric(tokens/b.Elapsed().Seconds(), "tok/s")
	if cpu := cpuTime() - cpu0; cpu > 0 {
		b.ReportMetric(tokens/cpu.Seconds(), "tok/cpu-s")
	}
}
