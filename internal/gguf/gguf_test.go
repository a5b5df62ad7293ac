package gguf

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// raw assembles GGUF bytes field by field, so tests can build files the
// Writer would refuse to produce.
type raw struct{ b []byte }

func (r *raw) u8(v uint8) *raw   { r.b = append(r.b, v); return r }
func (r *raw) u32(v uint32) *raw { r.b = binary.LittleEndian.AppendUint32(r.b, v); return r }
func (r *raw) u64(v uint64) *raw { r.b = binary.LittleEndian.AppendUint64(r.b, v); return r }
func (r *raw) str(s string) *raw { r.u64(uint64(len(s))); r.b = append(r.b, s...); return r }
func (r *raw) zeros(n int) *raw  { r.b = append(r.b, make([]byte, n)...); return r }

// padTo appends zeros up to a multiple of align.
func (r *raw) padTo(align int) *raw {
	for len(r.b)%align != 0 {
		r.b = append(r.b, 0)
	}
	return r
}

func header(nt, nkv uint64) *raw {
	return (&raw{}).u32(magic).u32(3).u64(nt).u64(nkv)
}

// tensor appends a tensor info.
func (r *raw) tensor(name string, typ TensorType, offset uint64, dims ...uint64) *raw {
	r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r.u64(d)
	}
	return r.u32(uint32(typ)).u64(offset)
}

