package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

// refForward is the deliberately simple reference: float64 throughout, no
// pages, no batching, the whole sequence recomputed from its tokens. It
// shares nothing with the fast path but the file: shapes come from the
// spec, weights from gguf.Dequantize, the formulas are written out here
// from the architectures' definitions. It returns logits for every
// position.
func refForward(t testing.TB, s spec, f *gguf.File, tokens []int32) [][]float64 {
	t.Helper()
	get := func(name string) []float64 {
		ti, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("reference: no tensor %s", name)
		}
		n := 1
		for _, d := range ti.Dims {
			n *= int(d)
		}
		v32 := make([]float32, n)
		if err := gguf.Dequantize(ti.Type, ti.Data, v32); err != nil {
			t.Fatalf("reference: dequantize %s: %v", name, err)
		}
		v := make([]float64, n)
		for i, x := range v32 {
			v[i] = float64(x)
		}
		return v
	}
	// matvec: W stored [out][in] (GGUF dims [in, out]).
	matvec := func(w []float64, x []float64, out int) []float64 {
		in := len(x)
		y := make([]float64, out)
		for o := range y {
			var acc float64
			for i := range in {
				acc += w[o*in+i] * x[i]
			}
			y[o] = acc
		}
		return y
	}
	eps := float64(float32(s.eps)) // the file holds it as float32
	rmsnorm := func(x, w []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		r := 1 / math.Sqrt(ss/float64(len(x))+eps)
		y := make([]float64, len(x))
		for i := range x {
			y[i] = x[i] * r * w[i]
		}
		return y
	}
	base, scale := s.ropeBase, s.ropeScale
	if base == 0 {
		base = 10000
	}
	if scale == 0 {
		scale = 1
	}
	base = float64(float32(base))
	var factors []float64
	if s.ropeFreqs {
		factors = get("rope_freqs.weight")
	}
	rope := func(x []float64, pos int) {
		hd := len(x)
		for i := 0; i < hd/2; i++ {
			theta := float64(pos) * math.Pow(base, -2*float64(i)/float64(hd)) / scale
			if factors != nil {
				theta /= factors[i]
			}
			a, b := 2*i, 2*i+1 // llama: adjacent pairs
			if s.arch != "llama" {
				a, b = i, i+hd/2 // NeoX: halves
			}
			xa, xb := x[a], x[b]
			x[a] = xa*math.Cos(theta) - xb*math.Sin(theta)
			x[b] = xa*math.Sin(theta) + xb*math.Cos(theta)
		}
	}

	n := len(tokens)
	embd := get("token_embd.weight")
	xs := make([][]float64, n)
	for p, tok := range tokens {
		xs[p] = append([]float64(nil), embd[int(tok)*s.dim:(int(tok)+1)*s.dim]...)
	}
	for l := range s.layers {
		b := fmt.Sprintf("blk.%d.", l)
		wq, wk, wv, wo := get(b+"attn_q.weight"), get(b+"attn_k.weight"), get(b+"attn_v.weight"), get(b+"attn_output.weight")
		attnNorm, ffnNorm := get(b+"attn_norm.weight"), get(b+"ffn_norm.weight")
		wg, wu, wd := get(b+"ffn_gate.weight"), get(b+"ffn_up.weight"), get(b+"ffn_down.weight")
		var bq, bk, bv, qNorm, kNorm []float64
		if s.arch == "qwen2" {
			bq, bk, bv = get(b+"attn_q.bias"), get(b+"attn_k.bias"), get(b+"attn_v.bias")
		}
		if s.arch == "qwen3" {
			qNorm, kNorm = get(b+"attn_q_norm.weight"), get(b+"attn_k_norm.weight")
		}
		qs, ks, vs := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for p := range n {
			h := rmsnorm(xs[p], attnNorm)
			q, k, v := matvec(wq, h, s.heads*s.hd), matvec(wk, h, s.kvHeads*s.hd), matvec(wv, h, s.kvHeads*s.hd)
			if s.arch == "qwen2" {
				for i := range q {
					q[i] += bq[i]
				}
				for i := range k {
					k[i] += bk[i]
					v[i] += bv[i]
				}
			}
			for hh := range s.heads {
				qh := q[hh*s.hd : (hh+1)*s.hd]
				if s.arch == "qwen3" {
					copy(qh, rmsnorm(qh, qNorm))
				}
				rope(qh, p)
			}
			for hh := range s.kvHeads {
				kh := k[hh*s.hd : (hh+1)*s.hd]
				if s.arch == "qwen3" {
					copy(kh, rmsnorm(kh, kNorm))
				}
				rope(kh, p)
			}
			qs[p], ks[p], vs[p] = q, k, v
		}
		for p := range n {
			out := make([]float64, s.heads*s.hd)
			for hh := range s.heads {
				kvh := hh / (s.heads / s.kvHeads)
				q := qs[p][hh*s.hd : (hh+1)*s.hd]
				sc := make([]float64, p+1)
				mx := math.Inf(-1)
				for j := 0; j <= p; j++ {
					var d float64
					for i := range s.hd {
						d += q[i] * ks[j][kvh*s.hd+i]
					}
					sc[j] = d / math.Sqrt(float64(s.hd))
					mx = math.Max(mx, sc[j])
				}
				var sum float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for j := range sc {
					for i := range s.hd {
						out[hh*s.hd+i] += sc[j] / sum * vs[j][kvh*s.hd+i]
					}
				}
			}
			o := matvec(wo, out, s.dim)
			for i := range o {
				xs[p][i] += o[i]
			}
			h := rmsnorm(xs[p], ffnNorm)
			g, u := matvec(wg, h, s.ff), matvec(wu, h, s.ff)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := matvec(wd, g, s.dim)
			for i := range d {
				xs[p][i] += d[i]
			}
		}
	}
	outName := "output.weight"
	if s.tied {
		outName = "token_embd.weight"
	}
	wout, onorm := get(outName), get("output_norm.weight")
	logits := make([][]float64, n)
	for p := range n {
		logits[p] = matvec(wout, rmsnorm(xs[p], onorm), s.vocab)
	}
	return logits
}
