package router

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router/api"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

func TestAdmit(t *testing.T) {
	for _, c := range []struct {
		name                   string
		prompt, max            int
		auto                   bool
		limit                  int
		want                   int
		wantErr                reqerr.Kind
		errPrompt, errMax, lim int
	}{
		{"fits", 10, 6, false, 16, 6, 0, 0, 0, 0},
		{"exactly fits", 10, 6, false, 16, 6, 0, 0, 0, 0},
		{"one over", 10, 7, false, 16, 0, reqerr.KindContextLength, 10, 7, 16},
		{"auto lowers", 10, 4096, true, 16, 6, 0, 0, 0, 0},
		{"auto keeps what fits", 10, 3, true, 16, 3, 0, 0, 0, 0},
		{"auto, one token left", 15, 4096, true, 16, 1, 0, 0, 0, 0},
		{"auto, no room", 16, 4096, true, 16, 0, reqerr.KindContextLength, 16, 4096, 16},
		{"prompt alone too long", 40, 1, false, 16, 0, reqerr.KindContextLength, 40, 1, 16},
		{"unknown limit", 40, 100, false, 0, 100, 0, 0, 0, 0},
		{"empty prompt", 0, 5, false, 16, 0, reqerr.KindInvalidRequest, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Admit(c.prompt, c.max, c.auto, c.limit)
			if reqerr.KindOf(err) != c.wantErr {
				t.Fatalf("Admit(%d, %d, %v, %d) error %v, want kind %v", c.prompt, c.max, c.auto, c.limit, err, c.wantErr)
			}
			if err == nil && got != c.want {
				t.Fatalf("Admit(%d, %d, %v, %d) = %d, want %d", c.prompt, c.max, c.auto, c.limit, got, c.want)
			}
			var cl *reqerr.ContextLengthError
			if errors.As(err, &cl) && (cl.Prompt != c.errPrompt || cl.MaxTokens != c.errMax || cl.Limit != c.lim) {
				t.Fatalf("error %+v, want prompt %d max %d limit %d", cl, c.errPrompt, c.errMax, c.lim)
			}
		})
	}
}

func TestTokenize(t *testing.T) {
	tok := newTinyTokenizer(t)
	im, _ := tok.TokenID("<|im_start|>")
	end, _ := tok.TokenID("<|im_end|>")

	chat, err := Tokenize(tok, &api.Request{Chat: true, Messages: []api.Message{{Role: "user", Content: "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	// <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n, no BOS added.
	want := tok.Encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", tokenizer.EncodeOptions{ParseSpecial: true})
	if !equal(chat, want) || chat[0] != im || countID(chat, end) != 1 {
		t.Fatalf("chat tokens %v, want %v", chat, want)
	}

	// Completions: the tokenizer's BOS rule applies (the tiny tokenizer adds one).
	comp, err := Tokenize(tok, &api.Request{Prompt: "the cat"})
	if err != nil {
		t.Fatal(err)
	}
	if comp[0] != tok.BOS() || tok.Decode(comp[1:]) != "the cat" {
		t.Fatalf("completion tokens %v (%q)", comp, tok.Decode(comp))
	}

	// A model without a chat template: 400, not a silent fallback.
	cfg := tok.Config()
	cfg.ChatTemplate = ""
	bare, err := tokenizer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Tokenize(bare, &api.Request{Chat: true, Messages: []api.Message{{Role: "user", Content: "secret words"}}})
	if reqerr.KindOf(err) != reqerr.KindInvalidRequest || strings.Contains(err.Error(), "secret") {
		t.Fatalf("no template: %v", err)
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func countID(ids []int32, id int32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}
