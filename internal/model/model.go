package model

import (
	"fmt"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/kernels"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

// Model is a loaded model: its shape, tokenizer and weights. The big
// matrices stay in their file format and alias the file mapping; only norm
// weights and biases are copied out as float32. A Model is immutable after
// loading and safe for concurrent Forward calls with distinct Workspaces.
type Model struct {
	Config Config
	Tok    *tokenizer.Tokenizer // nil when the file carries no tokenizer

	embd    kernels.Matrix // [Vocab rows][Dim]
	outNorm []float32
	output  kernels.Matrix // [Vocab rows][Dim]; embd when tied
	layers  []layer
	freq    []float64 // rope angular frequency of each pair, HeadDim/2

	file *gguf.File // closed by Close when Load opened it
}

type layer struct {
	attnNorm          []float32
	wq, wk, wv, wo    kernels.Matrix
	bq, bk, bv        []float32 // qwen2
	qNorm, kNorm      []float32 // qwen3
	ffnNorm           []float32
	wGate, wUp, wDown kernels.Matrix
}

// Load opens a GGUF file and loads the model in it. The weights stay in the
// read-only file mapping until Close.
func Load(path string) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := FromGGUF(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	m.file = f
	return m, nil
}

// FromGGUF loads the model in f. The Model aliases f's tensor data: f must
// stay open as long as the Model is used (Close does not close it).
func FromGGUF(f *gguf.File) (*Model, error) {
	cfg, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: cfg}
	if _, ok := f.Get("tokenizer.ggml.model"); ok {
		tc, err := tokenizer.FromGGUF(f)
		if err != nil {
			return nil, fmt.Errorf("model: tokenizer: %w", err)
		}
		if m.Tok, err = tokenizer.New(tc); err != nil {
			return nil, fmt.Errorf("model: tokenizer: %w", err)
		}
		if m.Tok.VocabSize() > cfg.Vocab {
			return nil, fmt.Errorf("model: tokenizer has %d tokens, token_embd.weight only %d rows", m.Tok.VocabSize(), cfg.Vocab)
		}
	}
	l := loader{f: f}
	c := cfg
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	m.embd = l.matrix("token_embd.weight", c.Vocab, c.Dim)
	m.outNorm = l.vector("output_norm.weight", c.Dim)
	if c.TiedEmbeddings {
		m.output = m.embd
	} else {
		m.output = l.matrix("output.weight", c.Vocab, c.Dim)
	}
	if c.Layers > len(f.Tensors)/9 {
		// Every layer has at least nine tensors; refuse before allocating.
		return nil, fmt.Errorf("model: %s.block_count is %d but the file holds only %d tensors", c.Arch, c.Layers, len(f.Tensors))
	}
	m.layers = make([]layer, c.Layers)
	for i := range m.layers {
		ly := &m.layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		ly.attnNorm = l.vector(p+"attn_norm.weight", c.Dim)
		ly.wq = l.matrix(p+"attn_q.weight", qDim, c.Dim)
		ly.wk = l.matrix(p+"attn_k.weight", kvDim, c.Dim)
		ly.wv = l.matrix(p+"attn_v.weight", kvDim, c.Dim)
		ly.wo = l.matrix(p+"attn_output.weight", c.Dim, qDim)
		if c.QKVBias {
			ly.bq = l.vector(p+"attn_q.bias", qDim)
			ly.bk = l.vector(p+"attn_k.bias", kvDim)
			ly.bv = l.vector(p+"attn_v.bias", kvDim)
		}
		if c.QKNorm {
			ly.qNorm = l.vector(p+"attn_q_norm.weight", c.HeadDim)
			ly.kNorm = l.vector(p+"attn_k_norm.weight", c.HeadDim)
		}
		ly.ffnNorm = l.vector(p+"ffn_norm.weight", c.Dim)
		ly.wGate = l.matrix(p+"ffn_gate.weight", c.FF, c.Dim)
		ly.wUp = l.matrix(p+"ffn_up.weight", c.FF, c.Dim)
		ly.wDown = l.matrix(p+"ffn_down.weight", c.Dim, c.FF)
	}
	var factors []float32
	if _, ok := f.Tensor("rope_freqs.weight"); ok {
		factors = l.vector("rope_freqs.weight", c.HeadDim/2)
		for _, v := range factors {
			if !(v > 0) {
				l.fail(fmt.Errorf("model: tensor rope_freqs.weight holds a factor that is not positive"))
				break
			}
		}
	}
	if l.err != nil {
		return nil, l.err
	}
	m.freq = make([]float64, c.HeadDim/2)
	kernels.RoPEFrequencies(m.freq, c.HeadDim, c.RopeBase, c.RopeScale, factors)
	return m, nil
}

// Close releases the file mapping if Load opened it. The Model must not be
// used afterwards.
func (m *Model) Close() error {
	if m.file == nil {
		return nil
	}
	f := m.file
	m.file = nil
	return f.Close()
}

// loader reads tensors, keeping the first error.
type loader struct {
	f   *gguf.File
	err error
}

func (l *loader) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

func formatOf(t gguf.TensorType) (kernels.Format, bool) {
	switch t {
	case gguf.TypeF32:
		return kernels.F32, true
	case gguf.TypeF16:
		return kernels.F16, true
	case gguf.TypeBF16:
		return kernels.BF16, true
	case gguf.TypeQ8_0:
		return kernels.Q8_0, true
	case gguf.TypeQ4_0:
		return kernels.Q4_0, true
	}
	return 0, false
}

func (l *loader) tensor(name string, dims ...int) *gguf.TensorInfo {
	if l.err != nil {
		return nil
	}
	t, ok := l.f.Tensor(name)
	if !ok {
		l.fail(fmt.Errorf("model: tensor %s is missing", name))
		return nil
	}
	match := len(t.Dims) == len(dims)
	for i := 0; match && i < len(dims); i++ {
		match = t.Dims[i] == uint64(dims[i])
	}
	if !match {
		l.fail(fmt.Errorf("model: tensor %s has dims %v, want %v", name, t.Dims, dims))
		return nil
	}
	return t
}

// matrix loads a [rows][cols] weight (GGUF dims [cols, rows]) without
// copying it.
func (l *loader) matrix(name string, rows, cols int) kernels.Matrix {
	t := l.tensor(name, cols, rows)
	if t == nil {
		return kernels.Matrix{}
	}
	f, ok := formatOf(t.Type)
	if !ok {
		l.fail(fmt.Errorf("%w tensor type %v of %s (supported: F32, F16, BF16, Q8_0, Q4_0)", ErrUnsupported, t.Type, name))
		return kernels.Matrix{}
	}
	m, err := kernels.NewMatrix(f, rows, cols, t.Data)
	if err != nil {
		l.fail(fmt.Errorf("model: tensor %s: %w", name, err))
	}
	return m
}

// vector copies a one-dimensional weight out as float32.
func (l *loader) vector(name string, n int) []float32 {
	t := l.tensor(name, n)
	if t == nil {
		return nil
	}
	f, ok := formatOf(t.Type)
	if !ok || f.BlockSize() != 1 {
		l.fail(fmt.Errorf("%w tensor type %v of %s (want F32, F16 or BF16)", ErrUnsupported, t.Type, name))
		return nil
	}
	if rb, _ := f.RowBytes(n); len(t.Data) != rb {
		l.fail(fmt.Errorf("model: tensor %s has %d bytes, want %d", name, len(t.Data), rb))
		return nil
	}
	v := make([]float32, n)
	kernels.DecodeRow(f, t.Data, v)
	return v
}
