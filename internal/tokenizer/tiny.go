package tokenizer

import "strings"

// Tiny returns a complete byte-level BPE configuration small enough for
// test models of a few hundred kilobytes: the 256 bytes under GPT-2's
// byte-to-unicode mapping, four merges, and the ChatML control tokens
// <|endoftext|> (BOS and padding), <|im_start|> and <|im_end|> (EOS and
// EOT, so generation ends on it), with a plain ChatML chat template. Every
// string encodes (the bytes cover everything), so tests can use real text.
func Tiny() Config {
	var toks []string
	var types []int32
	shift := 0
	for b := range 256 {
		r := rune(b)
		// GPT-2's byte-to-symbol map: printable Latin-1 stays, the rest
		// shifts up past 255.
		if !(b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae) {
			r = rune(256 + shift)
			shift++
		}
		toks = append(toks, string(r))
		types = append(types, TypeNormal)
	}
	merges := []string{"Ġ t", "h e", "Ġt he", "i n"}
	for _, m := range merges {
		toks = append(toks, strings.ReplaceAll(m, " ", ""))
		types = append(types, TypeNormal)
	}
	for _, s := range []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"} {
		toks = append(toks, s)
		types = append(types, TypeControl)
	}
	n := int32(len(toks))
	return Config{
		Model: ModelGPT2, Pre: PreQwen2, Tokens: toks, Types: types, Merges: merges,
		BOS: n - 3, EOS: n - 1, EOT: n - 1, PAD: n - 3, UNK: -1,
		ChatTemplate: "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}" +
			"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
	}
}
