package tokenizer

import (
	"errors"
	"fmt"

	"github.com/kvfence/kvfence/internal/gguf"
)

// Token types as GGUF stores them in tokenizer.ggml.token_type.
const (
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)

// Model and pre-tokenizer names as GGUF stores them.
const (
	ModelGPT2  = "gpt2"  // byte-level BPE
	ModelLlama = "llama" // SentencePiece-style BPE with scores

	PreLlamaBPE = "llama-bpe" // Llama 3 regex
	PreQwen2    = "qwen2"     // Qwen2 / Qwen3 regex
	PreDefault  = "default"   // GPT-2 regex
)

// Standard GGUF metadata keys of a tokenizer.
const (
	KeyModel          = "tokenizer.ggml.model"
	KeyPre            = "tokenizer.ggml.pre"
	KeyTokens         = "tokenizer.ggml.tokens"
	KeyTokenType      = "tokenizer.ggml.token_type"
	KeyScores         = "tokenizer.ggml.scores"
	KeyMerges         = "tokenizer.ggml.merges"
	KeyBOS            = "tokenizer.ggml.bos_token_id"
	KeyEOS            = "tokenizer.ggml.eos_token_id"
	KeyEOT            = "tokenizer.ggml.eot_token_id"
	KeyPAD            = "tokenizer.ggml.padding_token_id"
	KeyUNK            = "tokenizer.ggml.unknown_token_id"
	KeyAddBOS         = "tokenizer.ggml.add_bos_token"
	KeyAddEOS         = "tokenizer.ggml.add_eos_token"
	KeyAddSpacePrefix = "tokenizer.ggml.add_space_prefix"
	KeyChatTemplate   = "tokenizer.chat_template"
)

// Config is a tokenizer as data: what GGUF metadata or a Hugging Face
// tokenizer.json describe. It is plain data; New validates and compiles it.
type Config struct {
	Model                   string    // "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
	Pre                     string    // tokenizer.ggml.pre: "llama-bpe" (Llama 3), "qwen2" (Qwen2/Qwen3), "default"
	Tokens                  []string  // token text by id
	Types                   []int32   // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
	Scores                  []float32 // "llama" only (nil otherwise)
	Merges                  []string  // "gpt2" only, "left right" by rank
	BOS, EOS, EOT, PAD, UNK int32     // -1 when absent
	AddBOS, AddEOS          bool
	AddSpacePrefix          bool   // "llama" only
	ChatTemplate            string // tokenizer.chat_template (Jinja text as shipped)
}

// ErrBadConfig is wrapped by every error about an inconsistent Config or
// malformed tokenizer metadata.
var ErrBadConfig = errors.New("tokenizer: bad config")

