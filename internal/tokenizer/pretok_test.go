package tokenizer

import (
	"encoding/json"
	"slices"
	"testing"
)

func splitAll(kind preKind, s string) []string {
	var out []string
	preTokenize(kind, s, func(p string) { out = append(out, p) })
	return out
}

// Splits worked out by hand from the regexes (see pretok.go); the
// reference encodings test the same code at scale.
func TestPreTokenizers(t *testing.T) {
	cases := []struct {
		kind preKind
		in   string
		want []string
	}{
		{preLlama3, "Hello world", []string{"Hello", " world"}},
		{preLlama3, "a   b", []string{"a", "  ", " b"}},       // \s+(?!\S) leaves the last space to the word
		{preLlama3, "end   ", []string{"end", "   "}},         // at the end the whole run
		{preLlama3, "x \n\n y", []string{"x", " \n\n", " y"}}, // \s*[\r\n]+ ends at the last newline
		{preLlama3, "12345678", []string{"123", "456", "78"}}, // \p{N}{1,3}
		{preQwen2, "12345678", []string{"1", "2", "3", "4", "5", "6", "7", "8"}},
		{preLlama3, "I'm DON'T we'Ll", []string{"I", "'m", " DON", "'T", " we", "'Ll"}},
		{preLlama3, "'sam", []string{"'s", "am"}},
		{preLlama3, "$abc", []string{"$abc"}},                   // [^\r\n\p{L}\p{N}]?\p{L}+
		{preLlama3, "\nabc", []string{"\n", "abc"}},             // but not a newline
		{preLlama3, "  !!\n\nx", []string{" ", " !!\n\n", "x"}}, // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
		{preLlama3, "3rd", []string{"3", "rd"}},
		{preLlama3, "\t\tfoo", []string{"\t", "\tfoo"}},
		{preLlama3, " ", []string{" "}},
		{preLlama3, "a\u00a0b", []string{"a", "\u00a0b"}},
		{preQwen2, "你好，世界", []string{"你好", "，世界"}},
		{preGPT2, "Hello  world's 123", []string{"Hello", " ", " world", "'s", " 123"}},
		{preGPT2, "a\n\nb", []string{"a", "\n", "\n", "b"}},
		{preGPT2, "x  ?!", []string{"x", " ", " ?!"}},
		{preLlama3, "a\xffb", []string{"a", "\xffb"}}, // invalid byte: punctuation-like
	}
	for _, c := range cases {
		if got := splitAll(c.kind, c.in); !slices.Equal(got, c.want) {
			t.Errorf("%d %q: got %q want %q", c.kind, c.in, got, c.want)
		}
	}
}

func TestNFC(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"e\u0301", "é"},
		{"A\u030a\u0301", "\u01fa"}, // Å + acute composes in two steps
		{"a\u0323\u0302", "\u1ead"}, // reordered marks: ậ
		{"a\u0302\u0323", "\u1ead"}, // canonical order first
		{"\u1100\u1161\u11a8", "각"}, // Hangul LVT
		{"\u212b", "\u00c5"},        // singleton (Angstrom sign)
		{"\u0958", "\u0915\u093c"},  // composition exclusion stays decomposed
		{"plain ascii", "plain ascii"},
		{"e\u0301\xffe\u0301", "é\xffé"}, // invalid bytes pass through
		{"e\x80\u0301", "e\x80\u0301"},
		{"xe\u0301y\u0301\u0327z", "x\u00e9\u00fd\u0327z"},
		{"\u0301", "\u0301"},
		{"\u0301a", "\u0301a"}, // leading non-starter
		{"가\u11a8", "각"},       // LV + T
	} {
		if got := nfc(c.in); got != c.want {
			t.Errorf("nfc(%+q) = %+q, want %+q", c.in, got, c.want)
		}
	}
}

// TestNFCVectors checks nfc against Python's unicodedata on every
// decomposable rune with marks attached, and on Hangul jamo soup.
func TestNFCVectors(t *testing.T) {
	var v struct {
		Cases [][2]string `json:"cases"`
	}
	if err := json.Unmarshal(readGz(t, "testdata/nfc.json.gz"), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) < 4000 {
		t.Fatalf("only %d vectors", len(v.Cases))
	}
	bad := 0
	for _, c := range v.Cases {
		if got := nfc(c[0]); got != c[1] {
			if bad++; bad < 10 {
				t.Errorf("nfc(%+q) = %+q, want %+q", c[0], got, c[1])
			}
		}
	}
}
