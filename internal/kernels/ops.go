package kernels

import "math"

// SumSquares returns Σ x[i]² in the package's fixed lane order.
func SumSquares(x []float32) float32 {
	return DotF32(x, x)
}

// RMSNorm writes x[i] * w[i] / sqrt(mean(x²) + eps) to out (which may be
// x). The scale is computed in float64 and rounded once.
func RMSNorm(out, x, w []float32, eps float64) {
	n := len(x)
	out, w = out[:n], w[:n]
	ss := float64(SumSquares(x))
	scale := float32(1 / math.Sqrt(ss/float64(n)+eps))
	for i := range x {
		out[i] = float32(x[i]*scale) * w[i]
	}
}

// RoPEFrequencies fills dst (headDim/2 long) with the angular frequency of
// each rotated pair: base^(-2i/headDim) / scale / factors[i]. scale is the
// linear rope scaling factor (1 for none); factors are the optional
// per-frequency divisors of Llama 3.1 (rope_freqs.weight), nil for none.
func RoPEFrequencies(dst []float64, headDim int, base, scale float64, factors []float32) {
	if scale == 0 {
		scale = 1
	}
	for i := range dst {
		f := math.Pow(base, -float64(2*i)/float64(headDim)) / scale
		if factors != nil {
			f /= float64(factors[i])
		}
		dst[i] = f
	}
}

// RoPEAngles fills cos and sin (headDim/2 long) for one position.
func RoPEAngles(cos, sin []float32, pos int, freq []float64) {
	cos, sin = cos[:len(freq)], sin[:len(freq)]
	for i, f := range freq {
		s, c := math.Sincos(float64(pos) * f)
		cos[i], sin[i] = float32(c), float32(s)
	}
}

// RoPE rotates one head vector x (2*len(cos) long) in place. The normal
// (llama) form rotates adjacent pairs (2i, 2i+1); the NeoX form (qwen2,
// qwen3) rotates (i, i+len(x)/2). Pair i turns by the angle of cos[i],
// sin[i].
func RoPE(x, cos, sin []float32, neox bool) {
	half := len(cos)
	x, sin = x[:2*half], sin[:half]
	if neox {
		lo, hi := x[:half], x[half:]
		for i := range half {
			a, b := lo[i], hi[i]
			lo[i] = float32(a*cos[i]) - float32(b*sin[i])
			hi[i] = float32(a*sin[i]) + float32(b*cos[i])
		}
		return
	}
	for i := range half {
		a, b := x[2*i], x[2*i+1]
		x[2*i] = float32(a*cos[i]) - float32(b*sin[i])
		x[2*i+1] = float32(a*sin[i]) + float32(b*cos[i])
	}
}

// Softmax replaces x with exp(x - max) / Σ exp(x - max). The sum is taken in
// float64, in index order.
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	var sum float64
	for i, v := range x {
		e := math.Exp(float64(v - m))
		x[i] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// SiLUMul writes silu(g[i]) * u[i] to out (which may alias g or u), where
// silu(v) = v / (1 + e^-v): the SwiGLU feed-forward activation.
func SiLUMul(out, g, u []float32) {
	n := len(out)
	g, u = g[:n], u[:n]
	for i := range out {
		v := float64(g[i])
		out[i] = float32(v/(1+math.Exp(-v))) * u[i]
	}
}

// Add adds src to dst element-wise.
func Add(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

// AXPY adds a*x to y element-wise (the weighted sum of attention values).
func AXPY(a float32, x, y []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += float32(a * x[i])
	}
}
