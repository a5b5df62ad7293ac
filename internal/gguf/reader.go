package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
)

// magic is "GGUF" read as a little-endian uint32.
const magic = 0x46554747

// Bounds on the header counts. The real bound is the bytes left in the file
// (checked too); these keep a large hostile file from costing gigabytes of
// bookkeeping. Real models have a few thousand tensors and a few dozen keys.
const (
	maxTensors = 1 << 20
	maxKVs     = 1 << 20
)

// Minimum encoded sizes, used to bound counts by the bytes left before
// anything is allocated.
const (
	minKVBytes     = 8 + 4 + 1         // key length, value type, smallest value
	minTensorBytes = 8 + 4 + 8 + 4 + 8 // name length, n_dims, one dim, type, offset
)

// ErrMissingKey is wrapped by the typed getters when the key is absent.
var ErrMissingKey = errors.New("missing key")

// FormatError reports a malformed GGUF file: what is wrong and at which
// byte offset it was found.
type FormatError struct {
	Offset int64  // byte offset in the file where the problem was found
	What   string // what is wrong, naming the key or tensor involved
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("gguf: malformed file at byte %d: %s", e.Offset, e.What)
}

// KV is one metadata entry.
//
// Value holds uint8 int8 uint16 int16 uint32 int32 uint64 int64 float32
// float64 bool or string; arrays are the typed slices []uint8 ... []float64,
// []bool and []string; an array of arrays is []any whose elements are
// arrays.
type KV struct {
	Key   string
	Value any
}

// TensorInfo describes one tensor.
type TensorInfo struct {
	Name string
	// Dims is GGUF's "ne": Dims[0] is the contiguous (innermost)
	// dimension, so a PyTorch [out, in] matrix has Dims = [in, out].
	Dims []uint64
	Type TensorType
	// Offset is relative to the start of the tensor data section.
	Offset uint64
	// Data is the tensor's bytes. It aliases the bytes given to Parse or the
	// mapping made by Open: it MUST NOT be modified (a mapping is
	// read-only; writing faults) and is invalid after Close.
	Data []byte
}

// Elements returns the number of elements of the tensor.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is a parsed GGUF file. Its fields describe the file as read; the
// slices and metadata values it returns MUST NOT be modified. A File is
// safe for concurrent reads; Close must not race with them.
type File struct {
	Version   uint32
	Alignment uint64
	KV        []KV
	Tensors   []TensorInfo // in file order

	kvIndex     map[string]int
	tensorIndex map[string]int
	unmap       func() error // nil unless Open mapped the file
}

// parser reads little-endian fields from b, tracking the offset for errors.
type parser struct {
	b   []byte
	off int
}

func (p *parser) fail(format string, args ...any) error {
	return &FormatError{Offset: int64(p.off), What: fmt.Sprintf(format, args...)}
}

func (p *parser) left() int { return len(p.b) - p.off }

func (p *parser) take(n int, what string) ([]byte, error) {
	if n < 0 || n > p.left() {
		return nil, p.fail("truncated: %s needs %d bytes, %d left", what, n, p.left())
	}
	s := p.b[p.off : p.off+n]
	p.off += n
	return s, nil
}

func (p *parser) u8(what string) (uint8, error) {
	s, err := p.take(1, what)
	if err != nil {
		return 0, err
	}
	return s[0], nil
}

