package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Writer assembles a GGUF version 3 file: metadata in insertion order, then
// tensor infos, then tensor data packed in the order added, each tensor
// padded to the alignment (32 unless general.alignment says otherwise), the
// layout llama.cpp requires of the files it loads.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	kv      []KV
	kvIndex map[string]int
	tensors []writerTensor
	names   map[string]bool
}

type writerTensor struct {
	info TensorInfo
	size uint64
	// Exactly one of data and produce is set.
	data    []byte
	produce func(io.Writer) error
}

// NewWriter returns an empty Writer for a GGUF version 3 file.
func NewWriter() *Writer {
	return &Writer{kvIndex: map[string]int{}, names: map[string]bool{}}
}

// Set sets metadata key to value, replacing an earlier value of the key in
// place (insertion order is kept). value must be one of the types KV
// documents; general.alignment must be a uint32 power of two. Anything else
// is a programmer error and panics.
func (w *Writer) Set(key string, value any) {
	if why := checkValue(value, 0); why != "" {
		panic(fmt.Sprintf("gguf: Set(%q): %s", key, why))
	}
	if key == "general.alignment" {
		a, ok := value.(uint32)
		if !ok || a == 0 || a&(a-1) != 0 {
			panic(fmt.Sprintf("gguf: Set(general.alignment): %v (%T) is not a uint32 power of two", value, value))
		}
	}
	if i, ok := w.kvIndex[key]; ok {
		w.kv[i].Value = value
		return
	}
	w.kvIndex[key] = len(w.kv)
	w.kv = append(w.kv, KV{Key: key, Value: value})
}

// KV returns the metadata set so far, in order. The slice MUST NOT be
// modified.
func (w *Writer) KV() []KV { return w.kv }

// Tensors returns the tensors added so far, in order, with their Offset
// fields as they will be written and Data nil for tensors added with
// AddTensorFunc.
func (w *Writer) Tensors() []TensorInfo {
	out := make([]TensorInfo, len(w.tensors))
	off := uint64(0)
	align := w.alignment()
	for i, t := range w.tensors {
		out[i] = t.info
		out[i].Dims = append([]uint64(nil), t.info.Dims...)
		out[i].Offset = off
		out[i].Data = t.data
		off += pad(t.size, align)
	}
	return out
}

func (w *Writer) check(name string, typ TensorType, dims []uint64) (uint64, error) {
	switch {
	case name == "":
		return 0, errors.New("gguf: AddTensor: empty tensor name")
	case len(name) > MaxTensorName:
		return 0, fmt.Errorf("gguf: AddTensor %q: name is %d bytes, longer than %d", name, len(name), MaxTensorName)
	case w.names[name]:
		return 0, fmt.Errorf("gguf: AddTensor %q: duplicate tensor name", name)
	}
	size, err := tensorBytes(typ, dims)
	if err != nil {
		return 0, fmt.Errorf("gguf: AddTensor %q: %v", name, err)
	}
	return size, nil
}

// AddTensor appends a tensor. len(data) must be the size of dims elements
// of typ. The Writer keeps data (no copy): it MUST NOT change until the last
// WriteTo returns.
func (w *Writer) AddTensor(name string, typ TensorType, dims []uint64, data []byte) error {
	size, err := w.check(name, typ, dims)
	if err != nil {
		return err
	}
	if uint64(len(data)) != size {
		return fmt.Errorf("gguf: AddTensor %q: %d bytes of data, want %d for %s %v", name, len(data), size, typ, dims)
	}
	w.add(name, typ, dims, size, data, nil)
	return nil
}

// AddTensorFunc appends a tensor whose bytes produce writes when the file
// is written, so a large file never has to be held in memory. produce is
// called once per WriteTo and MUST write exactly the tensor's size in bytes
// (WriteTo fails otherwise); it MUST be deterministic if the output is to
// be.
func (w *Writer) AddTensorFunc(name string, typ TensorType, dims []uint64, produce func(io.Writer) error) error {
	size, err := w.check(name, typ, dims)
	if err != nil {
		return err
	}
	w.add(name, typ, dims, size, nil, produce)
	return nil
}

func (w *Writer) add(name string, typ TensorType, dims []uint64, size uint64, data []byte, produce func(io.Writer) error) {
	w.names[name] = true
	w.tensors = append(w.tensors, writerTensor{
		info:    TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: typ},
		size:    size,
		data:    data,
		produce: produce,
	})
}

