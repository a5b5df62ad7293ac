package gguf

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// oneTensor returns a file with one tensor whose info is written by info
// and whose data section holds dataLen bytes.
func oneTensor(info func(r *raw), dataLen int) []byte { return tensors(1, info, dataLen) }

// tensors is oneTensor for n tensor infos.
func tensors(n uint64, info func(r *raw), dataLen int) []byte {
	r := header(n, 0)
	info(r)
	r.padTo(32).zeros(dataLen)
	return r.b
}

func TestParseRejectsMalformed(t *testing.T) {
	deep := header(0, 1).str("deep").u32(vtArray)
	for range 17 {
		deep.u32(vtArray).u64(1)
	}
	deep.u32(vtUint8).u64(0)

	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated: magic needs 4 bytes, 0 left"},
		{"bad magic", []byte("GGML\x03\x00\x00\x00"), `bad magic "GGML"`},
		{"no version", []byte("GGUF\x03"), "truncated: version needs 4 bytes, 1 left"},
		{"version 1", (&raw{}).u32(magic).u32(1).u64(0).u64(0).b, "unsupported version 1 (supported: 2, 3)"},
		{"version 4", (&raw{}).u32(magic).u32(4).u64(0).u64(0).b, "unsupported version 4"},
		{"big endian", (&raw{}).u32(magic).u32(0x03000000).b, "big-endian files are not supported"},
		{"truncated counts", (&raw{}).u32(magic).u32(3).u64(0).b, "truncated: metadata count needs 8 bytes, 0 left"},
		{"absurd tensor count", header(math.MaxUint64, 0).b, "tensor count 18446744073709551615 exceeds the limit of 1048576"},
		{"tensor count past end", header(1000, 0).zeros(64).b, "tensor count 1000 cannot fit in the 64 bytes left"},
		{"absurd metadata count", header(0, 1<<40).b, "metadata count 1099511627776 exceeds the limit"},
		{"metadata count past end", header(0, 10).zeros(100).b, "metadata count 10 cannot fit in the 100 bytes left"},
		{"key longer than file", header(0, 1).u64(1000).zeros(20).b, "metadata key length 1000 exceeds the 20 bytes left"},
		{"key length overflow", header(0, 1).u64(math.MaxUint64).zeros(20).b, "metadata key length 18446744073709551615 exceeds"},
		{"string value longer than file", header(0, 1).str("k").u32(vtString).u64(1 << 62).b, `metadata key "k": string length 4611686018427387904 exceeds the 0 bytes left`},
		{"unknown value type", header(0, 1).str("k").u32(13).zeros(8).b, `metadata key "k": unknown value type 13`},
		{"truncated scalar", header(0, 1).str("k").u32(vtUint64).zeros(3).b, `metadata key "k": truncated: uint64 value needs 8 bytes, 3 left`},
		{"bad bool", header(0, 1).str("k").u32(vtBool).u8(2).b, `metadata key "k": bool value 2 is neither 0 nor 1`},
		{"bad bool in array", header(0, 1).str("k").u32(vtArray).u32(vtBool).u64(2).u8(1).u8(7).b, "bool value 7 is neither 0 nor 1"},
		{"unknown array element type", header(0, 1).str("k").u32(vtArray).u32(99).u64(0).b, `metadata key "k": unknown array element type 99`},
		{"absurd array length", header(0, 1).str("k").u32(vtArray).u32(vtUint32).u64(1 << 61).zeros(16).b, "array length 2305843009213693952 cannot fit in the 16 bytes left"},
		{"string array past end", header(0, 1).str("k").u32(vtArray).u32(vtString).u64(3).str("a").b, "array length 3 cannot fit in the 9 bytes left"},
		{"string element past end", header(0, 1).str("k").u32(vtArray).u32(vtString).u64(2).str("a").u64(50).b, "array element length 50 exceeds the 0 bytes left"},
		{"nested array past end", header(0, 1).str("k").u32(vtArray).u32(vtArray).u64(1 << 40).b, "array length 1099511627776 cannot fit"},
		{"arrays too deep", deep.b, `metadata key "deep": arrays nested deeper than 16`},
		{"duplicate key", header(0, 2).str("k").u32(vtUint8).u8(1).str("k").u32(vtUint8).u8(2).b, `duplicate metadata key "k"`},
		{"alignment type", header(0, 1).str("general.alignment").u32(vtUint64).u64(32).b, "general.alignment has type uint64, want uint32"},
		{"alignment zero", header(0, 1).str("general.alignment").u32(vtUint32).u32(0).b, "general.alignment 0 is not a power of two"},
		{"alignment 48", header(0, 1).str("general.alignment").u32(vtUint32).u32(48).b, "general.alignment 48 is not a power of two"},
		{"tensor name too long", oneTensor(func(r *raw) { r.tensor(strings.Repeat("x", 64), TypeF32, 0, 1) }, 4), "tensor 0 name is 64 bytes, longer than 63"},
		{"tensor name past end", header(1, 0).u64(1 << 40).zeros(40).b, "tensor 0 name length 1099511627776 exceeds the 40 bytes left"},
		{"zero dims", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 0) }, 4), `tensor "w" has 0 dimensions, want 1 to 4`},
		{"five dims", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 0, 1, 1, 1, 1, 1) }, 4), `tensor "w" has 5 dimensions, want 1 to 4`},
		{"absurd dim count", header(1, 0).str("w").u32(math.MaxUint32).zeros(40).b, `tensor "w" has 4294967295 dimensions`},
		{"zero dim", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 0, 4, 0) }, 16), `tensor "w": dimension 1 is zero`},
		{"dims overflow", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 0, 1<<32, 1<<32) }, 16), `tensor "w": dimensions [4294967296 4294967296] overflow the element count`},
		{"dims overflow int64", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 0, 1<<62, 2) }, 16), "overflow the element count"},
		{"bytes overflow", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 0, 1<<62) }, 16), "overflow the byte size"},
		{"unknown tensor type", oneTensor(func(r *raw) { r.tensor("w", TensorType(4), 0, 4) }, 16), `tensor "w": unknown tensor type 4`},
		{"huge tensor type", oneTensor(func(r *raw) { r.tensor("w", TensorType(1<<31), 0, 4) }, 16), "unknown tensor type 2147483648"},
		{"partial block", oneTensor(func(r *raw) { r.tensor("w", TypeQ8_0, 0, 16) }, 34), `tensor "w": row length 16 is not a multiple of the Q8_0 block size 32`},
		{"unaligned offset", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 4, 1) }, 64), `tensor "w" offset 4 is not a multiple of the alignment 32`},
		{"offset past end", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 1<<40, 1) }, 64), `tensor "w" data [1099511627776, +4) runs past the end of the 64-byte data section`},
		{"offset overflow", oneTensor(func(r *raw) { r.tensor("w", TypeF32, math.MaxUint64-31, 8) }, 64), "runs past the end"},
		{"truncated data", oneTensor(func(r *raw) { r.tensor("w", TypeF32, 0, 16) }, 63), `tensor "w" data [0, +64) runs past the end of the 63-byte data section`},
		{"data section missing", header(1, 0).tensor("w", TypeF32, 0, 1).b, "tensor data section starts at byte 64 past the end of the 57-byte file"},
		{"duplicate tensor", tensors(2, func(r *raw) { r.tensor("w", TypeF32, 0, 1); r.tensor("w", TypeF32, 32, 1) }, 64), `duplicate tensor name "w"`},
		{"overlapping tensors", tensors(2, func(r *raw) { r.tensor("a", TypeF32, 0, 16); r.tensor("b", TypeF32, 32, 8) }, 128), `tensors "a" and "b" overlap`},
		{"same offset", tensors(2, func(r *raw) { r.tensor("a", TypeF32, 32, 1); r.tensor("b", TypeF32, 32, 1) }, 128), "overlap in the data section"},
	}
	for _, c := range cases {
		f, err := Parse(c.data)
		if err == nil {
			t.Errorf("%s: parsed without error (%d tensors)", c.name, len(f.Tensors))
			continue
		}
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Errorf("%s: error %v is not a *FormatError", c.name, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n got %v\nwant it to contain %q", c.name, err, c.want)
		}
	}
}

