package router

import (
	"testing"

	"github.com/kvfence/kvfence/internal/tokenizer"
)

// newTinyTokenizer is tokenizer.Tiny with AddBOS on, so that the
// completions path's BOS rule is exercised.
func newTinyTokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	cfg := tokenizer.Tiny()
	cfg.AddBOS = true
	tok, err := tokenizer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