// FromGGUF reads the standard tokenizer keys of f. Optional keys that are
// absent take their defaults (ids -1; add_bos true for "llama", false for
// "gpt2"; add_space_prefix true for "llama"); present keys of the wrong type
// are errors.
func FromGGUF(f *gguf.File) (Config, error) {
	var c Config
	var err error
	if c.Model, err = f.String(KeyModel); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if _, ok := f.Get(KeyPre); ok {
		if c.Pre, err = f.String(KeyPre); err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	} else {
		c.Pre = PreDefault
	}
	if c.Tokens, err = f.Strings(KeyTokens); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if _, ok := f.Get(KeyTokenType); ok {
		if c.Types, err = f.Int32s(KeyTokenType); err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	}
	if _, ok := f.Get(KeyScores); ok {
		if c.Scores, err = f.Float32s(KeyScores); err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	}
	if _, ok := f.Get(KeyMerges); ok {
		if c.Merges, err = f.Strings(KeyMerges); err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	}
	ids := []struct {
		key string
		dst *int32
	}{{KeyBOS, &c.BOS}, {KeyEOS, &c.EOS}, {KeyEOT, &c.EOT}, {KeyPAD, &c.PAD}, {KeyUNK, &c.UNK}}
	for _, id := range ids {
		*id.dst = -1
		if _, ok := f.Get(id.key); !ok {
			continue
		}
		v, err := f.Int(id.key)
		if err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		if v < 0 || v >= int64(len(c.Tokens)) {
			return Config{}, fmt.Errorf("%w: %s = %d outside vocabulary of %d", ErrBadConfig, id.key, v, len(c.Tokens))
		}
		*id.dst = int32(v)
	}
	c.AddBOS = c.Model == ModelLlama
	c.AddSpacePrefix = c.Model == ModelLlama
	bools := []struct {
		key string
		dst *bool
	}{{KeyAddBOS, &c.AddBOS}, {KeyAddEOS, &c.AddEOS}, {KeyAddSpacePrefix, &c.AddSpacePrefix}}
	for _, b := range bools {
		if _, ok := f.Get(b.key); !ok {
			continue
		}
		if *b.dst, err = f.Bool(b.key); err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	}
	if _, ok := f.Get(KeyChatTemplate); ok {
		if c.ChatTemplate, err = f.String(KeyChatTemplate); err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// GGUFKV returns the standard tokenizer.ggml.* and tokenizer.chat_template
// keys describing c, in the order llama.cpp's converter writes them. Absent
// ids (-1), nil scores, empty merges and an empty template are left out.
func (c Config) GGUFKV() []gguf.KV {
	pre := c.Pre
	if pre == "" {
		pre = PreDefault
	}
	kv := []gguf.KV{
		{Key: KeyModel, Value: c.Model},
		{Key: KeyPre, Value: pre},
		{Key: KeyTokens, Value: append([]string(nil), c.Tokens...)},
	}
	if c.Types != nil {
		kv = append(kv, gguf.KV{Key: KeyTokenType, Value: append([]int32(nil), c.Types...)})
	}
	if c.Scores != nil {
		kv = append(kv, gguf.KV{Key: KeyScores, Value: append([]float32(nil), c.Scores...)})
	}
	if len(c.Merges) > 0 {
		kv = append(kv, gguf.KV{Key: KeyMerges, Value: append([]string(nil), c.Merges...)})
	}
	for _, id := range []struct {
		key string
		v   int32
	}{{KeyBOS, c.BOS}, {KeyEOS, c.EOS}, {KeyEOT, c.EOT}, {KeyUNK, c.UNK}, {KeyPAD, c.PAD}} {
		if id.v >= 0 {
			kv = append(kv, gguf.KV{Key: id.key, Value: uint32(id.v)})
		}
	}
	kv = append(kv,
		gguf.KV{Key: KeyAddBOS, Value: c.AddBOS},
		gguf.KV{Key: KeyAddEOS, Value: c.AddEOS},
	)
	if c.Model == ModelLlama {
		kv = append(kv, gguf.KV{Key: KeyAddSpacePrefix, Value: c.AddSpacePrefix})
	}
	if c.ChatTemplate != "" {
		kv = append(kv, gguf.KV{Key: KeyChatTemplate, Value: c.ChatTemplate})
	}
	return kv
}

// validate checks the structural consistency of c (not the merges, which
// New checks against the vocabulary).
func (c Config) validate() error {
	switch c.Model {
	case ModelGPT2, ModelLlama:
	default:
		return fmt.Errorf("%w: tokenizer model %q not supported (supported: gpt2, llama)", ErrBadConfig, c.Model)
	}
	if len(c.Tokens) == 0 {
		return fmt.Errorf("%w: empty vocabulary", ErrBadConfig)
	}
	if len(c.Tokens) > 1<<30 {
		return fmt.Errorf("%w: vocabulary of %d tokens too large", ErrBadConfig, len(c.Tokens))
	}
	if c.Types != nil && len(c.Types) != len(c.Tokens) {
		return fmt.Errorf("%w: %d token types for %d tokens", ErrBadConfig, len(c.Types), len(c.Tokens))
	}
	if c.Scores != nil && len(c.Scores) != len(c.Tokens) {
		return fmt.Errorf("%w: %d scores for %d tokens", ErrBadConfig, len(c.Scores), len(c.Tokens))
	}
	n := int32(len(c.Tokens))
	for _, id := range []struct {
		name string
		v    int32
	}{{"bos", c.BOS}, {"eos", c.EOS}, {"eot", c.EOT}, {"pad", c.PAD}, {"unk", c.UNK}} {
		if id.v < -1 || id.v >= n {
			return fmt.Errorf("%w: %s id %d outside vocabulary of %d", ErrBadConfig, id.name, id.v, n)
		}
	}
	return nil
}
