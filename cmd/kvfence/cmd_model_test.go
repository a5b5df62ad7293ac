package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

func TestModelNewAndInspect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	var out bytes.Buffer
	err := runModel(context.Background(), []string{"new", "--arch", "qwen2", "--layers", "1", "--dim", "64",
		"--heads", "4", "--kv-heads", "2", "--ff", "96", "--type", "f16", "--seed", "3", "--tied", "-o", path}, &out, &out)
	if err != nil {
		t.Fatalf("model new: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "wrote "+path+": qwen2, 1 layers, dim 64, F16 weights") {
		t.Errorf("model new printed %q", out.String())
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Tensor("output.weight"); ok {
		t.Error("--tied model has output.weight")
	}
	if ti, _ := f.Tensor("blk.0.attn_q.bias"); ti == nil || ti.Dims[0] != 64 {
		t.Error("qwen2 model lacks its q bias")
	}
	f.Close()

	out.Reset()
	if err := runModel(context.Background(), []string{"inspect", "-kv", path}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"architecture:  qwen2",
		"shape:         1 layers, dim 64, heads 4, kv heads 2, head dim 16, ff 96",
		"(output tied to embedding: true)",
		`EOS 151645 "<|im_end|>"`,
		"chat template: present",
		"blk.0.attn_k.bias",
		"token_embd.weight         F16   64 x 151669",
		"qwen2.attention.head_count_kv (uint32) = 2",
		`tokenizer.ggml.tokens ([]string) = [151669 strings] "!"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestModelUsageErrors(t *testing.T) {
	cases := [][]string{
		{},
		{"frobnicate"},
		{"new", "--layers", "2"},        // no -o
		{"inspect"},                     // no file
		{"inspect", "a.gguf", "b.gguf"}, // two files
		{"new", "--bogus", "-o", "x"},
	}
	for _, args := range cases {
		var out bytes.Buffer
		if err := runModel(context.Background(), args, &out, &out); !errors.Is(err, errUsage) {
			t.Errorf("model %v: %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	err := runModel(context.Background(), []string{"new", "--type", "q5_k", "-o", filepath.Join(t.TempDir(), "x.gguf")}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), `unknown --type "q5_k"`) {
		t.Errorf("bad --type: %v", err)
	}
	err = runModel(context.Background(), []string{"inspect", filepath.Join(t.TempDir(), "none.gguf")}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("inspect of a missing file: %v", err)
	}
}
