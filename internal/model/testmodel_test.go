package model

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

// spec describes a tiny model written at test time. It is this package's own
// builder, independent of internal/modelbuild, so that tests can reach
// corners (rope scaling, frequency factors, broken tensors) a builder need
// not offer.
type spec struct {
	arch                            string
	layers, dim, heads, kvHeads, hd int
	ff, vocab, ctx                  int
	typ                             gguf.TensorType
	tied                            bool
	ropeBase, ropeScale             float64 // 0: default, 1: none
	ropeFreqs                       bool    // write rope_freqs.weight
	eps                             float64
	seed                            uint64
	mutate                          func(name string, typ *gguf.TensorType, dims *[]uint64) // breaks tensors for error tests
	skipKeys                        map[string]bool                                         // metadata keys and tensors left out
	extraKeys                       map[string]any                                          // metadata added or replaced
}

func (s spec) String() string {
	return fmt.Sprintf("%s/%v/tied=%v", s.arch, s.typ, s.tied)
}

func tinySpec(arch string, typ gguf.TensorType, tied bool) spec {
	s := spec{arch: arch, layers: 2, dim: 64, heads: 4, kvHeads: 2, hd: 16, ff: 96, vocab: 96, ctx: 160, typ: typ, tied: tied, seed: 1, eps: 1e-6}
	switch arch {
	case "llama":
		s.ropeBase, s.ropeScale, s.ropeFreqs = 500000, 2, true
	case "qwen2":
		s.ropeBase, s.kvHeads = 1000000, 1
	case "qwen3":
		s.hd = 32 // heads*hd = 128 != dim: qwen3 allows it
		s.ropeBase = 1000000
	}
	return s
}