// TestParseTruncations cuts a valid file at every length: each prefix that
// drops any header or tensor byte must fail; only trailing padding may go.
func TestParseTruncations(t *testing.T) {
	w := NewWriter()
	w.Set("general.architecture", "llama")
	w.Set("tokens", []string{"a", "bc"})
	w.Set("nested", []any{[]uint16{1}})
	must(t, w.AddTensor("a", TypeF32, []uint64{3}, make([]byte, 12)))
	must(t, w.AddTensor("b", TypeQ4_0, []uint64{32}, make([]byte, 18)))
	data := encode(t, w)
	f, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	last := f.Tensors[1]
	end := uintptrOffset(data, last.Data) + uint64(len(last.Data))
	for n := range len(data) {
		_, err := Parse(data[:n])
		if uint64(n) < end && err == nil {
			t.Errorf("prefix of %d bytes (data ends at %d) parsed", n, end)
		}
		if uint64(n) >= end && err != nil {
			t.Errorf("prefix of %d bytes cutting only padding: %v", n, err)
		}
	}
}

func TestVersion2(t *testing.T) {
	data := encode(t, sampleWriter(t))
	data[4] = 2
	f, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 2 {
		t.Errorf("version %d, want 2", f.Version)
	}
}

func TestGetters(t *testing.T) {
	w := NewWriter()
	w.Set("s", "text")
	w.Set("u8", uint8(7))
	w.Set("neg", int32(-3))
	w.Set("big", uint64(math.MaxUint64))
	w.Set("f32", float32(0.5))
	w.Set("b", true)
	w.Set("strs", []string{"a"})
	w.Set("f32s", []float32{1, 2})
	w.Set("f64s", []float64{1.5})
	w.Set("i32s", []int32{-1, 5})
	w.Set("u8s", []uint8{1, 200})
	w.Set("u64s", []uint64{1, 1 << 40})
	f, err := Parse(encode(t, w))
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, got, want any, err error, wantErr string) {
		t.Helper()
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("%s: %v", what, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("%s: error %v, want %q", what, err, wantErr)
		case wantErr == "" && !reflect.DeepEqual(got, want):
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	s, err := f.String("s")
	check("String(s)", s, "text", err, "")
	_, err = f.String("u8")
	check("String(u8)", nil, nil, err, `gguf: key "u8" has type uint8, want string`)
	_, err = f.String("nope")
	if !errors.Is(err, ErrMissingKey) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("missing key: %v", err)
	}
	u, err := f.Uint("u8")
	check("Uint(u8)", u, uint64(7), err, "")
	u, err = f.Uint("big")
	check("Uint(big)", u, uint64(math.MaxUint64), err, "")
	_, err = f.Uint("neg")
	check("Uint(neg)", nil, nil, err, `key "neg" holds negative value -3`)
	_, err = f.Uint("f32")
	check("Uint(f32)", nil, nil, err, "has type float32, want an unsigned integer")
	i, err := f.Int("neg")
	check("Int(neg)", i, int64(-3), err, "")
	_, err = f.Int("big")
	check("Int(big)", nil, nil, err, "overflows int64")
	fl, err := f.Float("f32")
	check("Float(f32)", fl, 0.5, err, "")
	fl, err = f.Float("neg")
	check("Float(neg)", fl, -3.0, err, "")
	_, err = f.Float("s")
	check("Float(s)", nil, nil, err, "has type string, want a number")
	b, err := f.Bool("b")
	check("Bool(b)", b, true, err, "")
	_, err = f.Bool("u8")
	check("Bool(u8)", nil, nil, err, "want bool")
	ss, err := f.Strings("strs")
	check("Strings", ss, []string{"a"}, err, "")
	_, err = f.Strings("i32s")
	check("Strings(i32s)", nil, nil, err, "has type []int32, want []string")
	fs, err := f.Float32s("f32s")
	check("Float32s", fs, []float32{1, 2}, err, "")
	fs, err = f.Float32s("f64s")
	check("Float32s(f64s)", fs, []float32{1.5}, err, "")
	is, err := f.Int32s("i32s")
	check("Int32s", is, []int32{-1, 5}, err, "")
	is, err = f.Int32s("u8s")
	check("Int32s(u8s)", is, []int32{1, 200}, err, "")
	_, err = f.Int32s("u64s")
	check("Int32s(u64s)", nil, nil, err, `key "u64s" element 1 does not fit an int32`)
	_, err = f.Int32s("strs")
	check("Int32s(strs)", nil, nil, err, "want an integer array")
	if _, ok := f.Tensor("none"); ok {
		t.Error("Tensor(none) found")
	}
}
