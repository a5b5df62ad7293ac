package modelbuild

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

// Options describe a model to build.
type Options struct {
	Arch                        string // "llama", "qwen2" or "qwen3"
	Layers, Dim, Heads, KVHeads int
	HeadDim                     int // 0 means Dim/Heads
	FF                          int // feed-forward (intermediate) size
	Ctx                         int // context length; 0 means 4096
	// Type is the weight type of the matrices, the embedding included:
	// F32, F16, BF16, Q8_0 or Q4_0. Norm weights and biases stay F32.
	Type gguf.TensorType
	Seed uint64
	// RopeBase and RMSEps of 0 take the family default (llama: 500000 and
	// 1e-5, as Llama 3; qwen2 and qwen3: 1e6 and 1e-6).
	RopeBase, RMSEps float64
	// RopeScale is the linear rope scaling factor; 0 means 1 (none).
	RopeScale float64
	// Tied omits output.weight: the output projection reuses token_embd.
	Tied      bool
	Tokenizer tokenizer.Config
	Name      string // general.name; empty means "kvfence-<arch>-random"
}

// Architectures lists the supported values of Options.Arch.
var Architectures = []string{"llama", "qwen2", "qwen3"}

// logitStd is the standard deviation of the logits for a final hidden
// state of unit RMS: large enough that sampling is far from uniform even
// over a 150k vocabulary.
const logitStd = 5.0

// Preset returns the options of a named model shape. "qwen3-0.6b" is
// Qwen3-0.6B: 28 layers, dim 1024, 16 heads, 8 KV heads, head dim 128, ff
// 3072, context 40960, rope base 1e6, eps 1e-6, tied embeddings, and the
// real Qwen3 vocabulary (tokenizer.BundledQwen3), padded with unused
// "[PADn]" tokens to the model's 151936 embedding rows as llama.cpp's
// converter does. The weight type is Q8_0; callers may change it.
func Preset(name string) (Options, error) {
	switch name {
	case "qwen3-0.6b":
		tok, err := bundledQwen3()
		if err != nil {
			return Options{}, err
		}
		tok = padVocab(tok, 151936)
		return Options{
			Arch: "qwen3", Layers: 28, Dim: 1024, Heads: 16, KVHeads: 8, HeadDim: 128, FF: 3072, Ctx: 40960,
			Type: gguf.TypeQ8_0, RopeBase: 1e6, RMSEps: 1e-6, Tied: true,
			Tokenizer: tok, Name: "kvfence-qwen3-0.6b-random",
		}, nil
	}
	return Options{}, fmt.Errorf("modelbuild: unknown preset %q (known: qwen3-0.6b)", name)
}

// padVocab extends c to n tokens with unused "[PADi]" tokens, leaving c's
// slices untouched.
func padVocab(c tokenizer.Config, n int) tokenizer.Config {
	if len(c.Tokens) >= n {
		return c
	}
	have := len(c.Tokens)
	c.Tokens = append(append(make([]string, 0, n), c.Tokens...), make([]string, n-have)...)
	if c.Types != nil {
		c.Types = append(append(make([]int32, 0, n), c.Types...), make([]int32, n-have)...)
	}
	if c.Scores != nil {
		c.Scores = append(append(make([]float32, 0, n), c.Scores...), make([]float32, n-have)...)
	}
	for i := have; i < n; i++ {
		c.Tokens[i] = fmt.Sprintf("[PAD%d]", i)
		if c.Types != nil {
			c.Types[i] = tokenizer.TypeUnused
		}
	}
	return c
}

// resolved holds Options with defaults applied.
type resolved struct {
	Options
	vocab int
}

