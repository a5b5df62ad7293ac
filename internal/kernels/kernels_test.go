package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

var ggufType = map[Format]gguf.TensorType{
	F32: gguf.TypeF32, F16: gguf.TypeF16, BF16: gguf.TypeBF16, Q8_0: gguf.TypeQ8_0, Q4_0: gguf.TypeQ4_0,
}

var allFormats = []Format{F32, F16, BF16, Q8_0, Q4_0}

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// quantRow encodes src in format f with the gguf reference quantizer and
// returns the bytes and the values as gguf.Dequantize reads them back.
func quantRow(t testing.TB, f Format, src []float32) ([]byte, []float32) {
	t.Helper()
	b, err := gguf.Quantize(ggufType[f], src)
	if err != nil {
		t.Fatalf("Quantize %v: %v", f, err)
	}
	back := make([]float32, len(src))
	if err := gguf.Dequantize(ggufType[f], b, back); err != nil {
		t.Fatalf("Dequantize %v: %v", f, err)
	}
	return b, back
}

func TestHalfToFloatAllValues(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		got := HalfToFloat(uint16(h))
		want := gguf.F16ToF32(uint16(h))
		if math.Float32bits(got) != math.Float32bits(want) && !(math.IsNaN(float64(got)) && math.IsNaN(float64(want))) {
			t.Fatalf("HalfToFloat(%#04x) = %v, gguf says %v", h, got, want)
		}
		// Independent float64 formula for finite values.
		e, m := (h>>10)&31, float64(h&0x3ff)
		var ref float64
		switch {
		case e == 31:
			continue
		case e == 0:
			ref = m * math.Pow(2, -24)
		default:
			ref = (1 + m/1024) * math.Pow(2, float64(e)-15)
		}
		if h&0x8000 != 0 {
			ref = -ref
		}
		if float64(got) != ref {
			t.Fatalf("HalfToFloat(%#04x) = %v, want %v", h, got, ref)
		}
	}
}

func TestBrainToFloat(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		h := uint16(rng.Uint32())
		got, want := BrainToFloat(h), gguf.BF16ToF32(h)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("BrainToFloat(%#04x) = %v, want %v", h, got, want)
		}
	}
}

// TestDotAgainstFloat64 compares every format's dot product with a float64
// dot of the gguf-dequantized row. The tolerance is relative to Σ|x·w|: the
// float32 accumulation error is bounded by about n·2⁻²⁴ of that sum.
func TestDotAgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, f := range allFormats {
		for _, n := range []int{32, 64, 96, 1024, 4096} {
			t.Run(fmt.Sprintf("%v/%d", f, n), func(t *testing.T) {
				x := randVec(rng, n, 1)
				w, wd := quantRow(t, f, randVec(rng, n, 0.05))
				var ref, mag float64
				for i := range x {
					ref += float64(x[i]) * float64(wd[i])
					mag += math.Abs(float64(x[i]) * float64(wd[i]))
				}
				got := Dot(f, x, w)
				if d := math.Abs(float64(got) - ref); d > mag*float64(n)*0x1p-24+1e-30 {
					t.Errorf("Dot = %v, float64 reference %v (diff %g, bound %g)", got, ref, d, mag*float64(n)*0x1p-24)
				}
				dec := make([]float32, n)
				DecodeRow(f, w, dec)
				for i := range dec {
					if dec[i] != wd[i] {
						t.Fatalf("DecodeRow[%d] = %v, gguf.Dequantize %v", i, dec[i], wd[i])
					}
				}
			})
		}
	}
}

func TestDotF32OddLengths(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 0; n < 20; n++ {
		x, w := randVec(rng, n, 1), randVec(rng, n, 1)
		var ref float64
		for i := range x {
			ref += float64(x[i]) * float64(w[i])
		}
		b, _ := quantRow(t, F32, w)
		got, gotB := DotF32(x, w), DotF32Bytes(x, b)
		if math.Float32bits(got) != math.Float32bits(gotB) {
			t.Fatalf("n=%d: DotF32 %v != DotF32Bytes %v", n, got, gotB)
		}
		if math.Abs(float64(got)-ref) > 1e-5*(1+math.Abs(ref)) {
			t.Fatalf("n=%d: DotF32 = %v, want %v", n, got, ref)
		}
	}
}

