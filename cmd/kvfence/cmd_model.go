package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

func runModel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		w := stdout
		if len(args) == 0 {
			w = stderr
		}
		fmt.Fprintf(w, "Usage:\n  kvfence model new [flags] -o FILE.gguf   write a model with deterministic random weights\n")
		fmt.Fprintf(w, "  kvfence model inspect FILE.gguf          print a model's shape, tokenizer and tensors\n")
		fmt.Fprintf(w, "\nRun 'kvfence model new --help' for the flags.\n")
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	switch args[0] {
	case "new":
		return runModelNew(args[1:], stdout)
	case "inspect":
		return runModelInspect(args[1:], stdout)
	}
	fmt.Fprintf(stderr, "kvfence model: unknown subcommand %q (want new or inspect)\n", args[0])
	return errUsage
}

var weightTypes = map[string]gguf.TensorType{
	"f32": gguf.TypeF32, "f16": gguf.TypeF16, "bf16": gguf.TypeBF16, "q8_0": gguf.TypeQ8_0, "q4_0": gguf.TypeQ4_0,
}

func runModelNew(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kvfence model new", flag.ContinueOnError)
	var (
		preset    = fs.String("preset", "", "start from a named shape: qwen3-0.6b (Qwen3-0.6B's exact shapes and vocabulary); other flags given override it")
		arch      = fs.String("arch", "qwen3", "architecture: qwen3 (q/k norms), qwen2 (QKV biases) or llama")
		tokPath   = fs.String("tokenizer", "bundled", "tokenizer: 'bundled' (the real Qwen3 tokenizer) or a Hugging Face tokenizer.json (optionally .gz; a tokenizer_config.json beside it supplies specials and the chat template)")
		layers    = fs.Int("layers", 2, "number of transformer blocks")
		dim       = fs.Int("dim", 256, "embedding (hidden) size")
		heads     = fs.Int("heads", 4, "attention (query) heads")
		kvHeads   = fs.Int("kv-heads", 2, "key/value heads (grouped-query attention; must divide --heads)")
		headDim   = fs.Int("head-dim", 0, "size of one attention head; 0 means dim/heads")
		ff        = fs.Int("ff", 512, "feed-forward (intermediate) size")
		ctxLen    = fs.Int("ctx", 4096, "context length written to the metadata")
		typ       = fs.String("type", "q8_0", "weight type of the matrices: f32, f16, bf16, q8_0 or q4_0 (norms stay f32)")
		seed      = fs.Uint64("seed", 1, "seed of the pseudo-random weights: same flags and seed, same file")
		tied      = fs.Bool("tied", false, "tie the output projection to the token embedding (no output.weight)")
		ropeBase  = fs.Float64("rope-base", 0, "rope frequency base; 0 means the family default (llama 500000, qwen 1e6)")
		rmsEps    = fs.Float64("rms-eps", 0, "RMSNorm epsilon; 0 means the family default (llama 1e-5, qwen 1e-6)")
		ropeScale = fs.Float64("rope-scale", 0, "linear rope scaling factor; 0 means none")
		name      = fs.String("name", "", "general.name; empty means a name from the architecture")
		out       = fs.String("o", "", "output file (required); written atomically")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvfence model new [flags] -o FILE.gguf\n\n"+
			"Writes a GGUF model with deterministic pseudo-random weights (scaled so activations stay\n"+
			"finite and logits are far from flat) and a real tokenizer under the standard keys.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		fmt.Fprintln(fs.Output(), "kvfence model new: -o FILE is required")
		return errUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var o modelbuild.Options
	if *preset != "" {
		var err error
		if o, err = modelbuild.Preset(*preset); err != nil {
			return err
		}
	} else {
		o = modelbuild.Options{Arch: *arch, Layers: *layers, Dim: *dim, Heads: *heads, KVHeads: *kvHeads,
			HeadDim: *headDim, FF: *ff, Ctx: *ctxLen, Tied: *tied}
		set["type"] = true // the flag default applies
	}
	// Flags given explicitly override the preset.
	override := map[string]func(){
		"arch": func() { o.Arch = *arch }, "layers": func() { o.Layers = *layers }, "dim": func() { o.Dim = *dim },
		"heads": func() { o.Heads = *heads }, "kv-heads": func() { o.KVHeads = *kvHeads },
		"head-dim": func() { o.HeadDim = *headDim }, "ff": func() { o.FF = *ff }, "ctx": func() { o.Ctx = *ctxLen },
		"tied": func() { o.Tied = *tied }, "rope-base": func() { o.RopeBase = *ropeBase },
		"rms-eps": func() { o.RMSEps = *rmsEps }, "rope-scale": func() { o.RopeScale = *ropeScale },
		"name": func() { o.Name = *name },
	}
	for flagName, apply := range override {
		if set[flagName] {
			apply()
		}
	}
	if set["type"] {
		t, ok := weightTypes[strings.ToLower(*typ)]
		if !ok {
			return fmt.Errorf("unknown --type %q (want f32, f16, bf16, q8_0 or q4_0)", *typ)
		}
		o.Type = t
	}
	o.Seed = *seed
	if *preset == "" || set["tokenizer"] {
		tok, err := loadTokenizer(*tokPath)
		if err != nil {
			return err
		}
		o.Tokenizer = tok
	}
	if err := modelbuild.Write(o, *out); err != nil {
		return err
	}
	f, err := gguf.Open(*out)
	if err != nil {
		return fmt.Errorf("the written file does not read back: %w", err)
	}
	defer f.Close()
	var params uint64
	for i := range f.Tensors {
		params += f.Tensors[i].Elements()
	}
	st, _ := os.Stat(*out)
	fmt.Fprintf(stdout, "wrote %s: %s, %d layers, dim %d, %s weights, %d tensors, %s parameters, %s bytes\n",
		*out, o.Arch, o.Layers, o.Dim, o.Type, len(f.Tensors), thousands(params), thousands(uint64(st.Size())))
	return nil
}

// loadTokenizer returns the bundled Qwen3 tokenizer or one read from a
// Hugging Face tokenizer.json (plain or gzip), with tokenizer_config.json
// from the same directory when present.
func loadTokenizer(path string) (tokenizer.Config, error) {
	if path == "bundled" {
		return tokenizer.BundledQwen3()
	}
	tj, err := readMaybeGzip(path)
	if err != nil {
		return tokenizer.Config{}, err
	}
	var tc []byte
	for _, n := range []string{"tokenizer_config.json", "tokenizer_config.json.gz"} {
		b, err := readMaybeGzip(filepath.Join(filepath.Dir(path), n))
		if err == nil {
			tc = b
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return tokenizer.Config{}, err
		}
	}
	c, err := tokenizer.FromHFJSON(tj, tc)
	if err != nil {
		return tokenizer.Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func readMaybeGzip(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil || !strings.HasSuffix(path, ".gz") {
		return b, err
	}
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

func runModelInspect(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kvfence model inspect", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	showKV := fs.Bool("kv", false, "also list every metadata key with its type and value (long arrays abbreviated)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvfence model inspect [-kv] FILE.gguf\n\n"+
			"Prints the architecture, sizes, parameter count, tokenizer and tensor table of a GGUF file.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return flag.ErrHelp
		}
		return errUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	path := fs.Arg(0)
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if err := inspect(stdout, path, st.Size(), f); err != nil {
		return err
	}
	if *showKV {
		listKV(stdout, f)
	}
	return nil
}

// listKV prints every metadata entry, abbreviating arrays to their first
// elements.
func listKV(w io.Writer, f *gguf.File) {
	const show = 8
	fmt.Fprintf(w, "\nmetadata:\n")
	for _, kv := range f.KV {
		var v string
		switch x := kv.Value.(type) {
		case string:
			v = fmt.Sprintf("%q", abbreviate(x, 120))
		case []string:
			parts := make([]string, 0, show)
			for _, e := range x[:min(show, len(x))] {
				parts = append(parts, fmt.Sprintf("%q", abbreviate(e, 40)))
			}
			v = fmt.Sprintf("[%d strings] %s", len(x), strings.Join(parts, " "))
			if len(x) > show {
				v += " ..."
			}
		default:
			v = fmt.Sprintf("%v", kv.Value)
			if n := arrayLen(kv.Value); n >= 0 {
				v = fmt.Sprintf("[%d] %s", n, abbreviate(v, 120))
			}
		}
		fmt.Fprintf(w, "  %s (%T) = %s\n", kv.Key, kv.Value, v)
	}
}

func abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func arrayLen(v any) int {
	switch x := v.(type) {
	case []uint8:
		return len(x)
	case []int8:
		return len(x)
	case []uint16:
		return len(x)
	case []int16:
		return len(x)
	case []uint32:
		return len(x)
	case []int32:
		return len(x)
	case []uint64:
		return len(x)
	case []int64:
		return len(x)
	case []float32:
		return len(x)
	case []float64:
		return len(x)
	case []bool:
		return len(x)
	case []any:
		return len(x)
	}
	return -1
}

func inspect(w io.Writer, path string, size int64, f *gguf.File) error {
	meta := func(key string) string {
		v, ok := f.Get(key)
		if !ok {
			return "-"
		}
		switch x := v.(type) {
		case string:
			return x
		case float32:
			return fmt.Sprintf("%g", x)
		}
		return fmt.Sprint(v)
	}
	arch := meta("general.architecture")
	a := arch + "."
	var params uint64
	for i := range f.Tensors {
		params += f.Tensors[i].Elements()
	}
	fmt.Fprintf(w, "file:          %s (%s bytes, GGUF v%d, alignment %d)\n", path, thousands(uint64(size)), f.Version, f.Alignment)
	fmt.Fprintf(w, "architecture:  %s (%s)\n", arch, meta("general.name"))
	fmt.Fprintf(w, "shape:         %s layers, dim %s, heads %s, kv heads %s, head dim %s, ff %s\n",
		meta(a+"block_count"), meta(a+"embedding_length"), meta(a+"attention.head_count"),
		meta(a+"attention.head_count_kv"), meta(a+"attention.key_length"), meta(a+"feed_forward_length"))
	fmt.Fprintf(w, "context:       %s; rope base %s, scaling %s x%s; rms eps %s\n", meta(a+"context_length"),
		meta(a+"rope.freq_base"), meta(a+"rope.scaling.type"), meta(a+"rope.scaling.factor"), meta(a+"attention.layer_norm_rms_epsilon"))
	_, tied := f.Tensor("output.weight")
	fmt.Fprintf(w, "parameters:    %s in %d tensors (output tied to embedding: %v)\n", thousands(params), len(f.Tensors), !tied)
	if tok, err := tokenizer.FromGGUF(f); err != nil {
		fmt.Fprintf(w, "tokenizer:     unreadable: %v\n", err)
	} else {
		text := func(id int32) string {
			if id < 0 {
				return "none"
			}
			return fmt.Sprintf("%d %q", id, tok.Tokens[id])
		}
		fmt.Fprintf(w, "tokenizer:     %s (pre %s), %d tokens, %d merges; BOS %s, EOS %s, EOT %s\n",
			tok.Model, tok.Pre, len(tok.Tokens), len(tok.Merges), text(tok.BOS), text(tok.EOS), text(tok.EOT))
		if tok.ChatTemplate == "" {
			fmt.Fprintf(w, "chat template: none\n")
		} else {
			fmt.Fprintf(w, "chat template: present (%d bytes)\n", len(tok.ChatTemplate))
		}
	}
	fmt.Fprintf(w, "\ntensors:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "name\ttype\tdims\tbytes\t\n")
	for _, t := range f.Tensors {
		dims := make([]string, len(t.Dims))
		for i, d := range t.Dims {
			dims[i] = fmt.Sprint(d)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", t.Name, t.Type, strings.Join(dims, " x "), thousands(uint64(len(t.Data))))
	}
	return tw.Flush()
}

// thousands formats n with comma separators.
func thousands(n uint64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