func (p *parser) u16(what string) (uint16, error) {
	s, err := p.take(2, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(s), nil
}

func (p *parser) u32(what string) (uint32, error) {
	s, err := p.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(s), nil
}

func (p *parser) u64(what string) (uint64, error) {
	s, err := p.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(s), nil
}

// count reads a uint64 element count and checks that count elements of at
// least minSize bytes each fit in what is left, and that count <= limit.
func (p *parser) count(what string, minSize int, limit uint64) (int, error) {
	at := p.off
	n, err := p.u64(what)
	if err != nil {
		return 0, err
	}
	if n > limit {
		p.off = at
		return 0, p.fail("%s %d exceeds the limit of %d", what, n, limit)
	}
	if left := p.left(); n > uint64(left/minSize) {
		p.off = at
		return 0, p.fail("%s %d cannot fit in the %d bytes left", what, n, left)
	}
	return int(n), nil
}

func (p *parser) str(what string) (string, error) {
	s, err := p.strBytes(what)
	return string(s), err
}

// strBytes reads a length-prefixed string without copying it.
func (p *parser) strBytes(what string) ([]byte, error) {
	at := p.off
	if p.left() < 8 {
		return nil, p.fail("truncated: %s length needs 8 bytes, %d left", what, p.left())
	}
	n := binary.LittleEndian.Uint64(p.b[p.off:])
	p.off += 8
	if left := p.left(); n > uint64(left) {
		p.off = at
		return nil, p.fail("%s length %d exceeds the %d bytes left", what, n, left)
	}
	return p.take(int(n), what)
}

func (p *parser) value(vt uint32, depth int) (any, error) {
	switch vt {
	case vtUint8:
		return p.u8("uint8 value")
	case vtInt8:
		v, err := p.u8("int8 value")
		return int8(v), err
	case vtUint16:
		return p.u16("uint16 value")
	case vtInt16:
		v, err := p.u16("int16 value")
		return int16(v), err
	case vtUint32:
		return p.u32("uint32 value")
	case vtInt32:
		v, err := p.u32("int32 value")
		return int32(v), err
	case vtFloat32:
		v, err := p.u32("float32 value")
		return math.Float32frombits(v), err
	case vtBool:
		return p.boolean()
	case vtString:
		return p.str("string")
	case vtUint64:
		return p.u64("uint64 value")
	case vtInt64:
		v, err := p.u64("int64 value")
		return int64(v), err
	case vtFloat64:
		v, err := p.u64("float64 value")
		return math.Float64frombits(v), err
	case vtArray:
		return p.array(depth)
	}
	return nil, p.fail("unknown value type %d", vt)
}

func (p *parser) boolean() (bool, error) {
	v, err := p.u8("bool value")
	if err != nil {
		return false, err
	}
	if v > 1 {
		p.off--
		return false, p.fail("bool value %d is neither 0 nor 1", v)
	}
	return v == 1, nil
}

func (p *parser) array(depth int) (any, error) {
	if depth >= maxArrayDepth {
		return nil, p.fail("arrays nested deeper than %d", maxArrayDepth)
	}
	at := p.off
	et, err := p.u32("array element type")
	if err != nil {
		return nil, err
	}
	minSize := scalarSize(et)
	switch et {
	case vtString:
		minSize = 8
	case vtArray:
		minSize = 4 + 8
	}
	if minSize == 0 {
		p.off = at
		return nil, p.fail("unknown array element type %d", et)
	}
	n, err := p.count("array length", minSize, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	// Fixed-size elements: the whole array was bounds-checked by count.
	raw := func(size int) []byte {
		s := p.b[p.off : p.off+n*size]
		p.off += n * size
		return s
	}
	le := binary.LittleEndian
	switch et {
	case vtUint8:
		return append([]uint8{}, raw(1)...), nil
	case vtInt8:
		s, out := raw(1), make([]int8, n)
		for i := range out {
			out[i] = int8(s[i])
		}
		return out, nil
	case vtUint16:
		s, out := raw(2), make([]uint16, n)
		for i := range out {
			out[i] = le.Uint16(s[2*i:])
		}
		return out, nil
	case vtInt16:
		s, out := raw(2), make([]int16, n)
		for i := range out {
			out[i] = int16(le.Uint16(s[2*i:]))
		}
		return out, nil
	case vtUint32:
		s, out := raw(4), make([]uint32, n)
		for i := range out {
			out[i] = le.Uint32(s[4*i:])
		}
		return out, nil
	case vtInt32:
		s, out := raw(4), make([]int32, n)
		for i := range out {
			out[i] = int32(le.Uint32(s[4*i:]))
		}
		return out, nil
	case vtFloat32:
		s, out := raw(4), make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(s[4*i:]))
		}
		return out, nil
	case vtUint64:
		s, out := raw(8), make([]uint64, n)
		for i := range out {
			out[i] = le.Uint64(s[8*i:])
		}
		return out, nil
	case vtInt64:
		s, out := raw(8), make([]int64, n)
		for i := range out {
			out[i] = int64(le.Uint64(s[8*i:]))
		}
		return out, nil
	case vtFloat64:
		s, out := raw(8), make([]float64, n)
		for i := range out {
			out[i] = math.Float64frombits(le.Uint64(s[8*i:]))
		}
		return out, nil
	case vtBool:
		out := make([]bool, n)
		for i := range out {
			b, err := p.boolean()
			if err != nil {
				return nil, err
			}
			out[i] = b
		}
		return out, nil
	case vtString:
		// One copy of the whole array region; the elements are substrings
		// of it, so a 150k-token vocabulary costs two allocations, not 150k.
		start := p.off
		for range n {
			if _, err := p.strBytes("array element"); err != nil {
				return nil, err
			}
		}
		blob := string(p.b[start:p.off])
		out := make([]string, n)
		at := 0
		for i := range out {
			l := int(binary.LittleEndian.Uint64(p.b[start+at:]))
			out[i] = blob[at+8 : at+8+l]
			at += 8 + l
		}
		return out, nil
	default: // vtArray
		out := make([]any, n)
		for i := range out {
			v, err := p.array(depth + 1)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
}

// Parse parses a GGUF file held in data. The returned File's tensor Data
// slices alias data, which must outlive the File and must not change.
func Parse(data []byte) (*File, error) {
	p := &parser{b: data}
	m, err := p.u32("magic")
	if err != nil {
		return nil, err
	}
	if m != magic {
		p.off = 0
		return nil, p.fail("bad magic %q, want \"GGUF\"", data[:4])
	}
	f := &File{}
	if f.Version, err = p.u32("version"); err != nil {
		return nil, err
	}
	if f.Version != 2 && f.Version != 3 {
		p.off -= 4
		if sw := bits.ReverseBytes32(f.Version); sw == 2 || sw == 3 {
			return nil, p.fail("version %d reads byte-swapped: big-endian files are not supported", sw)
		}
		return nil, p.fail("unsupported version %d (supported: 2, 3)", f.Version)
	}
	// Both counts are read before either is checked against the bytes left,
	// so a count is bounded by the remainder after the header.
	tensorAt := p.off
	nt, err := p.u64("tensor count")
	if err != nil {
		return nil, err
	}
	kvAt := p.off
	nkv, err := p.u64("metadata count")
	if err != nil {
		return nil, err
	}
	switch {
	case nt > maxTensors:
		p.off = tensorAt
		return nil, p.fail("tensor count %d exceeds the limit of %d", nt, maxTensors)
	case nkv > maxKVs:
		p.off = kvAt
		return nil, p.fail("metadata count %d exceeds the limit of %d", nkv, maxKVs)
	case nkv > uint64(p.left()/minKVBytes):
		left := p.left()
		p.off = kvAt
		return nil, p.fail("metadata count %d cannot fit in the %d bytes left", nkv, left)
	case nt > uint64(p.left()/minTensorBytes):
		left := p.left()
		p.off = tensorAt
		return nil, p.fail("tensor count %d cannot fit in the %d bytes left", nt, left)
	}

	f.KV = make([]KV, 0, nkv)
	f.kvIndex = make(map[string]int, nkv)
	for range int(nkv) {
		at := p.off
		key, err := p.str("metadata key")
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[key]; dup {
			p.off = at
			return nil, p.fail("duplicate metadata key %s", quote(key))
		}
		vt, err := p.u32("value type")
		if err != nil {
			return nil, err
		}
		v, err := p.value(vt, 0)
		if err != nil {
			var fe *FormatError
			if errors.As(err, &fe) {
				fe.What = fmt.Sprintf("metadata key %s: %s", quote(key), fe.What)
			}
			return nil, err
		}
		f.kvIndex[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}

	f.Alignment = DefaultAlignment
	if v, ok := f.Get("general.alignment"); ok {
		a, isU32 := v.(uint32)
		switch {
		case !isU32:
			return nil, p.fail("general.alignment has type %s, want uint32", goTypeName(v))
		case a == 0 || a&(a-1) != 0:
			return nil, p.fail("general.alignment %d is not a power of two", a)
		}
		f.Alignment = uint64(a)
	}

	f.Tensors = make([]TensorInfo, nt)
	f.tensorIndex = make(map[string]int, nt)
	sizes := make([]uint64, nt)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		at := p.off
		name, err := p.str(fmt.Sprintf("tensor %d name", i))
		if err != nil {
			return nil, err
		}
		if len(name) > MaxTensorName {
			p.off = at
			return nil, p.fail("tensor %d name is %d bytes, longer than %d", i, len(name), MaxTensorName)
		}
		if _, dup := f.tensorIndex[name]; dup {
			p.off = at
			return nil, p.fail("duplicate tensor name %q", name)
		}
		t.Name = name
		nd, err := p.u32(fmt.Sprintf("tensor %q dimension count", name))
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > MaxDims {
			p.off -= 4
			return nil, p.fail("tensor %q has %d dimensions, want 1 to %d", name, nd, MaxDims)
		}
		t.Dims = make([]uint64, nd)
		for j := range t.Dims {
			if t.Dims[j], err = p.u64(fmt.Sprintf("tensor %q dimension %d", name, j)); err != nil {
				return nil, err
			}
		}
		typ, err := p.u32(fmt.Sprintf("tensor %q type", name))
		if err != nil {
			return nil, err
		}
		t.Type = TensorType(typ)
		if t.Offset, err = p.u64(fmt.Sprintf("tensor %q offset", name)); err != nil {
			return nil, err
		}
		if sizes[i], err = tensorBytes(t.Type, t.Dims); err != nil {
			p.off = at
			return nil, p.fail("tensor %q: %v", name, err)
		}
		if t.Offset%f.Alignment != 0 {
			p.off = at
			return nil, p.fail("tensor %q offset %d is not a multiple of the alignment %d", name, t.Offset, f.Alignment)
		}
		f.tensorIndex[name] = i
	}

	if nt == 0 {
		return f, nil
	}
	// The data section starts at the next multiple of the alignment.
	start := (uint64(p.off) + f.Alignment - 1) / f.Alignment * f.Alignment
	if start > uint64(len(data)) {
		return nil, p.fail("truncated: tensor data section starts at byte %d past the end of the %d-byte file", start, len(data))
	}
	avail := uint64(len(data)) - start
	p.off = int(start)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Offset > avail || sizes[i] > avail-t.Offset {
			return nil, p.fail("tensor %q data [%d, +%d) runs past the end of the %d-byte data section", t.Name, t.Offset, sizes[i], avail)
		}
		lo := start + t.Offset
		hi := lo + sizes[i]
		t.Data = data[lo:hi:hi]
	}
	// No two tensors may share bytes.
	order := make([]int, nt)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return f.Tensors[order[a]].Offset < f.Tensors[order[b]].Offset })
	for k := 1; k < len(order); k++ {
		prev, cur := order[k-1], order[k]
		if f.Tensors[prev].Offset+sizes[prev] > f.Tensors[cur].Offset {
			return nil, p.fail("tensors %q and %q overlap in the data section", f.Tensors[prev].Name, f.Tensors[cur].Name)
		}
	}
	return f, nil
}

