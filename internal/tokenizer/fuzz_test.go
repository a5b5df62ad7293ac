package tokenizer

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvfence/kvfence/internal/gguf"
)

func seedTexts(f *testing.F) {
	for _, s := range []string{"", "Hello, world!", "a  b\n\n c", "12345 'll <|im_start|>x<|im_end|>", "é\u0301 中文 😀👨‍👩‍👧", "\xff\xfe", "   \t\r\n", "<s></s><unk>"} {
		f.Add(s)
	}
}

// FuzzEncode checks that encoding then decoding gives the text back (the
// NFC form for Qwen, whose tokenizer normalizes), that the stream decoder
// agrees with Decode, and that nothing panics on invalid UTF-8.
func FuzzEncode(f *testing.F) {
	seedTexts(f)
	f.Fuzz(func(t *testing.T, s string) {
		for _, model := range []string{"qwen3", "llama3", "llama2"} {
			tok := refTokenizer(t, model)
			opt := EncodeOptions{ParseSpecial: model != "llama2"}
			ids := tok.Encode(s, opt)
			got := tok.Decode(ids)
			if utf8.ValidString(s) && !strings.Contains(s, "\x00") || model != "llama2" {
				want := s
				if model == "qwen3" {
					want = nfc(s)
				}
				if !utf8.ValidString(s) {
					want = toValidUTF8([]byte(want))
				}
				if got != want {
					t.Fatalf("%s: round trip %q -> %v -> %q", model, s, ids, got)
				}
			}
			if st, ok := streamAll(tok, ids); st != got || !ok {
				t.Fatalf("%s: stream %q, decode %q", model, st, got)
			}
		}
	})
}

// FuzzFromHFJSON feeds hostile tokenizer.json bytes: errors are fine,
// panics and runaway allocation are not.
func FuzzFromHFJSON(f *testing.F) {
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel"}}`), []byte(`{"bos_token":"a"}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"<unk>":0,"▁a":1,"▁":2,"a":3},"merges":[["▁","a"]],"byte_fallback":true,"unk_token":"<unk>"},"normalizer":{"type":"Prepend","prepend":"▁"},"added_tokens":[{"id":4,"content":"<s>","special":true}]}`), []byte(`{"add_bos_token":true,"bos_token":{"content":"<s>"},"chat_template":"<|im_start|><|im_end|>"}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":99999}},"decoder":{"type":"ByteLevel"}}`), []byte(nil))
	f.Fuzz(func(t *testing.T, tj, tc []byte) {
		c, err := FromHFJSON(tj, tc)
		if err != nil {
			return
		}
		tok, err := New(c)
		if err != nil {
			return
		}
		ids := tok.Encode("a <s> ab\xff é", EncodeOptions{ParseSpecial: true, AddSpecial: true})
		_ = tok.Decode(ids)
		_, _ = tok.ApplyChatTemplate([]Message{{"user", "x"}}, true)
	})
}

// FuzzFromGGUF feeds hostile GGUF metadata through FromGGUF and New.
func FuzzFromGGUF(f *testing.F) {
	add := func(kv ...gguf.KV) {
		w := gguf.NewWriter()
		for _, x := range kv {
			w.Set(x.Key, x.Value)
		}
		var b bytes.Buffer
		w.WriteTo(&b)
		f.Add(b.Bytes())
	}
	add(gguf.KV{Key: KeyModel, Value: "llama"}, gguf.KV{Key: KeyTokens, Value: []string{"<unk>", "▁a", "a"}},
		gguf.KV{Key: KeyScores, Value: []float32{0, -1, -2}}, gguf.KV{Key: KeyTokenType, Value: []int32{2, 1, 1}},
		gguf.KV{Key: KeyUNK, Value: uint32(0)})
	add(gguf.KV{Key: KeyModel, Value: "gpt2"}, gguf.KV{Key: KeyTokens, Value: []string{"a"}}, gguf.KV{Key: KeyMerges, Value: []string{"a a"}})
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := gguf.Parse(data)
		if err != nil {
			return
		}
		c, err := FromGGUF(g)
		if err != nil {
			return
		}
		tok, err := New(c)
		if err != nil {
			return
		}
		_ = tok.Decode(tok.Encode("a a\xff", EncodeOptions{ParseSpecial: true, AddSpecial: true}))
	})
}
