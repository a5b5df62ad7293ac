package kernels

import (
	"encoding/binary"
	"math"
)

// The dot products are marked go:norace: they only read, and race builds
// would otherwise spend nine tenths of every model test instrumenting their
// loads. Their callers' writes (the outputs) stay instrumented.
//
// The dot products below all follow one reduction order, fixed by the row
// length: element i goes to lane i mod 4 (a tail shorter than 4 goes to lane
// 0, in order), and the lanes are combined as (a0+a1)+(a2+a3). Quantized
// formats do this within each 32-element block, scale the block sum by the
// block's d, and add the blocks in order. Every product is rounded to
// float32 explicitly so that no build fuses it into an FMA.

// DotF32 returns the dot product of x and w[:len(x)].
//
//go:norace
func DotF32(x, w []float32) float32 {
	w = w[:len(x)]
	var a0, a1, a2, a3 float32
	for len(x) >= 4 && len(w) >= 4 {
		a0 += float32(x[0] * w[0])
		a1 += float32(x[1] * w[1])
		a2 += float32(x[2] * w[2])
		a3 += float32(x[3] * w[3])
		x, w = x[4:], w[4:]
	}
	for i := range x {
		a0 += float32(x[i] * w[i])
	}
	return (a0 + a1) + (a2 + a3)
}

// DotF32Bytes returns the dot product of x with a row of little-endian
// float32s.
//
//go:norace
func DotF32Bytes(x []float32, w []byte) float32 {
	w = w[:4*len(x)]
	var a0, a1, a2, a3 float32
	for len(x) >= 4 && len(w) >= 16 {
		a0 += float32(x[0] * math.Float32frombits(binary.LittleEndian.Uint32(w[0:])))
		a1 += float32(x[1] * math.Float32frombits(binary.LittleEndian.Uint32(w[4:])))
		a2 += float32(x[2] * math.Float32frombits(binary.LittleEndian.Uint32(w[8:])))
		a3 += float32(x[3] * math.Float32frombits(binary.LittleEndian.Uint32(w[12:])))
		x, w = x[4:], w[16:]
	}
	for i := range x {
		a0 += float32(x[i] * math.Float32frombits(binary.LittleEndian.Uint32(w[4*i:])))
	}
	return (a0 + a1) + (a2 + a3)
}

// DotF16 returns the dot product of x with a row of IEEE halves.
//
//go:norace
func DotF16(x []float32, w []byte) float32 {
	w = w[:2*len(x)]
	t := halfTable
	var a0, a1, a2, a3 float32
	for len(x) >= 4 && len(w) >= 8 {
		a0 += float32(x[0] * t[binary.LittleEndian.Uint16(w[0:])])
		a1 += float32(x[1] * t[binary.LittleEndian.Uint16(w[2:])])
		a2 += float32(x[2] * t[binary.LittleEndian.Uint16(w[4:])])
		a3 += float32(x[3] * t[binary.LittleEndian.Uint16(w[6:])])
		x, w = x[4:], w[8:]
	}
	for i := range x {
		a0 += float32(x[i] * t[binary.LittleEndian.Uint16(w[2*i:])])
	}
	return (a0 + a1) + (a2 + a3)
}

// halfTable maps every half to its float32 value. A lookup is about four
// times faster than converting bits in portable Go (the conversion does not
// inline); the table is built once at init and never written again.
var halfTable = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = HalfToFloat(uint16(i))
	}
	return &t
}()

// halvesToFloats converts len(dst) little-endian halves.
func halvesToFloats(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	t := halfTable
	for i := range dst {
		dst[i] = t[binary.LittleEndian.Uint16(src[2*i:])]
	}
}

// DotBF16 returns the dot product of x with a row of bfloat16s.
//
//go:norace
func DotBF16(x []float32, w []byte) float32 {
	w = w[:2*len(x)]
	var a0, a1, a2, a3 float32
	for len(x) >= 4 && len(w) >= 8 {
		a0 += float32(x[0] * BrainToFloat(binary.LittleEndian.Uint16(w[0:])))
		a1 += float32(x[1] * BrainToFloat(binary.LittleEndian.Uint16(w[2:])))
		a2 += float32(x[2] * BrainToFloat(binary.LittleEndian.Uint16(w[4:])))
		a3 += float32(x[3] * BrainToFloat(binary.LittleEndian.Uint16(w[6:])))
		x, w = x[4:], w[8:]
	}
	for i := range x {
		a0 += float32(x[i] * BrainToFloat(binary.LittleEndian.Uint16(w[2*i:])))
	}
	return (a0 + a1) + (a2 + a3)
}