// TestMatMulBatchInvariant checks the product feature: each output element
// is bit-identical whether its activation row is alone, in a batch of many
// rows, and whatever the number of threads.
func TestMatMulBatchInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const rows, cols, T = 83, 128, 9
	x := randVec(rng, T*cols, 1)
	for _, f := range allFormats {
		w, wd := quantRow(t, f, randVec(rng, rows*cols, 0.05))
		m, err := NewMatrix(f, rows, cols, w)
		if err != nil {
			t.Fatal(err)
		}
		var want []float32
		for _, threads := range []int{1, 2, 3, 8} {
			p := NewPool(threads)
			batched := make([]float32, T*rows)
			p.MatMul(batched, x, T, &m)
			single := make([]float32, rows)
			for r := 0; r < T; r++ {
				p.MatMul(single, x[r*cols:(r+1)*cols], 1, &m)
				for o := range single {
					if math.Float32bits(single[o]) != math.Float32bits(batched[r*rows+o]) {
						t.Fatalf("%v threads=%d row %d out %d: alone %v, batched %v", f, threads, r, o, single[o], batched[r*rows+o])
					}
				}
			}
			p.Close()
			if want == nil {
				want = batched
				// And the values are right: compare with float64.
				for r := 0; r < T; r++ {
					for o := 0; o < rows; o++ {
						var ref float64
						for i := 0; i < cols; i++ {
							ref += float64(x[r*cols+i]) * float64(wd[o*cols+i])
						}
						if math.Abs(float64(want[r*rows+o])-ref) > 1e-4 {
							t.Fatalf("%v: out[%d][%d] = %v, want %v", f, r, o, want[r*rows+o], ref)
						}
					}
				}
				continue
			}
			for i := range want {
				if math.Float32bits(want[i]) != math.Float32bits(batched[i]) {
					t.Fatalf("%v: threads=%d differs from threads=1 at %d", f, threads, i)
				}
			}
		}
	}
}

func TestNewMatrixChecksSize(t *testing.T) {
	tests := []struct {
		f          Format
		rows, cols int
		bytes      int
		ok         bool
	}{
		{F32, 2, 3, 24, true},
		{F32, 2, 3, 23, false},
		{Q8_0, 2, 64, 136, true},
		{Q8_0, 2, 48, 102, false}, // 48 is not a whole number of blocks
		{Q4_0, 1, 32, 18, true},
		{Format(99), 1, 1, 1, false},
		{F16, 0, 4, 0, false},
	}
	for _, tt := range tests {
		_, err := NewMatrix(tt.f, tt.rows, tt.cols, make([]byte, tt.bytes))
		if (err == nil) != tt.ok {
			t.Errorf("NewMatrix(%v, %d, %d, %d bytes): err = %v, want ok=%v", tt.f, tt.rows, tt.cols, tt.bytes, err, tt.ok)
		}
	}
}

func TestRMSNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	x, w := randVec(rng, 64, 2), randVec(rng, 64, 1)
	out := make([]float32, 64)
	RMSNorm(out, x, w, 1e-6)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	scale := 1 / math.Sqrt(ss/64+1e-6)
	for i := range x {
		want := float64(x[i]) * scale * float64(w[i])
		if math.Abs(float64(out[i])-want) > 1e-5*(1+math.Abs(want)) {
			t.Fatalf("out[%d] = %v, want %v", i, out[i], want)
		}
	}
}

