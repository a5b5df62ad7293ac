package modelbuild

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

// miniForward is a plain float64 transformer forward over a whole sequence
// (no cache), just enough to check the claims the builder makes about its
// weights: activations stay finite and O(1) per layer, and logits are far
// from flat. The model package has its own, independent reference.
type miniForward struct {
	f *gguf.File
	o resolved
}

func (m miniForward) vec(name string) []float64 {
	ti, ok := m.f.Tensor(name)
	if !ok {
		return nil
	}
	v32 := make([]float32, ti.Elements())
	if err := gguf.Dequantize(ti.Type, ti.Data, v32); err != nil {
		panic(err)
	}
	v := make([]float64, len(v32))
	for i, x := range v32 {
		v[i] = float64(x)
	}
	return v
}

// matvec computes W x for a GGUF [in, out] matrix (rows of in values).
func matvec(w, x []float64) []float64 {
	in := len(x)
	y := make([]float64, len(w)/in)
	for o := range y {
		for i, xi := range x {
			y[o] += w[o*in+i] * xi
		}
	}
	return y
}

func rmsnorm(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	s := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i := range x {
		y[i] = x[i] * s * w[i]
	}
	return y
}

func rope(x []float64, pos int, base float64, neox bool) {
	hd := len(x)
	for i := 0; i < hd/2; i++ {
		theta := float64(pos) * math.Pow(base, -2*float64(i)/float64(hd))
		a, b := 2*i, 2*i+1
		if neox {
			a, b = i, i+hd/2
		}
		c, s := math.Cos(theta), math.Sin(theta)
		x[a], x[b] = x[a]*c-x[b]*s, x[a]*s+x[b]*c
	}
}

func rms(x []float64) float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	return math.Sqrt(ss / float64(len(x)))
}

// run returns the last position's logits and the residual RMS after each
// layer at that position.
func (m miniForward) run(tokens []int) (logits, residRMS []float64) {
	o := m.o
	emb := m.vec("token_embd.weight")
	hs := make([][]float64, len(tokens))
	for t, tok := range tokens {
		hs[t] = slices.Clone(emb[tok*o.Dim : (tok+1)*o.Dim])
	}
	hd, group := o.HeadDim, o.Heads/o.KVHeads
	for l := range o.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		wq, wk, wv, wo := m.vec(p+"attn_q.weight"), m.vec(p+"attn_k.weight"), m.vec(p+"attn_v.weight"), m.vec(p+"attn_output.weight")
		bq, bk, bv := m.vec(p+"attn_q.bias"), m.vec(p+"attn_k.bias"), m.vec(p+"attn_v.bias")
		qn, kn := m.vec(p+"attn_q_norm.weight"), m.vec(p+"attn_k_norm.weight")
		an, fn := m.vec(p+"attn_norm.weight"), m.vec(p+"ffn_norm.weight")
		wg, wu, wd := m.vec(p+"ffn_gate.weight"), m.vec(p+"ffn_up.weight"), m.vec(p+"ffn_down.weight")
		qs, ks, vs := make([][]float64, len(tokens)), make([][]float64, len(tokens)), make([][]float64, len(tokens))
		for t := range tokens {
			a := rmsnorm(hs[t], an, o.RMSEps)
			qs[t], ks[t], vs[t] = matvec(wq, a), matvec(wk, a), matvec(wv, a)
			for i := range bq {
				qs[t][i] += bq[i]
			}
			for i := range bk {
				ks[t][i] += bk[i]
				vs[t][i] += bv[i]
			}
			for h := range o.Heads {
				q := qs[t][h*hd : (h+1)*hd]
				if qn != nil {
					copy(q, rmsnorm(q, qn, o.RMSEps))
				}
				rope(q, t, o.RopeBase, o.Arch != "llama")
			}
			for h := range o.KVHeads {
				k := ks[t][h*hd : (h+1)*hd]
				if kn != nil {
					copy(k, rmsnorm(k, kn, o.RMSEps))
				}
				rope(k, t, o.RopeBase, o.Arch != "llama")
			}
		}
		for t := range tokens {
			att := make([]float64, o.Heads*hd)
			for h := range o.Heads {
				kvh := h / group
				q := qs[t][h*hd : (h+1)*hd]
				scores := make([]float64, t+1)
				for s := 0; s <= t; s++ {
					for i := range q {
						scores[s] += q[i] * ks[s][kvh*hd+i]
					}
					scores[s] /= math.Sqrt(float64(hd))
				}
				mx := slices.Max(scores)
				var sum float64
				for s := range scores {
					scores[s] = math.Exp(scores[s] - mx)
					sum += scores[s]
				}
				for s := range scores {
					for i := range hd {
						att[h*hd+i] += scores[s] / sum * vs[s][kvh*hd+i]
					}
				}
			}
			out := matvec(wo, att)
			for i := range out {
				hs[t][i] += out[i]
			}
			f := rmsnorm(hs[t], fn, o.RMSEps)
			g, u := matvec(wg, f), matvec(wu, f)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			down := matvec(wd, g)
			for i := range down {
				hs[t][i] += down[i]
			}
		}
		residRMS = append(residRMS, rms(hs[len(tokens)-1]))
	}
	final := rmsnorm(hs[len(tokens)-1], m.vec("output_norm.weight"), o.RMSEps)
	out := m.vec("output.weight")
	if out == nil {
		out = emb
	}
	return matvec(out, final), residRMS
}

// TestActivationsAndLogits runs a 6-layer model of every architecture and
// checks the residual stream stays O(1)·sqrt(depth) and the logits are
// peaked: the top logit stands several units above the runner-up crowd.
func TestActivationsAndLogits(t *testing.T) {
	for _, arch := range Architectures {
		t.Run(arch, func(t *testing.T) {
			o := tinyOptions(arch, gguf.TypeQ8_0)
			o.Layers = 6
			r, err := resolve(o)
			if err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Parse(build(t, o))
			if err != nil {
				t.Fatal(err)
			}
			logits, resid := miniForward{f: f, o: r}.run([]int{104, 101, 108, 108, 111, 32, 119, 111})
			for l, v := range resid {
				if math.IsNaN(v) || v > 3*math.Sqrt(float64(l+2)) {
					t.Errorf("residual RMS after layer %d is %.2f", l, v)
				}
			}
			sorted := slices.Sorted(slices.Values(logits))
			n := len(sorted)
			var ss float64
			for _, v := range logits {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatal("non-finite logit")
				}
				ss += v * v
			}
			std := math.Sqrt(ss / float64(n))
			if std < 3 || sorted[n-1]-sorted[n/2] < 8 {
				t.Errorf("logits too flat: std %.2f, top %.2f, median %.2f", std, sorted[n-1], sorted[n/2])
			}
			t.Logf("residual RMS by layer %.2f; logit std %.2f, top %.2f, 2nd %.2f, median %.2f",
				resid, std, sorted[n-1], sorted[n-2], sorted[n/2])
		})
	}
}