// Close releases the file mapping made by Open. After Close every
// TensorInfo.Data of f is nil and slices taken from them earlier are
// invalid. Close is idempotent; it is a no-op for a File from Parse.
func (f *File) Close() error {
	for i := range f.Tensors {
		f.Tensors[i].Data = nil
	}
	if f.unmap == nil {
		return nil
	}
	err := f.unmap()
	f.unmap = nil
	return err
}

// Get returns the value of a metadata key.
func (f *File) Get(key string) (any, bool) {
	if f.kvIndex != nil {
		i, ok := f.kvIndex[key]
		if !ok {
			return nil, false
		}
		return f.KV[i].Value, true
	}
	for _, kv := range f.KV {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// Tensor returns the tensor named name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	if f.tensorIndex != nil {
		i, ok := f.tensorIndex[name]
		if !ok {
			return nil, false
		}
		return &f.Tensors[i], true
	}
	for i := range f.Tensors {
		if f.Tensors[i].Name == name {
			return &f.Tensors[i], true
		}
	}
	return nil, false
}

func (f *File) lookup(key string) (any, error) {
	v, ok := f.Get(key)
	if !ok {
		return nil, fmt.Errorf("gguf: key %q: %w", key, ErrMissingKey)
	}
	return v, nil
}

func wrongType(key string, v any, want string) error {
	return fmt.Errorf("gguf: key %q has type %s, want %s", key, goTypeName(v), want)
}

