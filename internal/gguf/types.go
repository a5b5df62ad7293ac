package gguf

import (
	"fmt"
	"math/bits"
)

// TensorType is a ggml element type, numbered as ggml numbers them.
type TensorType uint32

// The tensor types this package knows the layout of. Quantize and
// Dequantize support only a subset (see their documentation); the rest are
// known so that real model files parse and their sizes are checked.
const (
	TypeF32     TensorType = 0
	TypeF16     TensorType = 1
	TypeQ4_0    TensorType = 2
	TypeQ4_1    TensorType = 3
	TypeQ5_0    TensorType = 6
	TypeQ5_1    TensorType = 7
	TypeQ8_0    TensorType = 8
	TypeQ8_1    TensorType = 9
	TypeQ2_K    TensorType = 10
	TypeQ3_K    TensorType = 11
	TypeQ4_K    TensorType = 12
	TypeQ5_K    TensorType = 13
	TypeQ6_K    TensorType = 14
	TypeQ8_K    TensorType = 15
	TypeIQ2_XXS TensorType = 16
	TypeIQ2_XS  TensorType = 17
	TypeIQ3_XXS TensorType = 18
	TypeIQ1_S   TensorType = 19
	TypeIQ4_NL  TensorType = 20
	TypeIQ3_S   TensorType = 21
	TypeIQ2_S   TensorType = 22
	TypeIQ4_XS  TensorType = 23
	TypeI8      TensorType = 24
	TypeI16     TensorType = 25
	TypeI32     TensorType = 26
	TypeI64     TensorType = 27
	TypeF64     TensorType = 28
	TypeIQ1_M   TensorType = 29
	TypeBF16    TensorType = 30
	TypeTQ1_0   TensorType = 34
	TypeTQ2_0   TensorType = 35
	TypeMXFP4   TensorType = 39
)

type typeInfo struct {
	name       string
	blockSize  int // elements per block
	blockBytes int // bytes per block
}

// typeTable is indexed by TensorType; zero entries are unknown types
// (including the numbers ggml retired).
var typeTable = [...]typeInfo{
	TypeF32:     {"F32", 1, 4},
	TypeF16:     {"F16", 1, 2},
	TypeQ4_0:    {"Q4_0", 32, 18},
	TypeQ4_1:    {"Q4_1", 32, 20},
	TypeQ5_0:    {"Q5_0", 32, 22},
	TypeQ5_1:    {"Q5_1", 32, 24},
	TypeQ8_0:    {"Q8_0", 32, 34},
	TypeQ8_1:    {"Q8_1", 32, 36},
	TypeQ2_K:    {"Q2_K", 256, 84},
	TypeQ3_K:    {"Q3_K", 256, 110},
	TypeQ4_K:    {"Q4_K", 256, 144},
	TypeQ5_K:    {"Q5_K", 256, 176},
	TypeQ6_K:    {"Q6_K", 256, 210},
	TypeQ8_K:    {"Q8_K", 256, 292},
	TypeIQ2_XXS: {"IQ2_XXS", 256, 66},
	TypeIQ2_XS:  {"IQ2_XS", 256, 74},
	TypeIQ3_XXS: {"IQ3_XXS", 256, 98},
	TypeIQ1_S:   {"IQ1_S", 256, 50},
	TypeIQ4_NL:  {"IQ4_NL", 32, 18},
	TypeIQ3_S:   {"IQ3_S", 256, 110},
	TypeIQ2_S:   {"IQ2_S", 256, 82},
	TypeIQ4_XS:  {"IQ4_XS", 256, 136},
	TypeI8:      {"I8", 1, 1},
	TypeI16:     {"I16", 1, 2},
	TypeI32:     {"I32", 1, 4},
	TypeI64:     {"I64", 1, 8},
	TypeF64:     {"F64", 1, 8},
	TypeIQ1_M:   {"IQ1_M", 256, 56},
	TypeBF16:    {"BF16", 1, 2},
	TypeTQ1_0:   {"TQ1_0", 256, 54},
	TypeTQ2_0:   {"TQ2_0", 256, 66},
	TypeMXFP4:   {"MXFP4", 32, 17},
}

func (t TensorType) info() (typeInfo, bool) {
	if uint64(t) >= uint64(len(typeTable)) || typeTable[t].blockSize == 0 {
		return typeInfo{}, false
	}
	return typeTable[t], true
}

// Known reports whether the layout of t is known.
func (t TensorType) Known() bool {
	_, ok := t.info()
	return ok
}

// String returns ggml's name for t ("F32", "Q8_0", ...), or "type(N)" for
// an unknown type.
func (t TensorType) String() string {
	if ti, ok := t.info(); ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize returns the number of elements per block (1 for the float types,
// 32 for Q8_0 and Q4_0, 256 for the K-quants), or 0 for an unknown type.
func (t TensorType) BlockSize() int {
	ti, _ := t.info()
	return ti.blockSize
}

// BlockBytes returns the number of bytes per block, or 0 for an unknown type.
func (t TensorType) BlockBytes() int {
	ti, _ := t.info()
	return ti.blockBytes
}

// RowBytes returns the bytes taken by n consecutive elements of type t. It
// fails for an unknown type, a negative n, or an n that is not a whole
// number of blocks.
func (t TensorType) RowBytes(n int) (int, error) {
	ti, ok := t.info()
	if !ok {
		return 0, fmt.Errorf("gguf: unknown tensor type %d", uint32(t))
	}
	if n < 0 || n%ti.blockSize != 0 {
		return 0, fmt.Errorf("gguf: %d elements is not a whole number of %s blocks of %d", n, ti.name, ti.blockSize)
	}
	hi, lo := bits.Mul64(uint64(n/ti.blockSize), uint64(ti.blockBytes))
	if hi != 0 || lo > uint64(maxInt) {
		return 0, fmt.Errorf("gguf: %d elements of %s overflow the address space", n, ti.name)
	}
	return int(lo), nil
}

const maxInt = int(^uint(0) >> 1)

// tensorBytes returns the byte size of a tensor with dims and type t,
// checking every step for overflow; the product of dims must also fit
// ggml's int64 element count.
func tensorBytes(t TensorType, dims []uint64) (uint64, error) {
	ti, ok := t.info()
	if !ok {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(t))
	}
	if len(dims) == 0 || len(dims) > MaxDims {
		return 0, fmt.Errorf("%d dimensions, want 1 to %d", len(dims), MaxDims)
	}
	n := uint64(1)
	for i, d := range dims {
		if d == 0 {
			return 0, fmt.Errorf("dimension %d is zero", i)
		}
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > 1<<63-1 {
			return 0, fmt.Errorf("dimensions %v overflow the element count", dims)
		}
		n = lo
	}
	if dims[0]%uint64(ti.blockSize) != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of the %s block size %d", dims[0], ti.name, ti.blockSize)
	}
	hi, lo := bits.Mul64(n/uint64(ti.blockSize), uint64(ti.blockBytes))
	if hi != 0 || lo > uint64(maxInt) {
		return 0, fmt.Errorf("dimensions %v of %s overflow the byte size", dims, ti.name)
	}
	return lo, nil
}

// MaxDims is the largest number of dimensions a ggml tensor has.
const MaxDims = 4

// MaxTensorName is the longest tensor name, in bytes, that ggml accepts
// (its name buffer holds 64 bytes including the terminating NUL).
const MaxTensorName = 63

// DefaultAlignment is the alignment of tensor data when the file does not
// set general.alignment.
const DefaultAlignment = 32
