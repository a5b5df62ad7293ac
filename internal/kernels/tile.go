package kernels

import "encoding/binary"

// Many activation rows against one weight matrix (prefill) would convert
// every weight element once per row. Instead a worker converts a tile of
// weight rows once into float32 "element values" (the exact float32 each Dot
// multiplies by: the weight itself for float formats, the integer q for
// quantized ones, whose block scales d are kept apart) and runs every
// activation row over the tile, two weight rows at a time so that each
// activation load serves two products.
//
// The arithmetic is the same operation for operation as the fused Dot of
// the format: the same products float32(x*v), the same lanes, the same
// block scaling and order. So a result is bit-identical whichever path
// computed it, and MatMul may pick the path by the number of rows.

// tileScratch is one worker's conversion buffer.
type tileScratch struct {
	vals   []float32 // matmulTile rows × cols element values
	scales []float32 // matmulTile rows × cols/32 block scales (quantized formats)
}

func (s *tileScratch) ensure(cols int) {
	if len(s.vals) < matmulTile*cols {
		s.vals = make([]float32, matmulTile*cols)
		s.scales = make([]float32, matmulTile*(cols/32+1))
	}
}

// decodeValues writes row's element values to v and, for quantized formats,
// its block scales to d.
func decodeValues(f Format, row []byte, v, d []float32) {
	switch f {
	case F32, F16, BF16:
		DecodeRow(f, row, v)
	case Q8_0:
		for b := range len(v) / 32 {
			blk := row[b*34 : b*34+34]
			d[b] = halfTable[binary.LittleEndian.Uint16(blk)]
			q := blk[2:34]
			vb := v[b*32 : b*32+32]
			for j := range vb {
				vb[j] = float32(int8(q[j]))
			}
		}
	case Q4_0:
		for b := range len(v) / 32 {
			blk := row[b*18 : b*18+18]
			d[b] = halfTable[binary.LittleEndian.Uint16(blk)]
			q := blk[2:18]
			vb := v[b*32 : b*32+32]
			for j := range 16 {
				vb[j] = float32(int(q[j]&15) - 8)
				vb[j+16] = float32(int(q[j]>>4) - 8)
			}
		}
	default:
		panic("kernels: decodeValues of unknown format " + f.String())
	}
}

// dot2F32 is DotF32(x, w0) and DotF32(x, w1) at once.
//
//go:norace
func dot2F32(x, w0, w1 []float32) (float32, float32) {
	w0, w1 = w0[:len(x)], w1[:len(x)]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	for len(x) >= 4 && len(w0) >= 4 && len(w1) >= 4 {
		x0, x1, x2, x3 := x[0], x[1], x[2], x[3]
		a0 += float32(x0 * w0[0])
		a1 += float32(x1 * w0[1])
		a2 += float32(x2 * w0[2])
		a3 += float32(x3 * w0[3])
		b0 += float32(x0 * w1[0])
		b1 += float32(x1 * w1[1])
		b2 += float32(x2 * w1[2])
		b3 += float32(x3 * w1[3])
		x, w0, w1 = x[4:], w0[4:], w1[4:]
	}
	for i := range x {
		a0 += float32(x[i] * w0[i])
		b0 += float32(x[i] * w1[i])
	}
	return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)
}

// dot2Q is the quantized Dot of x with two rows given as element values
// v0, v1 and block scales d0, d1.
//
//go:norace
func dot2Q(x, v0, v1, d0, d1 []float32) (float32, float32) {
	nb := len(x) / 32
	v0, v1, d0, d1 = v0[:nb*32], v1[:nb*32], d0[:nb], d1[:nb]
	var s0, s1 float32
	for b := range nb {
		xs, p, q := x[b*32:b*32+32], v0[b*32:b*32+32], v1[b*32:b*32+32]
		var a0, a1, a2, a3, c0, c1, c2, c3 float32
		for len(xs) >= 4 && len(p) >= 4 && len(q) >= 4 {
			x0, x1, x2, x3 := xs[0], xs[1], xs[2], xs[3]
			a0 += float32(x0 * p[0])
			a1 += float32(x1 * p[1])
			a2 += float32(x2 * p[2])
			a3 += float32(x3 * p[3])
			c0 += float32(x0 * q[0])
			c1 += float32(x1 * q[1])
			c2 += float32(x2 * q[2])
			c3 += float32(x3 * q[3])
			xs, p, q = xs[4:], p[4:], q[4:]
		}
		s0 += float32(d0[b] * ((a0 + a1) + (a2 + a3)))
		s1 += float32(d1[b] * ((c0 + c1) + (c2 + c3)))
	}
	return s0, s1
}

// dot1Q is dot2Q for one row.
//
//go:norace
func dot1Q(x, v, d []float32) float32 {
	nb := len(x) / 32
	v, d = v[:nb*32], d[:nb]
	var s float32
	for b := range nb {
		xs, p := x[b*32:b*32+32], v[b*32:b*32+32]
		var a0, a1, a2, a3 float32
		for len(xs) >= 4 && len(p) >= 4 {
			a0 += float32(xs[0] * p[0])
			a1 += float32(xs[1] * p[1])
			a2 += float32(xs[2] * p[2])
			a3 += float32(xs[3] * p[3])
			xs, p = xs[4:], p[4:]
		}
		s += float32(d[b] * ((a0 + a1) + (a2 + a3)))
	}
	return s
}

// runTiled computes rows [o0, o1) (at most matmulTile) for all t
// activation rows through a converted tile.
func (mt *matmulTask) runTiled(o0, o1 int, s *tileScratch) {
	w, cols, rows := mt.w, mt.w.Cols, mt.w.Rows
	quant := w.Format.BlockSize() > 1
	nb := cols / 32
	s.ensure(cols)
	for o := o0; o < o1; o++ {
		k := o - o0
		decodeValues(w.Format, w.Row(o), s.vals[k*cols:(k+1)*cols], s.scales[k*(nb+1):(k+1)*(nb+1)])
	}
	vals := func(k int) []float32 { return s.vals[k*cols : (k+1)*cols] }
	scales := func(k int) []float32 { return s.scales[k*(nb+1) : k*(nb+1)+nb] }
	for r := 0; r < mt.t; r++ {
		xr := mt.x[r*cols : (r+1)*cols]
		or := mt.out[r*rows : (r+1)*rows]
		o := o0
		for ; o+2 <= o1; o += 2 {
			k := o - o0
			if quant {
				or[o], or[o+1] = dot2Q(xr, vals(k), vals(k+1), scales(k), scales(k+1))
			} else {
				or[o], or[o+1] = dot2F32(xr, vals(k), vals(k+1))
			}
		}
		if o < o1 {
			k := o - o0
			if quant {
				or[o] = dot1Q(xr, vals(k), scales(k))
			} else {
				or[o] = DotF32(xr, vals(k))
			}
		}
	}
}
