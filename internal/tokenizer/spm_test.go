package tokenizer

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

// tinySPM is a hand-made SentencePiece vocabulary: <unk>, <s>, </s>, byte
// tokens for a few bytes only, and pieces whose scores decide the merges.
func tinySPM(t *testing.T) *Tokenizer {
	t.Helper()
	c := Config{Model: ModelLlama, BOS: 1, EOS: 2, EOT: -1, PAD: -1, UNK: 0, AddBOS: true, AddSpacePrefix: true}
	add := func(tok string, typ int32, score float32) {
		c.Tokens = append(c.Tokens, tok)
		c.Types = append(c.Types, typ)
		c.Scores = append(c.Scores, score)
	}
	add("<unk>", TypeUnknown, 0)
	add("<s>", TypeControl, 0)
	add("</s>", TypeControl, 0)
	for _, b := range []byte{0xE2, 0x82, 0xAC, '\n'} {
		add(fmt.Sprintf("<0x%02X>", b), TypeByte, 0)
	}
	for _, p := range []struct {
		s     string
		score float32
	}{{"▁", -1}, {"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -2}, {"▁a", -3}, {"▁abc", -4}, {"abc", -6}, {"▁b", -7}} {
		add(p.s, TypeNormal, p.score)
	}
	add("<tag>", TypeUserDefined, 0)
	tok, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestSPMHandMade(t *testing.T) {
	tok := tinySPM(t)
	id := func(s string) int32 {
		i, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return i
	}
	cases := []struct {
		in   string
		opt  EncodeOptions
		want []string
	}{
		// "▁abc": pairs ▁a(-3) ab(-5) bc(-2): bc first, then ▁a, then ▁a+bc = ▁abc (-4).
		{"abc", EncodeOptions{}, []string{"▁abc"}},
		{"abc", EncodeOptions{AddSpecial: true}, []string{"<s>", "▁abc"}},
		// "▁b▁a": ▁b(-7) and ▁a(-3): both merge.
		{"b a", EncodeOptions{}, []string{"▁b", "▁a"}},
		// Byte fallback: € is E2 82 AC, all three byte tokens exist.
		{"€", EncodeOptions{}, []string{"▁", "<0xE2>", "<0x82>", "<0xAC>"}},
		// "é" has no byte tokens: the unknown token.
		{"é", EncodeOptions{}, []string{"▁", "<unk>"}},
		// Control tokens only with ParseSpecial; the space prefix restarts after them.
		{"a</s>a", EncodeOptions{ParseSpecial: true}, []string{"▁a", "</s>", "▁a"}},
		{"a<tag>b", EncodeOptions{}, []string{"▁a", "<tag>", "▁b"}},
		{"", EncodeOptions{AddSpecial: true}, []string{"<s>"}},
	}
	for _, c := range cases {
		var want []int32
		for _, s := range c.want {
			want = append(want, id(s))
		}
		if got := tok.Encode(c.in, c.opt); !slices.Equal(got, want) {
			t.Errorf("%q %+v: got %v want %v", c.in, c.opt, got, want)
		}
	}
	// Decoding drops the prefixed space and reassembles bytes.
	if got := tok.Decode(tok.Encode("b a€", EncodeOptions{AddSpecial: true})); got != "<s> b a€" {
		t.Errorf("decode with BOS: %q", got)
	}
	if got := tok.Decode(tok.Encode("b a€", EncodeOptions{})); got != "b a€" {
		t.Errorf("decode: %q", got)
	}
}

func TestGGUFRoundTrip(t *testing.T) {
	for _, name := range []string{"qwen3", "llama2"} {
		c := refTokenizer(t, name).Config()
		w := gguf.NewWriter()
		for _, kv := range c.GGUFKV() {
			w.Set(kv.Key, kv.Value)
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		got, err := FromGGUF(f)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("%s: config changed in the GGUF round trip", name)
			a, b := reflect.ValueOf(got), reflect.ValueOf(c)
			for i := range a.NumField() {
				if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
					t.Logf("field %s differs", a.Type().Field(i).Name)
				}
			}
		}
		// Absent optional keys take their defaults.
		w = gguf.NewWriter()
		w.Set(KeyModel, "gpt2")
		w.Set(KeyTokens, c.Tokens[:300])
		buf.Reset()
		w.WriteTo(&buf)
		f, _ = gguf.Parse(buf.Bytes())
		got, err = FromGGUF(f)
		if err != nil || got.BOS != -1 || got.EOS != -1 || got.Pre != PreDefault || got.AddBOS {
			t.Errorf("defaults: %+v %v", got.BOS, err)
		}
	}
	// Wrong types and out-of-range ids are errors.
	w := gguf.NewWriter()
	w.Set(KeyModel, "gpt2")
	w.Set(KeyTokens, []string{"a", "b"})
	w.Set(KeyBOS, uint32(7))
	var buf bytes.Buffer
	w.WriteTo(&buf)
	f, _ := gguf.Parse(buf.Bytes())
	if _, err := FromGGUF(f); err == nil {
		t.Error("BOS outside the vocabulary accepted")
	}
	w.Set(KeyBOS, "x")
	buf.Reset()
	w.WriteTo(&buf)
	f, _ = gguf.Parse(buf.Bytes())
	if _, err := FromGGUF(f); err == nil {
		t.Error("string BOS accepted")
	}
}

func TestNewRejects(t *testing.T) {
	good := Config{Model: ModelGPT2, Pre: PreQwen2, BOS: -1, EOS: -1, EOT: -1, PAD: -1, UNK: -1}
	for b := range 256 {
		good.Tokens = append(good.Tokens, string(byteToRune[b]))
	}
	if _, err := New(good); err != nil {
		t.Fatalf("minimal byte-level config: %v", err)
	}
	for name, mut := range map[string]func(*Config){
		"model":      func(c *Config) { c.Model = "wordpiece" },
		"pre":        func(c *Config) { c.Pre = "mystery" },
		"types":      func(c *Config) { c.Types = []int32{1} },
		"bos":        func(c *Config) { c.BOS = 1000 },
		"merge":      func(c *Config) { c.Merges = []string{"ab"} },
		"no-byte":    func(c *Config) { c.Tokens = c.Tokens[:200] },
		"spm-scores": func(c *Config) { c.Model = ModelLlama },
	} {
		c := good
		c.Tokens = slices.Clone(good.Tokens)
		mut(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
