package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
)

// F16ToF32 converts an IEEE 754 half-precision value to float32 exactly.
// NaN payloads are kept.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: mant * 2^-24, exact in float32
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(v))
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F32ToF16 converts a float32 to IEEE 754 half precision, rounding to
// nearest with ties to even. Values too large become ±Inf, values too small
// become ±0 or subnormals; a NaN stays a (quiet) NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant == 0 {
			return sign | 0x7c00
		}
		return sign | 0x7c00 | 0x200 | uint16(mant>>13)
	}
	e := exp - 127 + 15 // the half exponent field
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Half subnormal: the 24-bit significand m24 scaled by 2^(e-14).
		// Float32 subnormals have e = -112 and round to zero below.
		if e < -10 {
			return sign
		}
		return sign | uint16(roundShift(mant|0x800000, uint(14-e)))
	}
	// Normal: drop 13 bits; a carry out of the mantissa correctly bumps the
	// exponent (up to Inf).
	return sign | (uint16(e<<10) + uint16(roundShift(mant, 13)))
}

// roundShift returns m >> shift rounded to nearest, ties to even.
func roundShift(m uint32, shift uint) uint32 {
	q := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return q
}

// BF16ToF32 converts a bfloat16 to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts a float32 to bfloat16, rounding to nearest with ties
// to even (overflow rounds to ±Inf). A NaN stays a quiet NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Quantize encodes src as tensor type t: F32, F16, BF16, Q8_0 or Q4_0.
// len(src) must be a whole number of blocks. The block quantizers follow
// ggml's reference quantizers, so they produce the bytes llama.cpp's
// reference path would; they reject NaN and Inf, which a block scale cannot
// represent.
func Quantize(t TensorType, src []float32) ([]byte, error) {
	n, err := t.RowBytes(len(src))
	if err != nil {
		return nil, err
	}
	out := make([]byte, n)
	le := binary.LittleEndian
	switch t {
	case TypeF32:
		for i, v := range src {
			le.PutUint32(out[4*i:], math.Float32bits(v))
		}
	case TypeF16:
		for i, v := range src {
			le.PutUint16(out[2*i:], F32ToF16(v))
		}
	case TypeBF16:
		for i, v := range src {
			le.PutUint16(out[2*i:], F32ToBF16(v))
		}
	case TypeQ8_0:
		for blk := 0; blk < len(src)/32; blk++ {
			if err := quantizeQ8_0(src[32*blk:32*blk+32], out[34*blk:34*blk+34]); err != nil {
				return nil, fmt.Errorf("gguf: Quantize Q8_0 block %d: %v", blk, err)
			}
		}
	case TypeQ4_0:
		for blk := 0; blk < len(src)/32; blk++ {
			if err := quantizeQ4_0(src[32*blk:32*blk+32], out[18*blk:18*blk+18]); err != nil {
				return nil, fmt.Errorf("gguf: Quantize Q4_0 block %d: %v", blk, err)
			}
		}
	default:
		return nil, fmt.Errorf("gguf: Quantize does not support %s", t)
	}
	return out, nil
}

func checkFinite(x []float32) error {
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("element %d is not finite", i)
		}
	}
	return nil
}

// quantizeQ8_0 encodes 32 values as an F16 scale d = max|x|/127 and 32
// int8 quants round(x/d) (ties away from zero).
func quantizeQ8_0(x []float32, out []byte) error {
	var amax float32
	for i, v := range x {
		a := math.Float32frombits(math.Float32bits(v) &^ (1 << 31))
		if !(a <= math.MaxFloat32) { // NaN or Inf
			return fmt.Errorf("element %d is not finite", i)
		}
		amax = max(amax, a)
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	dh := F32ToF16(d)
	if dh&0x7c00 == 0x7c00 {
		return fmt.Errorf("scale %g overflows F16", d)
	}
	binary.LittleEndian.PutUint16(out, dh)
	for j, v := range x {
		out[2+j] = byte(int8(math.Round(float64(float32(v * id)))))
	}
	return nil
}

// quantizeQ4_0 encodes 32 values as an F16 scale d = m/-8, where m is the
// value of largest magnitude, and 4-bit quants x/d+8 truncated and capped
// at 15; element j and j+16 share byte j (low and high nibble).
func quantizeQ4_0(x []float32, out []byte) error {
	if err := checkFinite(x); err != nil {
		return err
	}
	var amax, m float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, m = a, v
		}
	}
	d := m / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	dh := F32ToF16(d)
	if dh&0x7c00 == 0x7c00 {
		return fmt.Errorf("scale %g overflows F16", d)
	}
	binary.LittleEndian.PutUint16(out, dh)
	for j := range 16 {
		// float32(...) rounds the product before the add, so no platform
		// fuses them into an FMA with different rounding.
		lo := min(15, int8(float32(x[j]*id)+8.5))
		hi := min(15, int8(float32(x[j+16]*id)+8.5))
		out[2+j] = byte(lo) | byte(hi)<<4
	}
	return nil
}

