package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

func writeTinyModel(t *testing.T) string {
	t.Helper()
	tok := tokenizer.Tiny()
	path := filepath.Join(t.TempDir(), "m.gguf")
	o := modelbuild.Options{Arch: "qwen3", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, FF: 128, Ctx: 256,
		Type: gguf.TypeQ8_0, Seed: 11, Tokenizer: tok}
	if err := modelbuild.Write(o, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// greedyReference generates n tokens with the model API directly: the whole
// prompt in one chunk, argmax, no stop tokens.
func greedyReference(t *testing.T, path, prompt string, n int) (text string, promptTokens int) {
	t.Helper()
	m, err := model.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids := m.Tok.Encode(prompt, tokenizer.EncodeOptions{AddSpecial: true})
	out, err := m.Greedy(ids, n, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m.Tok.Decode(out), len(ids)
}

var statsLine = regexp.MustCompile(`^prefill: (\d+) tokens, [0-9.]+ tok/s; decode: (\d+) tokens, [0-9.]+ tok/s\n$`)

func TestGenerateGreedyMatchesModel(t *testing.T) {
	path := writeTinyModel(t)
	const prompt = "The quick brown fox"
	want, nPrompt := greedyReference(t, path, prompt, 12)
	for _, args := range [][]string{
		{"--threads", "1", "--chunked-prefill-size", "2"},
		{"--threads", "2"},
	} {
		var stdout, stderr bytes.Buffer
		args = append([]string{"--model", path, "--prompt", prompt, "-n", "12", "--ignore-eos"}, args...)
		if err := runGenerate(context.Background(), args, &stdout, &stderr); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if stdout.String() != want+"\n" {
			t.Errorf("%v: printed %q, model greedy gives %q", args, stdout.String(), want)
		}
		mm := statsLine.FindStringSubmatch(stderr.String())
		if mm == nil {
			t.Fatalf("stderr %q is not the stats line", stderr.String())
		}
		if mm[1] != fmt.Sprint(nPrompt) || mm[2] != "11" {
			t.Errorf("stats %q: want %d prompt tokens and 11 decode steps", stderr.String(), nPrompt)
		}
	}
}

func TestGenerateSampledIsSeeded(t *testing.T) {
	path := writeTinyModel(t)
	run := func(seed int) string {
		var stdout, stderr bytes.Buffer
		err := runGenerate(context.Background(), []string{"--model", path, "--prompt", "hi", "--chat", "-n", "10",
			"--temperature", "1", "--seed", fmt.Sprint(seed), "--ignore-eos"}, &stdout, &stderr)
		if err != nil {
			t.Fatal(err)
		}
		return stdout.String()
	}
	a, b, c := run(1), run(1), run(2)
	if len(a) < 5 {
		t.Fatalf("sampled output %q is too short to tell seeds apart", a)
	}
	if a != b {
		t.Errorf("same seed, different output: %q vs %q", a, b)
	}
	if a == c {
		t.Errorf("seeds 1 and 2 both gave %q", a)
	}
}

func TestGenerateUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--prompt", "x"},
		{"--model", "m.gguf", "-n", "-1"},
		{"--model", "m.gguf", "--threads", "0"},
		{"--model", "m.gguf", "stray"},
	} {
		var out bytes.Buffer
		if err := runGenerate(context.Background(), args, &out, &out); !errors.Is(err, errUsage) {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	err := runGenerate(context.Background(), []string{"--model", filepath.Join(t.TempDir(), "absent.gguf")}, &out, &out)
	if err == nil || errors.Is(err, errUsage) {
		t.Errorf("absent model file: err = %v", err)
	}
}