// String returns a string value.
func (f *File) String(key string) (string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", wrongType(key, v, "string")
	}
	return s, nil
}

// Uint returns a value of any integer type that holds a non-negative value.
func (f *File) Uint(key string) (uint64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	if u, ok := v.(uint64); ok {
		return u, nil
	}
	n, _, ok := asInt64(v)
	if !ok {
		return 0, wrongType(key, v, "an unsigned integer")
	}
	if n < 0 {
		return 0, fmt.Errorf("gguf: key %q holds negative value %d, want an unsigned integer", key, n)
	}
	return uint64(n), nil
}

// Int returns a value of any integer type that fits an int64.
func (f *File) Int(key string) (int64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	n, big, ok := asInt64(v)
	switch {
	case !ok:
		return 0, wrongType(key, v, "an integer")
	case big:
		return 0, fmt.Errorf("gguf: key %q holds %d, which overflows int64", key, v)
	}
	return n, nil
}

// Float returns a float32, float64 or integer value as a float64.
func (f *File) Float(key string) (float64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case uint64:
		return float64(x), nil
	}
	n, _, ok := asInt64(v)
	if !ok {
		return 0, wrongType(key, v, "a number")
	}
	return float64(n), nil
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, error) {
	v, err := f.lookup(key)
	if err != nil {
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, wrongType(key, v, "bool")
	}
	return b, nil
}