func (w *Writer) alignment() uint64 {
	if i, ok := w.kvIndex["general.alignment"]; ok {
		return uint64(w.kv[i].Value.(uint32))
	}
	return DefaultAlignment
}

func pad(n, align uint64) uint64 { return (n + align - 1) / align * align }

// countWriter counts and forwards bytes, remembering the first error.
type countWriter struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

func (c *countWriter) u32(v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	c.Write(b[:])
}

func (c *countWriter) u64(v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	c.Write(b[:])
}

func (c *countWriter) str(s string) {
	c.u64(uint64(len(s)))
	c.w.WriteString(s) // bufio errors are sticky; Flush reports them
	c.n += int64(len(s))
}

func (c *countWriter) zeros(n uint64) {
	var z [64]byte
	for n > 0 {
		k := min(n, uint64(len(z)))
		c.Write(z[:k])
		n -= k
	}
}

func (c *countWriter) value(v any) {
	le := binary.LittleEndian
	switch x := v.(type) {
	case uint8:
		c.Write([]byte{x})
	case int8:
		c.Write([]byte{byte(x)})
	case uint16:
		c.Write(le.AppendUint16(nil, x))
	case int16:
		c.Write(le.AppendUint16(nil, uint16(x)))
	case uint32:
		c.u32(x)
	case int32:
		c.u32(uint32(x))
	case float32:
		c.u32(math.Float32bits(x))
	case bool:
		if x {
			c.Write([]byte{1})
		} else {
			c.Write([]byte{0})
		}
	case string:
		c.str(x)
	case uint64:
		c.u64(x)
	case int64:
		c.u64(uint64(x))
	case float64:
		c.u64(math.Float64bits(x))
	default:
		c.array(v)
	}
}

// array writes an array value: element type, length, elements.
func (c *countWriter) array(v any) {
	_, et, _ := valueType(v)
	c.u32(et)
	switch x := v.(type) {
	case []uint8:
		c.u64(uint64(len(x)))
		c.Write(x)
	case []int8:
		writeElems(c, x)
	case []uint16:
		writeElems(c, x)
	case []int16:
		writeElems(c, x)
	case []uint32:
		writeElems(c, x)
	case []int32:
		writeElems(c, x)
	case []float32:
		writeElems(c, x)
	case []bool:
		writeElems(c, x)
	case []string:
		writeElems(c, x)
	case []uint64:
		writeElems(c, x)
	case []int64:
		writeElems(c, x)
	case []float64:
		writeElems(c, x)
	case []any:
		c.u64(uint64(len(x)))
		for _, e := range x {
			c.array(e)
		}
	}
}

func writeElems[T any](c *countWriter, xs []T) {
	c.u64(uint64(len(xs)))
	for _, e := range xs {
		c.value(e)
	}
}

// WriteTo writes the file to out.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	align := w.alignment()
	c := &countWriter{w: bufio.NewWriterSize(out, 1<<20)}
	c.u32(magic)
	c.u32(3)
	c.u64(uint64(len(w.tensors)))
	c.u64(uint64(len(w.kv)))
	for _, kv := range w.kv {
		c.str(kv.Key)
		vt, _, _ := valueType(kv.Value)
		c.u32(vt)
		c.value(kv.Value)
	}
	off := uint64(0)
	for _, t := range w.tensors {
		c.str(t.info.Name)
		c.u32(uint32(len(t.info.Dims)))
		for _, d := range t.info.Dims {
			c.u64(d)
		}
		c.u32(uint32(t.info.Type))
		c.u64(off)
		off += pad(t.size, align)
	}
	if len(w.tensors) > 0 {
		c.zeros(pad(uint64(c.n), align) - uint64(c.n))
	}
	for _, t := range w.tensors {
		before := c.n
		if t.produce != nil {
			if err := t.produce(c); err != nil {
				return c.n, fmt.Errorf("gguf: writing tensor %q: %w", t.info.Name, err)
			}
		} else {
			c.Write(t.data)
		}
		if got := uint64(c.n - before); c.err == nil && got != t.size {
			return c.n, fmt.Errorf("gguf: tensor %q produced %d bytes, want %d", t.info.Name, got, t.size)
		}
		c.zeros(pad(t.size, align) - t.size)
	}
	if c.err != nil {
		return c.n, c.err
	}
	return c.n, c.w.Flush()
}

// WriteFile writes the file to path atomically: into a temporary file in
// the same directory, synced, then renamed over path.
func (w *Writer) WriteFile(path string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = w.WriteTo(tmp); err != nil {
		return err
	}
	if err = tmp.Chmod(0o644); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
