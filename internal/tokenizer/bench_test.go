package tokenizer

import (
	"strings"
	"testing"
)

// mixedCorpus is every reference case's text: code, prose in many
// scripts, emoji, whitespace and digit runs (about 20 KB).
func mixedCorpus(b *testing.B) string {
	var sb strings.Builder
	for _, c := range loadRef(b, "qwen3").Cases {
		sb.WriteString(c.Text)
		sb.WriteByte('\n')
	}
	return sb.String()
}

func benchEncode(b *testing.B, model string) {
	tok := refTokenizer(b, model)
	text := mixedCorpus(b)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n = len(tok.Encode(text, EncodeOptions{ParseSpecial: true}))
	}
	b.ReportMetric(float64(n), "tokens/op")
}

func BenchmarkEncodeQwen3(b *testing.B)  { benchEncode(b, "qwen3") }
func BenchmarkEncodeLlama3(b *testing.B) { benchEncode(b, "llama3") }
func BenchmarkEncodeLlama2(b *testing.B) { benchEncode(b, "llama2") }

func BenchmarkDecodeQwen3(b *testing.B) {
	tok := refTokenizer(b, "qwen3")
	ids := tok.Encode(mixedCorpus(b), EncodeOptions{})
	b.ReportAllocs()
	for b.Loop() {
		_ = tok.Decode(ids)
	}
}
