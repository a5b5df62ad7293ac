package gguf

import (
	"bytes"
	"testing"
)

// FuzzParse checks that Parse never panics and that whatever it accepts
// survives a write and a second parse unchanged.
func FuzzParse(f *testing.F) {
	small := NewWriter()
	small.Set("general.architecture", "qwen3")
	small.Set("a", []any{[]string{"x", "yz"}, []int16{-1}})
	small.Set("b", []bool{true})
	small.Set("f", float32(1.5))
	must(f, small.AddTensor("w", TypeQ8_0, []uint64{32, 2}, make([]byte, 68)))
	must(f, small.AddTensor("n", TypeF32, []uint64{2}, []byte{0, 0, 128, 63, 0, 0, 0, 64}))
	seeds := [][]byte{encode(f, small), encode(f, sampleWriter(f)), encode(f, NewWriter())}
	for _, s := range seeds {
		f.Add(s)
		for _, n := range []int{0, 3, 4, 8, 16, 24, 30, len(s) / 3, len(s) / 2, len(s) - 1} {
			if n >= 0 && n < len(s) {
				f.Add(s[:n])
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		w := NewWriter()
		for _, kv := range file.KV {
			w.Set(kv.Key, kv.Value)
		}
		for _, ti := range file.Tensors {
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
				t.Fatalf("a parsed tensor is not writable: %v", err)
			}
		}
		var b1 bytes.Buffer
		if _, err := w.WriteTo(&b1); err != nil {
			t.Fatal(err)
		}
		again, err := Parse(b1.Bytes())
		if err != nil {
			t.Fatalf("the writer's output does not parse: %v", err)
		}
		if len(again.KV) != len(file.KV) || len(again.Tensors) != len(file.Tensors) {
			t.Fatalf("counts changed: %d/%d keys, %d/%d tensors", len(again.KV), len(file.KV), len(again.Tensors), len(file.Tensors))
		}
		for i := range file.Tensors {
			if !bytes.Equal(again.Tensors[i].Data, file.Tensors[i].Data) {
				t.Fatalf("tensor %d bytes changed", i)
			}
		}
		w2 := NewWriter()
		for _, kv := range again.KV {
			w2.Set(kv.Key, kv.Value)
		}
		for _, ti := range again.Tensors {
			must(t, w2.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data))
		}
		var b2 bytes.Buffer
		if _, err := w2.WriteTo(&b2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1.Bytes(), b2.Bytes()) {
			t.Fatal("write -> parse -> write is not stable")
		}
	})
}