// Dequantize decodes data, holding len(dst) elements of type t, into dst.
// Supported: F32, F16, BF16, Q8_0, Q4_0 and Q4_K.
func Dequantize(t TensorType, data []byte, dst []float32) error {
	n, err := t.RowBytes(len(dst))
	if err != nil {
		return err
	}
	if len(data) != n {
		return fmt.Errorf("gguf: Dequantize %s: %d bytes for %d elements, want %d", t, len(data), len(dst), n)
	}
	le := binary.LittleEndian
	switch t {
	case TypeF32:
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(data[4*i:]))
		}
	case TypeF16:
		for i := range dst {
			dst[i] = F16ToF32(le.Uint16(data[2*i:]))
		}
	case TypeBF16:
		for i := range dst {
			dst[i] = BF16ToF32(le.Uint16(data[2*i:]))
		}
	case TypeQ8_0:
		for blk := 0; blk < len(dst)/32; blk++ {
			b, y := data[34*blk:34*blk+34], dst[32*blk:32*blk+32]
			d := F16ToF32(le.Uint16(b))
			for j := range y {
				y[j] = float32(int8(b[2+j])) * d
			}
		}
	case TypeQ4_0:
		for blk := 0; blk < len(dst)/32; blk++ {
			b, y := data[18*blk:18*blk+18], dst[32*blk:32*blk+32]
			d := F16ToF32(le.Uint16(b))
			for j := range 16 {
				y[j] = float32(int(b[2+j]&0xf)-8) * d
				y[j+16] = float32(int(b[2+j]>>4)-8) * d
			}
		}
	case TypeQ4_K:
		for blk := 0; blk < len(dst)/256; blk++ {
			dequantizeQ4_K(data[144*blk:144*blk+144], dst[256*blk:256*blk+256])
		}
	default:
		return fmt.Errorf("gguf: Dequantize does not support %s", t)
	}
	return nil
}

// q4kScaleMin unpacks the 6-bit scale and min of sub-block j (0..7) from
// the 12 packed bytes of a Q4_K block: sub-blocks 0-3 use the low six bits
// of bytes j and j+4; sub-blocks 4-7 use a nibble of byte j+4 plus the top
// two bits of byte j-4 (scale) or byte j (min).
func q4kScaleMin(j int, s []byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// dequantizeQ4_K decodes one 144-byte Q4_K block (F16 d, F16 dmin, 12
// bytes of packed scales and mins, 128 bytes of nibbles) into 256 values.
// Each 64-value group uses the low nibbles of 32 bytes for its first half
// and their high nibbles for its second half: y = d*sc*q - dmin*m.
func dequantizeQ4_K(b []byte, y []float32) {
	d := F16ToF32(binary.LittleEndian.Uint16(b[0:]))
	dmin := F16ToF32(binary.LittleEndian.Uint16(b[2:]))
	scales, qs := b[4:16], b[16:144]
	for g := range 4 {
		sc1, m1 := q4kScaleMin(2*g, scales)
		sc2, m2 := q4kScaleMin(2*g+1, scales)
		d1, min1 := d*float32(sc1), dmin*float32(m1)
		d2, min2 := d*float32(sc2), dmin*float32(m2)
		q := qs[32*g : 32*g+32]
		for l := range 32 {
			y[64*g+l] = float32(d1*float32(q[l]&0xf)) - min1
			y[64*g+32+l] = float32(d2*float32(q[l]>>4)) - min2
		}
	}
}
