package router

import (
	"errors"

	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router/api"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

// Tokenize returns the prompt tokens of r as the model sees them. Chat
// messages go through the tokenizer's chat template with the generation
// prompt; the rendered text carries the template's special tokens (BOS
// included where the template writes it), so it is encoded with special
// tokens parsed and nothing added. A completions prompt is encoded with the
// tokenizer's own BOS/EOS rules, special tokens parsed, as the
// Hugging Face and llama.cpp servers do.
//
// Errors: KindInvalidRequest when the model has no chat template this
// package can render. Errors never quote the request's text.
func Tokenize(tok *tokenizer.Tokenizer, r *api.Request) ([]int32, error) {
	if !r.Chat {
		return tok.Encode(r.Prompt, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true}), nil
	}
	msgs := make([]tokenizer.Message, len(r.Messages))
	for i, m := range r.Messages {
		msgs[i] = tokenizer.Message(m)
	}
	text, err := tok.ApplyChatTemplate(msgs, true)
	if errors.Is(err, tokenizer.ErrNoChatTemplate) {
		return nil, reqerr.New(reqerr.KindInvalidRequest, "the model has no supported chat template; use /v1/completions")
	}
	if err != nil {
		return nil, reqerr.New(reqerr.KindInvalidRequest, "chat template: %v", err)
	}
	return tok.Encode(text, tokenizer.EncodeOptions{ParseSpecial: true}), nil
}

// Admit checks a request of prompt tokens that asks for maxTokens against
// a context window of limit tokens (invariant I3: before anything reaches a
// worker). It returns the number of tokens to generate: maxTokens when
// prompt+maxTokens fits; when auto (the client did not set max_tokens), what
// fits, if at least one token does. Otherwise it returns a
// *reqerr.ContextLengthError. limit <= 0 means unknown: nothing is checked.
func Admit(prompt, maxTokens int, auto bool, limit int) (int, error) {
	if prompt == 0 {
		return 0, reqerr.New(reqerr.KindInvalidRequest, "the prompt is empty after tokenization")
	}
	if limit <= 0 || prompt+maxTokens <= limit {
		return maxTokens, nil
	}
	if auto && prompt < limit {
		return limit - prompt, nil
	}
	return 0, &reqerr.ContextLengthError{Prompt: prompt, MaxTokens: maxTokens, Limit: limit}
}