// build writes the model's GGUF bytes. Weights are pseudo-random, scaled by
// 1/sqrt(fan-in) so activations stay O(1) and logits are far from flat.
func (s spec) build(t testing.TB) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(s.seed, 0x6b7666656e6365))
	w := gguf.NewWriter()
	p := s.arch + "."
	w.Set("general.architecture", s.arch)
	w.Set("general.name", "test-"+s.arch)
	set := func(k string, v any) {
		if !s.skipKeys[k] {
			w.Set(k, v)
		}
	}
	set(p+"context_length", uint32(s.ctx))
	set(p+"embedding_length", uint32(s.dim))
	set(p+"block_count", uint32(s.layers))
	set(p+"feed_forward_length", uint32(s.ff))
	set(p+"attention.head_count", uint32(s.heads))
	set(p+"attention.head_count_kv", uint32(s.kvHeads))
	set(p+"attention.key_length", uint32(s.hd))
	set(p+"attention.value_length", uint32(s.hd))
	set(p+"attention.layer_norm_rms_epsilon", float32(s.eps))
	if s.ropeBase != 0 {
		set(p+"rope.freq_base", float32(s.ropeBase))
	}
	if s.ropeScale != 0 && s.ropeScale != 1 {
		set(p+"rope.scaling.type", "linear")
		set(p+"rope.scaling.factor", float32(s.ropeScale))
	}
	for k, v := range s.extraKeys {
		w.Set(k, v)
	}
	add := func(name string, typ gguf.TensorType, dims []uint64, scale, mean float64) {
		if s.skipKeys[name] {
			return
		}
		if s.mutate != nil {
			s.mutate(name, &typ, &dims)
		}
		n := 1
		for _, d := range dims {
			n *= int(d)
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + rng.NormFloat64()*scale)
		}
		data, err := gguf.Quantize(typ, v)
		if err != nil {
			// A type the reference quantizer does not write (error
			// tests): zero bytes of the right size.
			rb, err2 := typ.RowBytes(n)
			if err2 != nil {
				t.Fatalf("quantize %s: %v", name, err)
			}
			data = make([]byte, rb)
		}
		if err := w.AddTensor(name, typ, dims, data); err != nil {
			t.Fatalf("add %s: %v", name, err)
		}
	}
	u := func(n ...int) []uint64 {
		d := make([]uint64, len(n))
		for i, x := range n {
			d[i] = uint64(x)
		}
		return d
	}
	q, kv := s.heads*s.hd, s.kvHeads*s.hd
	add("token_embd.weight", s.typ, u(s.dim, s.vocab), 1, 0)
	add("output_norm.weight", gguf.TypeF32, u(s.dim), 0.1, 1)
	if !s.tied {
		add("output.weight", s.typ, u(s.dim, s.vocab), 1/math.Sqrt(float64(s.dim)), 0)
	}
	if s.ropeFreqs {
		f := make([]float32, s.hd/2)
		for i := range f {
			f[i] = 1 + float32(i%4)
		}
		data, _ := gguf.Quantize(gguf.TypeF32, f)
		if err := w.AddTensor("rope_freqs.weight", gguf.TypeF32, u(s.hd/2), data); err != nil {
			t.Fatal(err)
		}
	}
	for l := range s.layers {
		b := fmt.Sprintf("blk.%d.", l)
		add(b+"attn_norm.weight", gguf.TypeF32, u(s.dim), 0.1, 1)
		add(b+"attn_q.weight", s.typ, u(s.dim, q), 1/math.Sqrt(float64(s.dim)), 0)
		add(b+"attn_k.weight", s.typ, u(s.dim, kv), 1/math.Sqrt(float64(s.dim)), 0)
		add(b+"attn_v.weight", s.typ, u(s.dim, kv), 1/math.Sqrt(float64(s.dim)), 0)
		if s.arch == "qwen2" {
			add(b+"attn_q.bias", gguf.TypeF32, u(q), 0.2, 0)
			add(b+"attn_k.bias", gguf.TypeF32, u(kv), 0.2, 0)
			add(b+"attn_v.bias", gguf.TypeF32, u(kv), 0.2, 0)
		}
		if s.arch == "qwen3" {
			add(b+"attn_q_norm.weight", gguf.TypeF32, u(s.hd), 0.1, 1)
			add(b+"attn_k_norm.weight", gguf.TypeF32, u(s.hd), 0.1, 1)
		}
		add(b+"attn_output.weight", s.typ, u(q, s.dim), 1/math.Sqrt(float64(q)), 0)
		add(b+"ffn_norm.weight", gguf.TypeF32, u(s.dim), 0.1, 1)
		add(b+"ffn_gate.weight", s.typ, u(s.dim, s.ff), 1/math.Sqrt(float64(s.dim)), 0)
		add(b+"ffn_up.weight", s.typ, u(s.dim, s.ff), 1/math.Sqrt(float64(s.dim)), 0)
		add(b+"ffn_down.weight", s.typ, u(s.ff, s.dim), 1/math.Sqrt(float64(s.ff)), 0)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// load builds and parses the model.
func (s spec) load(t testing.TB) (*Model, *gguf.File) {
	t.Helper()
	f, err := gguf.Parse(s.build(t))
	if err != nil {
		t.Fatal(err)
	}
	m, err := FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return m, f
}

// tinyTokenizer is tokenizer.Tiny padded with unused tokens to vocab
// entries, so that the output matrix is not a multiple of anything handy.
func tinyTokenizer(vocab int) tokenizer.Config {
	c := tokenizer.Tiny()
	for len(c.Tokens) < vocab {
		c.Tokens = append(c.Tokens, fmt.Sprintf("[PAD%d]", len(c.Tokens)))
		c.Types = append(c.Types, tokenizer.TypeUnused)
	}
	return c
}

// tinyOptions is a modelbuild model of the same tiny shape as tinySpec.
func tinyOptions(arch string, typ gguf.TensorType, tied bool) modelbuild.Options {
	s := tinySpec(arch, typ, tied)
	return modelbuild.Options{
		Arch: arch, Layers: s.layers, Dim: s.dim, Heads: s.heads, KVHeads: s.kvHeads, HeadDim: s.hd, FF: s.ff,
		Ctx: s.ctx, Type: typ, Seed: 7, Tied: tied, Tokenizer: tinyTokenizer(320),
	}
}

// specOf describes a modelbuild model for the reference forward, from the
// builder's documented defaults.
func specOf(o modelbuild.Options) spec {
	s := spec{arch: o.Arch, layers: o.Layers, dim: o.Dim, heads: o.Heads, kvHeads: o.KVHeads, hd: o.HeadDim,
		ff: o.FF, vocab: len(o.Tokenizer.Tokens), ctx: o.Ctx, typ: o.Type, tied: o.Tied,
		ropeBase: o.RopeBase, ropeScale: o.RopeScale, eps: o.RMSEps}
	if s.ropeBase == 0 {
		s.ropeBase = map[string]float64{"llama": 500000}[o.Arch]
		if s.ropeBase == 0 {
			s.ropeBase = 1e6
		}
	}
	if s.eps == 0 {
		s.eps = map[string]float64{"llama": 1e-5}[o.Arch]
		if s.eps == 0 {
			s.eps = 1e-6
		}
	}
	return s
}

// loadBuilt writes o with modelbuild into a temp dir and loads it with Load
// (the mmap path); it also opens the file for the reference.
func loadBuilt(t testing.TB, o modelbuild.Options) (*Model, *gguf.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := modelbuild.Write(o, path); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); f.Close() })
	return m, f
}
