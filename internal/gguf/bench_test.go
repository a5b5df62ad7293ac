package gguf

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkParse parses a file shaped like a real model's metadata: a
// 150k-token vocabulary with merges and token types, and 300 tensors.
func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	w := NewWriter()
	toks := make([]string, 150000)
	types := make([]int32, len(toks))
	for i := range toks {
		toks[i] = fmt.Sprintf("tok%d", i)
		types[i] = 1
	}
	w.Set("tokenizer.ggml.tokens", toks)
	w.Set("tokenizer.ggml.merges", toks)
	w.Set("tokenizer.ggml.token_type", types)
	for i := range 300 {
		must(b, w.AddTensor(fmt.Sprintf("blk.%d.w", i), TypeF32, []uint64{8}, make([]byte, 32)))
	}
	data := encode(b, w)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkQuantize(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	x := make([]float32, 1<<16)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, typ := range []TensorType{TypeF16, TypeBF16, TypeQ8_0, TypeQ4_0} {
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				if _, err := Quantize(typ, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDequantize(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	x := make([]float32, 1<<16)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, typ := range []TensorType{TypeF16, TypeBF16, TypeQ8_0, TypeQ4_0} {
		data, err := Quantize(typ, x)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				if err := Dequantize(typ, data, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