func resolve(o Options) (resolved, error) {
	r := resolved{Options: o, vocab: len(o.Tokenizer.Tokens)}
	switch o.Arch {
	case "llama":
		r.RopeBase = orDefault(o.RopeBase, 500000)
		r.RMSEps = orDefault(o.RMSEps, 1e-5)
	case "qwen2", "qwen3":
		r.RopeBase = orDefault(o.RopeBase, 1e6)
		r.RMSEps = orDefault(o.RMSEps, 1e-6)
	default:
		return r, fmt.Errorf("modelbuild: unknown architecture %q (supported: llama, qwen2, qwen3)", o.Arch)
	}
	r.RopeScale = orDefault(o.RopeScale, 1)
	if r.Ctx == 0 {
		r.Ctx = 4096
	}
	if r.Name == "" {
		r.Name = "kvfence-" + o.Arch + "-random"
	}
	if o.Heads > 0 && r.HeadDim == 0 {
		if o.Dim%o.Heads != 0 {
			return r, fmt.Errorf("modelbuild: dim %d is not a multiple of heads %d; give the head dim", o.Dim, o.Heads)
		}
		r.HeadDim = o.Dim / o.Heads
	}
	const maxSize = 1 << 20
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", r.Layers}, {"dim", r.Dim}, {"heads", r.Heads}, {"kv heads", r.KVHeads}, {"head dim", r.HeadDim}, {"ff", r.FF}, {"ctx", r.Ctx}} {
		if f.v <= 0 || f.v > maxSize {
			return r, fmt.Errorf("modelbuild: %s %d outside 1..%d", f.name, f.v, maxSize)
		}
	}
	switch {
	case r.Heads%r.KVHeads != 0:
		return r, fmt.Errorf("modelbuild: heads %d is not a multiple of kv heads %d", r.Heads, r.KVHeads)
	case r.HeadDim%2 != 0:
		return r, fmt.Errorf("modelbuild: head dim %d is odd; rope needs pairs", r.HeadDim)
	case r.RopeBase <= 0 || r.RMSEps <= 0 || r.RopeScale <= 0:
		return r, errors.New("modelbuild: rope base, rms eps and rope scale must be positive")
	case r.vocab == 0:
		return r, errors.New("modelbuild: the tokenizer has no tokens")
	case o.Tokenizer.Types != nil && len(o.Tokenizer.Types) != r.vocab:
		return r, fmt.Errorf("modelbuild: tokenizer has %d token types for %d tokens", len(o.Tokenizer.Types), r.vocab)
	}
	switch r.Type {
	case gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16, gguf.TypeQ8_0, gguf.TypeQ4_0:
	default:
		return r, fmt.Errorf("modelbuild: weight type %s not supported (supported: F32, F16, BF16, Q8_0, Q4_0)", r.Type)
	}
	// Rows of every matrix must be whole blocks.
	bs := r.Type.BlockSize()
	for _, f := range []struct {
		name string
		v    int
	}{{"dim", r.Dim}, {"heads*head dim", r.Heads * r.HeadDim}, {"ff", r.FF}} {
		if f.v%bs != 0 {
			return r, fmt.Errorf("modelbuild: %s %d is not a multiple of the %s block size %d", f.name, f.v, r.Type, bs)
		}
	}
	return r, nil
}

func orDefault(v, d float64) float64 {
	if v == 0 {
		return d
	}
	return v
}

// fileType returns llama.cpp's general.file_type for a weight type.
func fileType(t gguf.TensorType) uint32 {
	switch t {
	case gguf.TypeF16:
		return 1
	case gguf.TypeQ4_0:
		return 2
	case gguf.TypeQ8_0:
		return 7
	case gguf.TypeBF16:
		return 32
	}
	return 0 // all F32
}

// Build returns a Writer holding the model's metadata and tensors. Tensor
// bytes are generated while the Writer writes, one slab at a time, so even
// large models never sit in memory. Same Options, same bytes.
func Build(o Options) (*gguf.Writer, error) {
	r, err := resolve(o)
	if err != nil {
		return nil, err
	}
	w := gguf.NewWriter()
	a := r.Arch
	w.Set("general.architecture", a)
	w.Set("general.name", r.Name)
	w.Set("general.alignment", uint32(gguf.DefaultAlignment))
	w.Set("general.file_type", fileType(r.Type))
	if r.Type.BlockSize() > 1 {
		w.Set("general.quantization_version", uint32(2))
	}
	w.Set(a+".vocab_size", uint32(r.vocab))
	w.Set(a+".context_length", uint32(r.Ctx))
	w.Set(a+".embedding_length", uint32(r.Dim))
	w.Set(a+".block_count", uint32(r.Layers))
	w.Set(a+".feed_forward_length", uint32(r.FF))
	w.Set(a+".attention.head_count", uint32(r.Heads))
	w.Set(a+".attention.head_count_kv", uint32(r.KVHeads))
	w.Set(a+".attention.key_length", uint32(r.HeadDim))
	w.Set(a+".attention.value_length", uint32(r.HeadDim))
	w.Set(a+".rope.dimension_count", uint32(r.HeadDim))
	w.Set(a+".rope.freq_base", float32(r.RopeBase))
	w.Set(a+".attention.layer_norm_rms_epsilon", float32(r.RMSEps))
	w.Set(a+".rope.scaling.type", "linear")
	w.Set(a+".rope.scaling.factor", float32(r.RopeScale))
	for _, kv := range r.Tokenizer.GGUFKV() {
		w.Set(kv.Key, kv.Value)
	}

	qDim, kvDim := r.Heads*r.HeadDim, r.KVHeads*r.HeadDim
	inv := func(n int) float64 { return 1 / math.Sqrt(float64(n)) }
	b := builder{w: w, seed: r.Seed, typ: r.Type}
	embStd := 1.0
	if r.Tied {
		embStd = logitStd * inv(r.Dim) // token_embd is also the output projection
	}
	b.matrix("token_embd.weight", r.Dim, r.vocab, embStd)
	for i := range r.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		b.norm(p+"attn_norm.weight", r.Dim)
		b.matrix(p+"attn_q.weight", r.Dim, qDim, inv(r.Dim))
		b.matrix(p+"attn_k.weight", r.Dim, kvDim, inv(r.Dim))
		b.matrix(p+"attn_v.weight", r.Dim, kvDim, inv(r.Dim))
		if r.Arch == "qwen2" {
			b.f32(p+"attn_q.bias", qDim, 0, 0.3)
			b.f32(p+"attn_k.bias", kvDim, 0, 0.3)
			b.f32(p+"attn_v.bias", kvDim, 0, 0.3)
		}
		if r.Arch == "qwen3" {
			b.norm(p+"attn_q_norm.weight", r.HeadDim)
			b.norm(p+"attn_k_norm.weight", r.HeadDim)
		}
		b.matrix(p+"attn_output.weight", qDim, r.Dim, inv(qDim))
		b.norm(p+"ffn_norm.weight", r.Dim)
		b.matrix(p+"ffn_gate.weight", r.Dim, r.FF, inv(r.Dim))
		b.matrix(p+"ffn_up.weight", r.Dim, r.FF, inv(r.Dim))
		b.matrix(p+"ffn_down.weight", r.FF, r.Dim, inv(r.FF))
	}
	b.norm("output_norm.weight", r.Dim)
	if !r.Tied {
		b.matrix("output.weight", r.Dim, r.vocab, logitStd*inv(r.Dim))
	}
	if b.err != nil {
		return nil, b.err
	}
	return w, nil
}