// Strings returns a string array. The slice is the File's own: it MUST NOT
// be modified.
func (f *File) Strings(key string) ([]string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	s, ok := v.([]string)
	if !ok {
		return nil, wrongType(key, v, "[]string")
	}
	return s, nil
}

// Float32s returns a float32 array (a float64 array is converted). A
// float32 slice is the File's own: it MUST NOT be modified.
func (f *File) Float32s(key string) ([]float32, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case []float32:
		return x, nil
	case []float64:
		out := make([]float32, len(x))
		for i, e := range x {
			out[i] = float32(e)
		}
		return out, nil
	}
	return nil, wrongType(key, v, "[]float32")
}

// Int32s returns an array of any integer type as int32s, failing if an
// element does not fit. An int32 slice is the File's own: it MUST NOT be
// modified.
func (f *File) Int32s(key string) ([]int32, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	if x, ok := v.([]int32); ok {
		return x, nil
	}
	var out []int32
	conv := func(n int, at func(int) (int64, bool)) error {
		out = make([]int32, n)
		for i := range out {
			e, ok := at(i)
			if !ok || e < math.MinInt32 || e > math.MaxInt32 {
				return fmt.Errorf("gguf: key %q element %d does not fit an int32", key, i)
			}
			out[i] = int32(e)
		}
		return nil
	}
	switch x := v.(type) {
	case []uint8:
		err = conv(len(x), func(i int) (int64, bool) { return int64(x[i]), true })
	case []int8:
		err = conv(len(x), func(i int) (int64, bool) { return int64(x[i]), true })
	case []uint16:
		err = conv(len(x), func(i int) (int64, bool) { return int64(x[i]), true })
	case []int16:
		err = conv(len(x), func(i int) (int64, bool) { return int64(x[i]), true })
	case []uint32:
		err = conv(len(x), func(i int) (int64, bool) { return int64(x[i]), true })
	case []uint64:
		err = conv(len(x), func(i int) (int64, bool) { return int64(x[i]), x[i] <= math.MaxInt64 })
	case []int64:
		err = conv(len(x), func(i int) (int64, bool) { return x[i], true })
	default:
		return nil, wrongType(key, v, "an integer array")
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// quote quotes a key for an error message, cutting it short: keys come from
// the file and may be as long as the file.
func quote(s string) string {
	const limit = 80
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}