func TestRoPE(t *testing.T) {
	const hd = 16
	freq := make([]float64, hd/2)
	factors := []float32{1, 1, 2, 2, 4, 4, 8, 8}
	RoPEFrequencies(freq, hd, 10000, 2, factors)
	for i, f := range freq {
		want := math.Pow(10000, -float64(2*i)/hd) / 2 / float64(factors[i])
		if math.Abs(f-want) > 1e-15 {
			t.Fatalf("freq[%d] = %v, want %v", i, f, want)
		}
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for _, neox := range []bool{false, true} {
		x := randVec(rng, hd, 1)
		orig := append([]float32(nil), x...)
		cos, sin := make([]float32, hd/2), make([]float32, hd/2)
		const pos = 37
		RoPEAngles(cos, sin, pos, freq)
		RoPE(x, cos, sin, neox)
		for i := 0; i < hd/2; i++ {
			a, b := 2*i, 2*i+1
			if neox {
				a, b = i, i+hd/2
			}
			th := pos * freq[i]
			wa := float64(orig[a])*math.Cos(th) - float64(orig[b])*math.Sin(th)
			wb := float64(orig[a])*math.Sin(th) + float64(orig[b])*math.Cos(th)
			if math.Abs(float64(x[a])-wa) > 1e-5 || math.Abs(float64(x[b])-wb) > 1e-5 {
				t.Fatalf("neox=%v pair %d: got (%v,%v), want (%v,%v)", neox, i, x[a], x[b], wa, wb)
			}
		}
	}
}

func TestSoftmaxAndSiLU(t *testing.T) {
	x := []float32{1, 2, 3, -1000, 3}
	Softmax(x)
	e := []float64{math.Exp(-2), math.Exp(-1), 1, 0, 1}
	var s float64
	for _, v := range e {
		s += v
	}
	for i := range x {
		if math.Abs(float64(x[i])-e[i]/s) > 1e-7 {
			t.Fatalf("softmax[%d] = %v, want %v", i, x[i], e[i]/s)
		}
	}
	g, u := []float32{-2, 0, 0.5, 10}, []float32{3, 1, -2, 0.25}
	out := make([]float32, 4)
	SiLUMul(out, g, u)
	for i := range out {
		v := float64(g[i])
		want := v / (1 + math.Exp(-v)) * float64(u[i])
		if math.Abs(float64(out[i])-want) > 1e-6 {
			t.Fatalf("silu[%d] = %v, want %v", i, out[i], want)
		}
	}
}

// TestPoolCoversEveryIndexOnce checks the dynamic split: every index runs
// exactly once, on a valid worker, for sizes around the grain.
func TestPoolCoversEveryIndexOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 5} {
		p := NewPool(threads)
		for _, n := range []int{0, 1, 3, 16, 17, 1000} {
			for _, grain := range []int{0, 1, 4, 16} {
				c := &countTask{hits: make([]int, n), threads: threads}
				p.Run(n, grain, c)
				for i, h := range c.hits {
					if h != 1 {
						t.Fatalf("threads=%d n=%d grain=%d: index %d ran %d times", threads, n, grain, i, h)
					}
				}
				if c.bad {
					t.Fatalf("worker index out of range")
				}
			}
		}
		p.Close()
	}
}

type countTask struct {
	hits    []int // disjoint ranges: no lock needed
	threads int
	bad     bool
}

func (c *countTask) Run(lo, hi, worker int) {
	if worker < 0 || worker >= c.threads {
		c.bad = true
	}
	for i := lo; i < hi; i++ {
		c.hits[i]++
	}
}

func TestMatMulAllocatesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	w, _ := quantRow(t, Q8_0, randVec(rng, 64*256, 0.05))
	m, _ := NewMatrix(Q8_0, 64, 256, w)
	x := randVec(rng, 4*256, 1)
	out := make([]float32, 4*64)
	p := NewPool(2)
	defer p.Close()
	if a := testing.AllocsPerRun(50, func() { p.MatMul(out, x, 4, &m) }); a != 0 {
		t.Fatalf("MatMul allocates %v times per call", a)
	}
}