// DotQ8_0 returns the dot product of x (a multiple of 32 long) with a row of
// Q8_0 blocks.
//
//go:norace
func DotQ8_0(x []float32, w []byte) float32 {
	nb := len(x) / 32
	w = w[:nb*34]
	var sum float32
	for b := 0; b < nb; b++ {
		blk := w[b*34 : b*34+34]
		d := halfTable[binary.LittleEndian.Uint16(blk)]
		q := blk[2:34]
		xs := x[b*32 : b*32+32]
		var a0, a1, a2, a3 float32
		for len(xs) >= 4 && len(q) >= 4 {
			a0 += float32(xs[0] * float32(int8(q[0])))
			a1 += float32(xs[1] * float32(int8(q[1])))
			a2 += float32(xs[2] * float32(int8(q[2])))
			a3 += float32(xs[3] * float32(int8(q[3])))
			xs, q = xs[4:], q[4:]
		}
		sum += float32(d * ((a0 + a1) + (a2 + a3)))
	}
	return sum
}

// DotQ4_0 returns the dot product of x (a multiple of 32 long) with a row of
// Q4_0 blocks. Element j < 16 of a block is the low nibble of byte j,
// element j+16 its high nibble.
//
//go:norace
func DotQ4_0(x []float32, w []byte) float32 {
	nb := len(x) / 32
	w = w[:nb*18]
	var sum float32
	for b := 0; b < nb; b++ {
		blk := w[b*18 : b*18+18]
		d := halfTable[binary.LittleEndian.Uint16(blk)]
		q := blk[2:18]
		lo := x[b*32 : b*32+16]
		hi := x[b*32+16 : b*32+32]
		// Lanes follow element index mod 4, as in every other format:
		// elements j and j+16 share a lane (16 is a multiple of 4), the low
		// half first.
		var a0, a1, a2, a3 float32
		for j := 0; j < 16; j += 4 {
			qq := q[j : j+4 : j+4]
			l := lo[j : j+4 : j+4]
			a0 += float32(l[0] * float32(int(qq[0]&15)-8))
			a1 += float32(l[1] * float32(int(qq[1]&15)-8))
			a2 += float32(l[2] * float32(int(qq[2]&15)-8))
			a3 += float32(l[3] * float32(int(qq[3]&15)-8))
		}
		for j := 0; j < 16; j += 4 {
			qq := q[j : j+4 : j+4]
			h := hi[j : j+4 : j+4]
			a0 += float32(h[0] * float32(int(qq[0]>>4)-8))
			a1 += float32(h[1] * float32(int(qq[1]>>4)-8))
			a2 += float32(h[2] * float32(int(qq[2]>>4)-8))
			a3 += float32(h[3] * float32(int(qq[3]>>4)-8))
		}
		sum += float32(d * ((a0 + a1) + (a2 + a3)))
	}
	return sum
}

// Dot returns the dot product of x with one row of w in format f. The row
// must hold exactly len(x) elements.
func Dot(f Format, x []float32, w []byte) float32 {
	switch f {
	case F32:
		return DotF32Bytes(x, w)
	case F16:
		return DotF16(x, w)
	case BF16:
		return DotBF16(x, w)
	case Q8_0:
		return DotQ8_0(x, w)
	case Q4_0:
		return DotQ4_0(x, w)
	}
	panic("kernels: Dot of unknown format " + f.String())
}

// DecodeRow writes the len(dst) elements of one row in format f to dst as
// float32 (each element exactly as the dot products see it).
func DecodeRow(f Format, w []byte, dst []float32) {
	switch f {
	case F32:
		w = w[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(w[4*i:]))
		}
	case F16:
		halvesToFloats(dst, w)
	case BF16:
		w = w[:2*len(dst)]
		for i := range dst {
			dst[i] = BrainToFloat(binary.LittleEndian.Uint16(w[2*i:]))
		}
	case Q8_0:
		for b := 0; b < len(dst)/32; b++ {
			blk := w[b*34 : b*34+34]
			d := halfTable[binary.LittleEndian.Uint16(blk)]
			for j := 0; j < 32; j++ {
				dst[b*32+j] = d * float32(int8(blk[2+j]))
			}
		}
	case Q4_0:
		for b := 0; b < len(dst)/32; b++ {
			blk := w[b*18 : b*18+18]
			d := halfTable[binary.LittleEndian.Uint16(blk)]
			for j := 0; j < 16; j++ {
				dst[b*32+j] = d * float32(int(blk[2+j]&15)-8)
				dst[b*32+j+16] = d * float32(int(blk[2+j]>>4)-8)
			}
		}
	default:
		panic("kernels: DecodeRow of unknown format " + f.String())
	}
}