// Write builds the model described by o into the file at path, atomically.
func Write(o Options, path string) error {
	w, err := Build(o)
	if err != nil {
		return err
	}
	return w.WriteFile(path)
}

// builder adds generated tensors to a Writer, keeping the first error.
type builder struct {
	w    *gguf.Writer
	seed uint64
	typ  gguf.TensorType
	err  error
}

// norm adds an F32 vector of norm weights near 1.
func (b *builder) norm(name string, n int) { b.f32(name, n, 1, 0.05) }

// f32 adds an F32 vector of n values mean + std*z.
func (b *builder) f32(name string, n int, mean, std float64) {
	b.add(name, gguf.TypeF32, n, 1, mean, std)
}

// matrix adds an [in, out] matrix (in contiguous) of values std*z in the
// builder's weight type.
func (b *builder) matrix(name string, in, out int, std float64) {
	b.add(name, b.typ, in, out, 0, std)
}

func (b *builder) add(name string, typ gguf.TensorType, in, out int, mean, std float64) {
	if b.err != nil {
		return
	}
	g := gen{seed: tensorSeed(b.seed, name), typ: typ, in: in, out: out, mean: mean, std: std}
	b.err = b.w.AddTensorFunc(name, typ, []uint64{uint64(in), uint64(out)}[:dimsLen(out)], g.write)
}

func dimsLen(out int) int {
	if out == 1 {
		return 1
	}
	return 2
}

// gen produces one tensor's bytes, row by row.
type gen struct {
	seed      uint64
	typ       gguf.TensorType
	in, out   int
	mean, std float64
}

// slabElems bounds the float32 scratch of one write step (4 MiB).
const slabElems = 1 << 20

func (g gen) write(out io.Writer) error {
	rows := max(1, slabElems/g.in)
	buf := make([]float32, rows*g.in)
	rng := splitmix{state: g.seed}
	for r := 0; r < g.out; r += rows {
		n := min(rows, g.out-r) * g.in
		for i := range buf[:n] {
			buf[i] = float32(g.mean + g.std*rng.normal())
		}
		data, err := gguf.Quantize(g.typ, buf[:n])
		if err != nil {
			return err
		}
		if _, err := out.Write(data); err != nil {
			return err
		}
	}
	return nil
}

// tensorSeed derives a tensor's stream from the model seed and the tensor
// name (FNV-1a, then mixed), so each tensor's values do not depend on which
// other tensors exist.
func tensorSeed(seed uint64, name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return mix(seed ^ mix(h))
}

// splitmix is Vigna's splitmix64 generator.
type splitmix struct{ state uint64 }

func (s *splitmix) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	return mix(s.state)
}

func mix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Irwin–Hall with four 16-bit uniforms: mean 4*(2^16-1)/2, variance
// 4*(2^32-1)/12.
const (
	ihMean = 4 * 65535.0 / 2
	ihStd  = 37837.22723720648 // sqrt(4 * (65536*65536 - 1) / 12)
)

// normal returns an approximately standard normal value in [-3.47, 3.47].
// The integer sum and the subtraction are exact and the one division is
// correctly rounded, so the value is the same on every platform, unlike
// Box–Muller whose math.Log and math.Sincos may differ in the last bit.
func (s *splitmix) normal() float64 {
	x := s.next()
	sum := x&0xffff + x>>16&0xffff + x>>32&0xffff + x>>48
	return (float64(sum) - ihMean) / ihStd
}
