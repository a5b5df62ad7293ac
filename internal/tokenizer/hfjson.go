package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// hfTokenizer is the part of a Hugging Face tokenizer.json this package
// reads.
type hfTokenizer struct {
	AddedTokens []struct {
		ID      int32  `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         struct {
		Type         string           `json:"type"`
		Vocab        map[string]int32 `json:"vocab"`
		Merges       json.RawMessage  `json:"merges"`
		UnkToken     *string          `json:"unk_token"`
		ByteFallback bool             `json:"byte_fallback"`
	} `json:"model"`
}

// hfConfig is the part of tokenizer_config.json this package reads.
type hfConfig struct {
	AddBOS       *bool           `json:"add_bos_token"`
	AddEOS       *bool           `json:"add_eos_token"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	PAD          json.RawMessage `json:"pad_token"`
	UNK          json.RawMessage `json:"unk_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// FromHFJSON builds a Config from a Hugging Face tokenizer.json and, if not
// nil, its tokenizer_config.json (special tokens, add_bos/add_eos, chat
// template). Only BPE models are supported: byte-level ones ("gpt2", whose
// pre-tokenizer is recognised from its split pattern) and SentencePiece
// conversions with byte fallback ("llama"). SentencePiece scores are not in
// tokenizer.json; they are derived from the merge ranks, which orders
// merges the same way.
func FromHFJSON(tokenizerJSON, tokenizerConfigJSON []byte) (Config, error) {
	var hf hfTokenizer
	if err := json.Unmarshal(tokenizerJSON, &hf); err != nil {
		return Config{}, fmt.Errorf("%w: tokenizer.json: %w", ErrBadConfig, err)
	}
	var hc hfConfig
	if len(tokenizerConfigJSON) > 0 {
		if err := json.Unmarshal(tokenizerConfigJSON, &hc); err != nil {
			return Config{}, fmt.Errorf("%w: tokenizer_config.json: %w", ErrBadConfig, err)
		}
	}
	if hf.Model.Type != "BPE" {
		return Config{}, fmt.Errorf("%w: tokenizer.json model type %q not supported (supported: BPE)", ErrBadConfig, hf.Model.Type)
	}
	pre := string(hf.PreTokenizer)
	c := Config{BOS: -1, EOS: -1, EOT: -1, PAD: -1, UNK: -1}
	switch {
	case strings.Contains(pre, `"ByteLevel"`) || strings.Contains(string(hf.Decoder), `"ByteLevel"`):
		c.Model = ModelGPT2
		switch {
		case strings.Contains(pre, `\\p{N}{1,3}`):
			c.Pre = PreLlamaBPE
		case strings.Contains(pre, `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|`):
			c.Pre = PreQwen2
		case !strings.Contains(pre, `"Split"`):
			c.Pre = PreDefault
		default:
			return Config{}, fmt.Errorf("%w: tokenizer.json pre-tokenizer pattern not recognised (supported: Llama 3, Qwen2, GPT-2)", ErrBadConfig)
		}
	case hf.Model.ByteFallback || strings.Contains(string(hf.Normalizer), "▁") || strings.Contains(pre, "Metaspace"):
		c.Model = ModelLlama
		c.Pre = PreDefault
		c.AddSpacePrefix = strings.Contains(string(hf.Normalizer), `"Prepend"`) ||
			strings.Contains(pre, `"prepend_scheme":"always"`) || strings.Contains(pre, `"add_prefix_space":true`)
	default:
		return Config{}, fmt.Errorf("%w: tokenizer.json is neither byte-level BPE nor SentencePiece BPE", ErrBadConfig)
	}

	n := int32(0)
	for _, id := range hf.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range hf.AddedTokens {
		n = max(n, a.ID+1)
	}
	// Ids are dense in real vocabularies; bound the holes so that a hostile
	// file cannot make us allocate for ids it does not define.
	if n <= 0 || int(n) > len(hf.Model.Vocab)+len(hf.AddedTokens)+1<<16 {
		return Config{}, fmt.Errorf("%w: token ids up to %d for %d tokens", ErrBadConfig, n, len(hf.Model.Vocab)+len(hf.AddedTokens))
	}
	c.Tokens = make([]string, n)
	c.Types = make([]int32, n)
	for i := range c.Tokens {
		c.Tokens[i] = fmt.Sprintf("[PAD%d]", i)
		c.Types[i] = TypeUnused
	}
	for tok, id := range hf.Model.Vocab {
		if id < 0 {
			return Config{}, fmt.Errorf("%w: negative token id", ErrBadConfig)
		}
		c.Tokens[id] = tok
		c.Types[id] = TypeNormal
		if c.Model == ModelLlama {
			if _, ok := parseByteToken(tok); ok {
				c.Types[id] = TypeByte
			}
		}
	}
	for _, a := range hf.AddedTokens {
		if a.ID < 0 {
			return Config{}, fmt.Errorf("%w: negative token id", ErrBadConfig)
		}
		c.Tokens[a.ID] = a.Content
		if a.Special {
			c.Types[a.ID] = TypeControl
		} else {
			c.Types[a.ID] = TypeUserDefined
		}
	}
	lookupText := func(s string) int32 {
		if s == "" {
			return -1
		}
		for _, a := range hf.AddedTokens {
			if a.Content == s {
				return a.ID
			}
		}
		if id, ok := hf.Model.Vocab[s]; ok {
			return id
		}
		return -1
	}
	lookup := func(raw json.RawMessage) int32 { return lookupText(tokenString(raw)) }
	c.BOS, c.EOS, c.PAD = lookup(hc.BOS), lookup(hc.EOS), lookup(hc.PAD)
	if hf.Model.UnkToken != nil {
		c.UNK = lookupText(*hf.Model.UnkToken)
	} else {
		c.UNK = lookup(hc.UNK)
	}
	if c.UNK >= 0 {
		c.Types[c.UNK] = TypeUnknown
	}
	// End-of-turn tokens of the supported families.
	for _, name := range []string{"<|eot_id|>", "<|im_end|>"} {
		if id := lookupText(name); id >= 0 && id != c.EOS {
			c.EOT = id
			break
		}
	}

	// Whether encode adds BOS/EOS: the config says so explicitly, or the
	// post-processor template puts the special tokens around the text.
	var post struct {
		Type   string `json:"type"`
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct{} `json:"Sequence"`
		} `json:"single"`
	}
	if len(hf.PostProcessor) > 0 && string(hf.PostProcessor) != "null" {
		if err := json.Unmarshal(hf.PostProcessor, &post); err != nil {
			return Config{}, fmt.Errorf("%w: tokenizer.json post_processor: %w", ErrBadConfig, err)
		}
	}
	if post.Type == "TemplateProcessing" {
		seen := false
		for _, p := range post.Single {
			switch {
			case p.Sequence != nil:
				seen = true
			case p.SpecialToken != nil:
				id := lookupText(p.SpecialToken.ID)
				if !seen && id >= 0 {
					if c.BOS < 0 {
						c.BOS = id
					}
					c.AddBOS = c.AddBOS || id == c.BOS
				}
				if seen && id >= 0 {
					if c.EOS < 0 {
						c.EOS = id
					}
					c.AddEOS = c.AddEOS || id == c.EOS
				}
			}
		}
	}
	if hc.AddBOS != nil {
		c.AddBOS = *hc.AddBOS
	}
	if hc.AddEOS != nil {
		c.AddEOS = *hc.AddEOS
	}

	// Merges come as "left right" strings or, in newer files, as pairs.
	var merges []string
	if len(hf.Model.Merges) > 0 && string(hf.Model.Merges) != "null" {
		if err := json.Unmarshal(hf.Model.Merges, &merges); err != nil {
			var pairs [][]string
			if err := json.Unmarshal(hf.Model.Merges, &pairs); err != nil {
				return Config{}, fmt.Errorf("%w: merges are neither \"a b\" strings nor [a, b] pairs", ErrBadConfig)
			}
			merges = make([]string, len(pairs))
			for i, p := range pairs {
				if len(p) != 2 {
					return Config{}, fmt.Errorf("%w: merge %d is not a pair", ErrBadConfig, i)
				}
				merges[i] = p[0] + " " + p[1]
			}
		}
	}
	if c.Model == ModelGPT2 {
		c.Merges = merges
	} else {
		c.Scores = scoresFromMerges(c, merges)
	}
	c.ChatTemplate = chatTemplateString(hc.ChatTemplate)
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// scoresFromMerges gives each token produced by a merge the score -rank of
// its first merge, so that "highest score first" (SentencePiece) applies
// merges in the order "lowest rank first" (tokenizer.json BPE) does. Tokens
// no merge produces score below every merged token.
func scoresFromMerges(c Config, merges []string) []float32 {
	scores := make([]float32, len(c.Tokens))
	id := make(map[string]int, len(c.Tokens))
	for i, t := range c.Tokens {
		id[t] = i
		scores[i] = -float32(len(merges)) - 1
	}
	set := make([]bool, len(c.Tokens))
	for rank, m := range merges {
		l, r, ok := splitMerge(m)
		if !ok {
			continue
		}
		if i, ok := id[l+r]; ok && !set[i] {
			scores[i] = -float32(rank)
			set[i] = true
		}
	}
	return scores
}

// tokenString reads a special token given as "text" or {"content": "text"}.
func tokenString(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return ""
}

// chatTemplateString reads chat_template given as a string or as a list of
// {name, template} (taking "default").
func chatTemplateString(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var l []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(raw, &l) == nil {
		for _, t := range l {
			if t.Name == "default" {
				return t.Template
			}
		}
	}
	return ""
}
