package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func BenchmarkDot(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const n = 4096
	x := randVec(rng, n, 1)
	for _, f := range allFormats {
		w, _ := quantRow(b, f, randVec(rng, n, 0.05))
		b.Run(f.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(w)))
			var s float32
			for b.Loop() {
				s += Dot(f, x, w)
			}
			_ = s
		})
	}
}

func BenchmarkMatMul(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2))
	const rows, cols = 1024, 1024
	for _, f := range []Format{F16, Q8_0} {
		w, _ := quantRow(b, f, randVec(rng, rows*cols, 0.05))
		m, _ := NewMatrix(f, rows, cols, w)
		for _, T := range []int{1, 8, 64} {
			for _, threads := range []int{1, 2} {
				x := randVec(rng, T*cols, 1)
				out := make([]float32, T*rows)
				b.Run(fmt.Sprintf("%v/T=%d/threads=%d", f, T, threads), func(b *testing.B) {
					p := NewPool(threads)
					defer p.Close()
					b.ReportAllocs()
					for b.Loop() {
						p.MatMul(out, x, T, &m)
					}
					b.ReportMetric(float64(2*rows*cols*T)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
