package tokenizer

import "testing"

func TestTinyRoundTripsAndChats(t *testing.T) {
	tok, err := New(Tiny())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"the thin tin", "héllo, 世界 🙂", "\x00\t\n  x"} {
		ids := tok.Encode(s, EncodeOptions{})
		if got := tok.Decode(ids); got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
	}
	if ids := tok.Encode(" the", EncodeOptions{}); len(ids) != 1 {
		t.Errorf("merges not applied: %q encodes to %v", " the", ids)
	}
	if !tok.IsEOG(tok.EOS()) || tok.TokenText(tok.EOS()) != "<|im_end|>" {
		t.Errorf("EOS is %q, want <|im_end|> ending generation", tok.TokenText(tok.EOS()))
	}
	got, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, true)
	if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"; err != nil || got != want {
		t.Errorf("chat = %q, %v; want %q", got, err, want)
	}
}
