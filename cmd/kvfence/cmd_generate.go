package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/sampling"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

// generatePageSize is the KV page size of local generation; any size gives
// the same tokens.
const generatePageSize = 64

func runGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvfence generate", flag.ContinueOnError)
	var (
		modelPath = fs.String("model", "", "GGUF model file (required; 'kvfence model new' writes one)")
		prompt    = fs.String("prompt", "", "prompt text")
		chat      = fs.Bool("chat", false, "wrap the prompt as one user message in the model's chat template")
		n         = fs.Int("n", 128, "most tokens to generate")
		seed      = fs.Uint64("seed", 0, "sampling seed (same seed, same output)")
		temp      = fs.Float64("temperature", 0, "sampling temperature; 0 is greedy")
		topK      = fs.Int("top-k", 0, "keep only the K most likely tokens (0: all)")
		topP      = fs.Float64("top-p", 0, "nucleus sampling threshold (0: off)")
		minP      = fs.Float64("min-p", 0, "drop tokens less likely than this fraction of the best (0: off)")
		threads   = fs.Int("threads", runtime.GOMAXPROCS(0), "worker threads of the forward pass")
		chunk     = fs.Int("chunked-prefill-size", 512, "prompt tokens per prefill forward call")
		ignoreEOS = fs.Bool("ignore-eos", false, "keep generating past end-of-generation tokens")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvfence generate --model FILE.gguf --prompt TEXT [--chat] [-n N] [--seed S] [--temperature T] [--threads T] [--ignore-eos]\n\n")
		fmt.Fprintf(fs.Output(), "Prints the continuation on standard output, then one line on standard error:\n")
		fmt.Fprintf(fs.Output(), "  prefill: N tokens, X tok/s; decode: M tokens, Y tok/s\n")
		fmt.Fprintf(fs.Output(), "where decode counts the forward steps after the prompt (the first new token comes from the prefill).\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *modelPath == "":
		fmt.Fprintf(fs.Output(), "kvfence generate: --model is required (a GGUF file; 'kvfence model new -o FILE.gguf' writes one)\n")
		return errUsage
	case *n < 0 || *threads < 1 || *chunk < 1:
		fmt.Fprintf(fs.Output(), "kvfence generate: -n must be >= 0, --threads and --chunked-prefill-size >= 1\n")
		return errUsage
	}

	m, err := model.Load(*modelPath)
	if err != nil {
		return err
	}
	defer m.Close()
	if m.Tok == nil {
		return fmt.Errorf("%s has no tokenizer", *modelPath)
	}
	ids, err := promptTokens(m.Tok, *prompt, *chat)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return errors.New("the prompt is empty and the tokenizer adds no BOS token")
	}
	limit := m.Config.ContextLength
	if len(ids) >= limit {
		return fmt.Errorf("the prompt is %d tokens, the context window %d", len(ids), limit)
	}
	maxNew := min(*n, limit-len(ids))

	sampler, err := sampling.New(sampling.Params{
		Temperature: float32(*temp), TopK: *topK, TopP: float32(*topP), MinP: float32(*minP), Seed: *seed,
	}, m.Config.Vocab)
	if err != nil {
		return err
	}
	stop := sampling.NewStopIDs(m.Tok, nil, *ignoreEOS)

	total := len(ids) + maxNew
	pages := make([]int32, (total+generatePageSize-1)/generatePageSize)
	for i := range pages {
		pages[i] = int32(i)
	}
	kv := model.NewSliceStore(m.Config, generatePageSize, len(pages))
	ws := m.NewWorkspace(min(*chunk, len(ids)), 1, *threads)
	defer ws.Close()

	// Prefill, chunk by chunk; the last chunk's logits give the first token.
	start := time.Now()
	batch := make([]model.Seq, 1)
	for pos := 0; pos < len(ids); pos += *chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min(pos+*chunk, len(ids))
		batch[0] = model.Seq{Tokens: ids[pos:end], Pos: pos, Pages: pages, Logits: model.LogitsNone}
		if end == len(ids) {
			batch[0].Logits = model.LogitsLast
		}
		if err := m.Forward(ws, kv, batch); err != nil {
			return err
		}
	}
	prefillTime := time.Since(start)

	dec := m.Tok.NewStreamDecoder()
	var decodeTime time.Duration
	steps := 0
	token := make([]int32, 1)
	for i := 0; i < maxNew; i++ {
		r, err := sampler.Sample(ws.Logits(0, 0))
		if err != nil {
			return err
		}
		if stop.Has(r.Token) {
			break
		}
		if _, err := io.WriteString(stdout, dec.Next(r.Token)); err != nil {
			return err
		}
		if i == maxNew-1 {
			break // the last token needs no forward step of its own
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		token[0] = r.Token
		batch[0] = model.Seq{Tokens: token, Pos: len(ids) + i, Pages: pages, Logits: model.LogitsLast}
		t0 := time.Now()
		if err := m.Forward(ws, kv, batch); err != nil {
			return err
		}
		decodeTime += time.Since(t0)
		steps++
	}
	if _, err := io.WriteString(stdout, dec.Flush()+"\n"); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "prefill: %d tokens, %.2f tok/s; decode: %d tokens, %.2f tok/s\n",
		len(ids), rate(len(ids), prefillTime), steps, rate(steps, decodeTime))
	return nil
}

// promptTokens encodes the prompt, through the chat template when asked.
// Special-token text is honoured only in the template's output, never in
// the user's text outside chat mode.
func promptTokens(tok *tokenizer.Tokenizer, prompt string, chat bool) ([]int32, error) {
	if !chat {
		return tok.Encode(prompt, tokenizer.EncodeOptions{AddSpecial: true}), nil
	}
	text, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: prompt}}, true)
	if err != nil {
		return nil, err
	}
	// Templates that spell out the BOS token (Llama 3) must not get a
	// second one from the tokenizer.
	addBOS := true
	if bos := tok.BOS(); bos >= 0 && strings.HasPrefix(text, tok.TokenText(bos)) {
		addBOS = false
	}
	return tok.Encode(text, tokenizer.EncodeOptions{AddSpecial: addBOS, ParseSpecial: true}), nil
}

func rate(n int, d time.Duration) float64 {
	if n == 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