// sampleWriter returns a Writer holding every metadata value type, nested
// and empty arrays, and one tensor of every known tensor type.
func sampleWriter(t testing.TB) *Writer {
	w := NewWriter()
	w.Set("general.architecture", "llama")
	w.Set("u8", uint8(200))
	w.Set("i8", int8(-100))
	w.Set("u16", uint16(60000))
	w.Set("i16", int16(-30000))
	w.Set("u32", uint32(4000000000))
	w.Set("i32", int32(-2000000000))
	w.Set("u64", uint64(1)<<63+5)
	w.Set("i64", int64(-1)<<62)
	w.Set("f32", float32(3.25))
	w.Set("f64", -1e300)
	w.Set("bool.t", true)
	w.Set("bool.f", false)
	w.Set("str", "héllo\x00world")
	w.Set("str.empty", "")
	w.Set("a.u8", []uint8{0, 1, 255})
	w.Set("a.i8", []int8{-128, 0, 127})
	w.Set("a.u16", []uint16{0, 65535})
	w.Set("a.i16", []int16{-32768, 32767})
	w.Set("a.u32", []uint32{0, math.MaxUint32})
	w.Set("a.i32", []int32{math.MinInt32, -1, math.MaxInt32})
	w.Set("a.u64", []uint64{0, math.MaxUint64})
	w.Set("a.i64", []int64{math.MinInt64, math.MaxInt64})
	w.Set("a.f32", []float32{0, -1.5, float32(math.Inf(1)), math.SmallestNonzeroFloat32})
	w.Set("a.f64", []float64{math.MaxFloat64, -0.5})
	w.Set("a.bool", []bool{true, false, true})
	w.Set("a.str", []string{"a", "", "ü€😀"})
	w.Set("a.empty", []float32{})
	w.Set("a.nested", []any{[]int32{1, 2}, []string{"x"}, []any{[]bool{true}, []any{}}})
	w.Set("a.nested.empty", []any{})
	for i, typ := range knownTypes() {
		dims := []uint64{uint64(2 * typ.BlockSize()), uint64(i%3 + 1)}
		n, err := typ.RowBytes(int(dims[0] * dims[1]))
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, n)
		for j := range data {
			data[j] = byte(j*7 + i)
		}
		if err := w.AddTensor("t."+typ.String(), typ, dims, data); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func knownTypes() []TensorType {
	var out []TensorType
	for i := range typeTable {
		if TensorType(i).Known() {
			out = append(out, TensorType(i))
		}
	}
	return out
}

func encode(t testing.TB, w *Writer) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo returned %d, wrote %d bytes", n, buf.Len())
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	for _, align := range []uint32{0, 8, 64, 4096} {
		w := sampleWriter(t)
		if align != 0 {
			w.Set("general.alignment", align)
		}
		data := encode(t, w)
		f, err := Parse(data)
		if err != nil {
			t.Fatalf("align %d: %v", align, err)
		}
		wantAlign := uint64(align)
		if align == 0 {
			wantAlign = DefaultAlignment
		}
		if f.Version != 3 || f.Alignment != wantAlign {
			t.Errorf("version %d alignment %d, want 3 %d", f.Version, f.Alignment, wantAlign)
		}
		if !reflect.DeepEqual(f.KV, w.KV()) {
			t.Errorf("align %d: metadata differs:\n got %#v\nwant %#v", align, f.KV, w.KV())
		}
		want := w.Tensors()
		if len(f.Tensors) != len(want) {
			t.Fatalf("%d tensors, want %d", len(f.Tensors), len(want))
		}
		for i, got := range f.Tensors {
			if got.Name != want[i].Name || got.Type != want[i].Type || !reflect.DeepEqual(got.Dims, want[i].Dims) ||
				got.Offset != want[i].Offset || !bytes.Equal(got.Data, want[i].Data) {
				t.Errorf("tensor %d: got %s %s %v @%d, want %s %s %v @%d (or data differs)", i,
					got.Name, got.Type, got.Dims, got.Offset, want[i].Name, want[i].Type, want[i].Dims, want[i].Offset)
			}
			if got.Offset%wantAlign != 0 {
				t.Errorf("tensor %s offset %d not aligned to %d", got.Name, got.Offset, wantAlign)
			}
			// The data must sit at an aligned position of the file itself.
			if start := uintptrOffset(data, got.Data); start%wantAlign != 0 {
				t.Errorf("tensor %s data at file byte %d, not aligned to %d", got.Name, start, wantAlign)
			}
		}
		if len(data)%int(wantAlign) != 0 {
			t.Errorf("file of %d bytes does not end padded to %d", len(data), wantAlign)
		}
		// Writing the parsed file again gives the same bytes.
		again := NewWriter()
		for _, kv := range f.KV {
			again.Set(kv.Key, kv.Value)
		}
		for _, ti := range f.Tensors {
			if err := again.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(encode(t, again), data) {
			t.Errorf("align %d: rewriting the parsed file changed its bytes", align)
		}
	}
}

// uintptrOffset returns the position of sub within file (sub aliases file).
func uintptrOffset(file, sub []byte) uint64 {
	for i := range file {
		if &file[i] == &sub[0] {
			return uint64(i)
		}
	}
	panic("slice does not alias the file")
}

func TestOpenMapsAndClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	w := sampleWriter(t)
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	want := w.Tensors()
	for i, ti := range f.Tensors {
		if !bytes.Equal(ti.Data, want[i].Data) {
			t.Fatalf("tensor %s: mapped bytes differ", ti.Name)
		}
	}
	if !reflect.DeepEqual(f.KV, w.KV()) {
		t.Error("metadata differs after Open")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Tensors[0].Data != nil {
		t.Error("Data still set after Close")
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.gguf")); err == nil {
		t.Error("Open of a missing file succeeded")
	}
}

func TestWriterLayoutMatchesLlamaCpp(t *testing.T) {
	// llama.cpp requires tensor i's offset to equal the sum of the padded
	// sizes of tensors 0..i-1.
	w := NewWriter()
	w.Set("general.architecture", "x")
	must(t, w.AddTensor("a", TypeF32, []uint64{3}, make([]byte, 12)))
	must(t, w.AddTensor("b", TypeQ8_0, []uint64{32, 2}, make([]byte, 68)))
	must(t, w.AddTensor("c", TypeF16, []uint64{1}, make([]byte, 2)))
	f, err := Parse(encode(t, w))
	if err != nil {
		t.Fatal(err)
	}
	var offs []uint64
	for _, ti := range f.Tensors {
		offs = append(offs, ti.Offset)
	}
	if want := []uint64{0, 32, 128}; !reflect.DeepEqual(offs, want) {
		t.Errorf("offsets %v, want %v", offs, want)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestWriterRejects(t *testing.T) {
	w := NewWriter()
	must(t, w.AddTensor("x", TypeF32, []uint64{2}, make([]byte, 8)))
	cases := []struct {
		name string
		typ  TensorType
		dims []uint64
		n    int
		want string
	}{
		{"x", TypeF32, []uint64{2}, 8, "duplicate tensor name"},
		{"", TypeF32, []uint64{2}, 8, "empty tensor name"},
		{strings.Repeat("n", 64), TypeF32, []uint64{2}, 8, "longer than 63"},
		{"y", TypeF32, []uint64{2}, 7, "7 bytes of data, want 8"},
		{"y", TypeQ8_0, []uint64{16}, 17, "not a multiple of the Q8_0 block size 32"},
		{"y", TensorType(4), []uint64{2}, 8, "unknown tensor type 4"},
		{"y", TypeF32, []uint64{2, 0}, 0, "dimension 1 is zero"},
		{"y", TypeF32, []uint64{1, 1, 1, 1, 1}, 4, "5 dimensions"},
		{"y", TypeF32, nil, 4, "0 dimensions"},
		{"y", TypeF32, []uint64{1 << 32, 1 << 32}, 4, "overflow"},
	}
	for _, c := range cases {
		err := w.AddTensor(c.name, c.typ, c.dims, make([]byte, c.n))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("AddTensor(%q, %s, %v): %v, want error containing %q", c.name, c.typ, c.dims, err, c.want)
		}
	}
	for _, v := range []any{7, []int{1}, map[string]int{}, []any{1}, uint(3), nil} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Set(%T) did not panic", v)
				}
			}()
			w.Set("k", v)
		}()
	}
	for _, v := range []any{uint32(0), uint32(48), uint64(32)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Set(general.alignment, %T %v) did not panic", v, v)
				}
			}()
			w.Set("general.alignment", v)
		}()
	}
}

func TestWriterProducer(t *testing.T) {
	w := NewWriter()
	must(t, w.AddTensorFunc("p", TypeF32, []uint64{4}, func(out io.Writer) error {
		_, err := out.Write(bytes.Repeat([]byte{1}, 16))
		return err
	}))
	f, err := Parse(encode(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.Tensors[0].Data, bytes.Repeat([]byte{1}, 16)) {
		t.Error("produced tensor bytes differ")
	}
	short := NewWriter()
	must(t, short.AddTensorFunc("p", TypeF32, []uint64{4}, func(out io.Writer) error {
		_, err := out.Write(make([]byte, 15))
		return err
	}))
	if _, err := short.WriteTo(io.Discard); err == nil || !strings.Contains(err.Error(), `tensor "p" produced 15 bytes, want 16`) {
		t.Errorf("short producer: %v", err)
	}
}

func TestSetReplacesInPlace(t *testing.T) {
	w := NewWriter()
	w.Set("a", uint32(1))
	w.Set("b", "x")
	w.Set("a", "y")
	want := []KV{{"a", "y"}, {"b", "x"}}
	if !reflect.DeepEqual(w.KV(), want) {
		t.Errorf("KV %v, want %v", w.KV(), want)
	}
}
