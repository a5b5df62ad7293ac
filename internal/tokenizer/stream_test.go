package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func streamAll(tok *Tokenizer, ids []int32) (string, bool) {
	d := tok.NewStreamDecoder()
	var b strings.Builder
	ok := true
	for _, id := range ids {
		s := d.Next(id)
		ok = ok && utf8.ValidString(s)
		b.WriteString(s)
	}
	b.WriteString(d.Flush())
	return b.String(), ok
}

func TestStreamDecoderMatchesDecode(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3", "llama2"} {
		tok := refTokenizer(t, model)
		ref := loadRef(t, model)
		for _, c := range ref.Cases {
			got, ok := streamAll(tok, c.IDs)
			if got != c.Decoded || !ok {
				t.Errorf("%s/%s: stream %q (valid pieces %v), want %q", model, c.Name, got, ok, c.Decoded)
			}
		}
		// Random id sequences, biased to single-byte tokens so that UTF-8
		// sequences are split and broken in every way.
		rng := rand.New(rand.NewPCG(1, uint64(len(model))))
		var bytesToks []int32
		for b := range 256 {
			if id := tok.byteTok[b]; id >= 0 {
				bytesToks = append(bytesToks, id)
			}
		}
		for range 500 {
			ids := make([]int32, rng.IntN(12))
			for i := range ids {
				if rng.IntN(3) == 0 {
					ids[i] = int32(rng.IntN(tok.VocabSize()))
				} else {
					ids[i] = bytesToks[rng.IntN(len(bytesToks))]
				}
			}
			want := tok.Decode(ids)
			got, ok := streamAll(tok, ids)
			if got != want || !ok || !utf8.ValidString(want) {
				t.Fatalf("%s %v: stream %q (valid pieces %v), decode %q", model, ids, got, ok, want)
			}
		}
	}
}

func TestStreamDecoderHoldsBack(t *testing.T) {
	tok := refTokenizer(t, "qwen3")
	b := func(c byte) int32 { return tok.byteTok[c] }
	d := tok.NewStreamDecoder()
	// "€" is E2 82 AC: nothing until the last byte.
	for i, c := range []byte("€") {
		got := d.Next(b(c))
		if want := map[bool]string{true: "€", false: ""}[i == 2]; got != want {
			t.Fatalf("byte %d: got %q want %q", i, got, want)
		}
	}
	// E2 then 'A': provably invalid, emitted at once as one U+FFFD.
	if got := d.Next(b(0xE2)); got != "" || !d.Pending() {
		t.Fatalf("lead byte: %q pending=%v", got, d.Pending())
	}
	if got := d.Next(b('A')); got != "\uFFFDA" {
		t.Fatalf("broken sequence: %q", got)
	}
	// An incomplete tail is replaced only at Flush.
	d.Next(b(0xF0))
	d.Next(b(0x9F))
	if got := d.Flush(); got != "\uFFFD" {
		t.Fatalf("flush: %q", got)
	}
	// A stray continuation byte is invalid immediately.
	if got := d.Next(b(0x80)); got != "\uFFFD" {
		t.Fatalf("stray continuation: %q", got)
	}
}

func TestDecodeWHATWGReplacement(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a\xE2\x82b", "a\uFFFDb"},             // truncated 3-byte sequence: one U+FFFD
		{"\xF0\x9F\x98", "\uFFFD"},             // truncated 4-byte at end
		{"\xC0\xAF", "\uFFFD\uFFFD"},           // overlong lead: each byte
		{"\xED\xA0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: E D is valid only with 80-9F
		{"\xF4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"ok\xFF", "ok\uFFFD"},
		{"é€😀", "é€😀"},
	} {
		if got := toValidUTF8([]byte(c.in)); got != c.want {
			t.Errorf("%q: got %q want %q", c.in, got, c.want)
		}
	}
}

func BenchmarkStreamDecoder(b *testing.B) {
	tok := refTokenizer(b, "qwen3")
	ids := tok.Encode(strings.Repeat("Hello, 世界! 😀 ", 20), EncodeOptions{})
	d := tok.NewStreamDecoder()
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		for _, id := range ids {
			buf = d.AppendNext(buf[:0], id)
		}
		d.Flush()
	}
}
