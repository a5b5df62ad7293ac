package router

import (
	"strings"
	"testing"

	"github.com/kvfence/kvfence/internal/tokenizer"
)

// tinyTokenizerConfig is a byte-level BPE vocabulary: the 256 byte symbols,
// a few merges, and ChatML specials (a plain ChatML template), cheap to
// build and small enough for a model of a few hundred kilobytes.
func tinyTokenizerConfig() tokenizer.Config {
	var toks []string
	var types []int32
	shift := 0
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae) {
			r = rune(256 + shift)
			shift++
		}
		toks = append(toks, string(r))
		types = append(types, tokenizer.TypeNormal)
	}
	merges := []string{"Ġ t", "h e", "Ġt he", "i n"}
	for _, m := range merges {
		toks = append(toks, strings.ReplaceAll(m, " ", ""))
		types = append(types, tokenizer.TypeNormal)
	}
	for _, s := range []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"} {
		toks = append(toks, s)
		types = append(types, tokenizer.TypeControl)
	}
	n := int32(len(toks))
	return tokenizer.Config{
		Model: "gpt2", Pre: "qwen2", Tokens: toks, Types: types, Merges: merges,
		BOS: n - 3, EOS: n - 1, EOT: n - 1, PAD: n - 3, UNK: -1, AddBOS: true,
		ChatTemplate: "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
	}
}

func newTinyTokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.New(tinyTokenizerConfig())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
