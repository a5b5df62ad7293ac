package model

import (
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

// FuzzFromGGUF: whatever a parsable GGUF file says, loading it returns a
// model or an error, never a panic, and a model that loads runs a forward
// step.
func FuzzFromGGUF(f *testing.F) {
	small := func(arch string, typ gguf.TensorType, tied bool) spec {
		return spec{arch: arch, layers: 1, dim: 32, heads: 2, kvHeads: 1, hd: 16, ff: 32, vocab: 8, ctx: 16,
			typ: typ, tied: tied, ropeBase: 10000, seed: 3, eps: 1e-5}
	}
	f.Add(small("llama", gguf.TypeF32, false).build(f))
	f.Add(small("qwen2", gguf.TypeQ8_0, true).build(f))
	f.Add(small("qwen3", gguf.TypeF16, false).build(f))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := gguf.Parse(data)
		if err != nil {
			return
		}
		m, err := FromGGUF(file)
		if err != nil {
			return
		}
		ws := m.NewWorkspace(2, 1, 1)
		defer ws.Close()
		kv := NewSliceStore(m.Config, 2, 1)
		if err := m.Forward(ws, kv, []Seq{{Tokens: []int32{0, 1 % int32(m.Config.Vocab)}, Pages: []int32{0}, Logits: LogitsAll}}); err != nil {
			// Only a context window shorter than 2 may refuse it.
			if m.Config.ContextLength >= 2 {
				t.Fatalf("Forward: %v", err)
			}
		}
	})
}
