package kernels

import (
	"fmt"
	"math"
)

// Format is the memory layout of a weight row. The values are the kernels'
// own; internal/model maps GGUF tensor types onto them.
type Format uint8

// The formats the kernels read directly.
const (
	F32  Format = iota + 1 // little-endian IEEE float32
	F16                    // little-endian IEEE half
	BF16                   // little-endian bfloat16 (the top half of a float32)
	Q8_0                   // blocks of 32: float16 scale d, 32 int8 q; x = d*q
	Q4_0                   // blocks of 32: float16 scale d, 16 bytes; x = d*(nibble-8), low nibbles first
)

var formatNames = [...]string{F32: "F32", F16: "F16", BF16: "BF16", Q8_0: "Q8_0", Q4_0: "Q4_0"}

func (f Format) String() string {
	if f >= F32 && int(f) < len(formatNames) {
		return formatNames[f]
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// BlockSize is the number of elements per block (1 for the float formats).
func (f Format) BlockSize() int {
	switch f {
	case Q8_0, Q4_0:
		return 32
	}
	return 1
}

// BlockBytes is the number of bytes per block.
func (f Format) BlockBytes() int {
	switch f {
	case F32:
		return 4
	case F16, BF16:
		return 2
	case Q8_0:
		return 34
	case Q4_0:
		return 18
	}
	return 0
}

// RowBytes is the size in bytes of a row of n elements, or an error when n
// is not a whole number of blocks or the format is unknown.
func (f Format) RowBytes(n int) (int, error) {
	bs, bb := f.BlockSize(), f.BlockBytes()
	if bb == 0 {
		return 0, fmt.Errorf("kernels: unknown format %v", f)
	}
	if n < 0 || n%bs != 0 {
		return 0, fmt.Errorf("kernels: %d elements is not a whole number of %v blocks of %d", n, f, bs)
	}
	return n / bs * bb, nil
}

// HalfToFloat converts an IEEE half to float32 exactly.
//
// The common case (normal numbers) is a shift and an exponent re-bias with
// no float arithmetic, so no denormal operand ever reaches the FPU; zeros,
// subnormals, infinities and NaNs take the rare branch.
func HalfToFloat(h uint16) float32 {
	// One unsigned compare catches both exponent 0 (wraps around) and 31.
	if h&0x7c00-0x400 >= 0x7800 {
		return halfToFloatRare(h)
	}
	u := uint32(h)
	return math.Float32frombits(u&0x8000<<16 | (u&0x7fff<<13 + 112<<23))
}

// halfToFloatRare is kept out of line so that HalfToFloat inlines.
//
//go:noinline
func halfToFloatRare(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	m := uint32(h & 0x3ff)
	if h&0x7c00 == 0x7c00 {
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	}
	// Zero or subnormal: m * 2^-24, exact in float32.
	f := float32(m) * 0x1p-24
	return math.Float32frombits(math.Float32bits(f) | sign)
}

// BrainToFloat converts a bfloat16 to float32 exactly.
func BrainToFloat(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}
