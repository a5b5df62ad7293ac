package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

// argmax is greedy decoding: the first index of the largest logit.
func argmax(l []float32) int32 {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return int32(best)
}

// genSeq is one sequence of a greedy generation run.
type genSeq struct {
	prompt []int32
	pages  []int32
	done   int        // prompt tokens already fed
	out    []int32    // generated tokens
	logits [][]uint32 // bits of the logits behind each generated token
}

func (g *genSeq) record(l []float32) {
	bits := make([]uint32, len(l))
	for i, v := range l {
		bits[i] = math.Float32bits(v)
	}
	g.logits = append(g.logits, bits)
	g.out = append(g.out, argmax(l))
}

// generate runs greedy generation of steps tokens for every sequence. When
// together is false each sequence runs alone; otherwise all share every
// Forward call: prefill chunks of up to chunk tokens and decode steps mixed
// in one batch, the batch order rotating each step.
func generate(t *testing.T, m *Model, prompts [][]int32, steps, chunk, threads, pageSize int, together bool) []*genSeq {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(chunk), uint64(pageSize)))
	perSeq := (m.Config.ContextLength + pageSize - 1) / pageSize
	kv := NewSliceStore(m.Config, pageSize, perSeq*len(prompts))
	all := pageTable(rng, perSeq*len(prompts), perSeq*len(prompts))
	seqs := make([]*genSeq, len(prompts))
	for i, p := range prompts {
		seqs[i] = &genSeq{prompt: p, pages: all[i*perSeq : (i+1)*perSeq]}
	}
	ws := m.NewWorkspace(chunk*len(prompts), len(prompts), threads)
	defer ws.Close()
	groups := [][]*genSeq{seqs}
	if !together {
		groups = nil
		for _, s := range seqs {
			groups = append(groups, []*genSeq{s})
		}
	}
	for _, group := range groups {
		for step := 0; ; step++ {
			var batch []Seq
			var who []*genSeq
			for k := range group {
				g := group[(k+step)%len(group)]
				if len(g.out) == steps {
					continue
				}
				var sq Seq
				if g.done < len(g.prompt) {
					end := min(g.done+chunk, len(g.prompt))
					sq = Seq{Tokens: g.prompt[g.done:end], Pos: g.done, Pages: g.pages}
					if end == len(g.prompt) {
						sq.Logits = LogitsLast
					}
					g.done = end
				} else {
					pos := len(g.prompt) + len(g.out) - 1
					sq = Seq{Tokens: g.out[len(g.out)-1:], Pos: pos, Pages: g.pages, Logits: LogitsLast}
				}
				batch = append(batch, sq)
				who = append(who, g)
			}
			if len(batch) == 0 {
				break
			}
			if err := m.Forward(ws, kv, batch); err != nil {
				t.Fatal(err)
			}
			for i, g := range who {
				if batch[i].Logits == LogitsLast {
					g.record(ws.Logits(i, 0))
				}
			}
		}
	}
	return seqs
}

// TestBatchInvariance is invariant I7 at the model level: a sequence's
// greedy output and the logits behind it are bit-identical whether it runs
// alone or in a batch with seven other sequences of different lengths, and
// whatever the chunking, page size and thread count.
func TestBatchInvariance(t *testing.T) {
	models := []struct {
		name string
		load func(t testing.TB) *Model
	}{
		{"built/qwen3/Q8_0/tied", func(t testing.TB) *Model {
			m, _ := loadBuilt(t, tinyOptions("qwen3", gguf.TypeQ8_0, true))
			return m
		}},
		{"own/llama/F16", func(t testing.TB) *Model { m, _ := tinySpec("llama", gguf.TypeF16, false).load(t); return m }},
		{"built/qwen2/BF16", func(t testing.TB) *Model {
			m, _ := loadBuilt(t, tinyOptions("qwen2", gguf.TypeBF16, false))
			return m
		}},
	}
	const steps = 10
	for _, tm := range models {
		t.Run(tm.name, func(t *testing.T) {
			m := tm.load(t)
			rng := rand.New(rand.NewPCG(5, 5))
			var prompts [][]int32
			for _, n := range []int{1, 3, 9, 17, 30, 5, 12, 41} {
				prompts = append(prompts, randTokens(rng, n, m.Config.Vocab))
			}
			want := generate(t, m, prompts, steps, 64, 1, 16, false)
			runs := []struct {
				chunk, threads, pageSize int
				together                 bool
			}{
				{1, 2, 1, false},
				{4, 2, 16, true},
				{7, 3, 1, true},
				{64, 1, 64, true},
				{64, 2, 16, true},
			}
			for _, r := range runs {
				got := generate(t, m, prompts, steps, r.chunk, r.threads, r.pageSize, r.together)
				name := fmt.Sprintf("chunk %d threads %d page %d together %v", r.chunk, r.threads, r.pageSize, r.together)
				for i := range want {
					if fmt.Sprint(got[i].out) != fmt.Sprint(want[i].out) {
						t.Fatalf("%s: sequence %d generated %v, alone %v", name, i, got[i].out, want[i].out)
					}
					for s := range want[i].logits {
						for j, b := range want[i].logits[s] {
							if got[i].logits[s][j] != b {
								t.Fatalf("%s: sequence %d step %d logit %d differs in bits from the run alone", name, i, s, j)
							}
						}
					}
				}
			}
			// The outputs must not be degenerate, or the test proves little.
			distinct := map[string]bool{}
			for _, g := range want {
				distinct[fmt.Sprint(g.out)] = true
			}
			if len(distinct) < 4 {
				t.Fatalf("only %d distinct outputs of 8 sequences: the model is too flat to test anything", len(distinct))
			}
		})
	}
}
