package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The byte-level BPE models split text into pre-tokens with a regular
// expression before merging. The published patterns need lookahead
// (`\s+(?!\S)`), which Go's regexp lacks, so each is written out by hand
// here as a leftmost-first matcher that tries the alternatives in the order
// the pattern lists them, with the backtracking the pattern implies.
//
// Llama 3 ("llama-bpe"):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Qwen2 / Qwen3 ("qwen2"): the same with \p{N} instead of \p{N}{1,3}.
//
// GPT-2 ("default"):
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// Character classes: \p{L} and \p{N} are the Unicode general categories;
// \s is ECMAScript's white space (the reference implementation is
// JavaScript), which differs from Unicode White_Space in including U+FEFF
// and excluding U+0085. The case-insensitive contractions match ASCII
// letters only, as the reference does.

// splitter yields the end offset of the pre-token starting at i in s
// (i < len(s)); it always makes progress.
type splitter func(s string, i int) int

type preKind uint8

const (
	preGPT2 preKind = iota
	preLlama3
	preQwen2
)

func splitterFor(pre string) (preKind, bool) {
	switch pre {
	case PreLlamaBPE, "llama3", "llama-v3", "smaug-bpe":
		return preLlama3, true
	case PreQwen2, "qwen3", "deepseek-r1-qwen":
		return preQwen2, true
	case PreDefault, "gpt2", "gpt-2", "":
		return preGPT2, true
	}
	return 0, false
}

// isSpace is ECMAScript \s.
func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

// decode returns the rune at s[i:] and its width. An invalid byte decodes
// as a width-1 rune that belongs to no letter, number or space class, so
// it ends up in a punctuation run and keeps its byte in byte-level BPE.
func decode(s string, i int) (rune, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// contraction returns the length of an English contraction at s[i:]
// ("'s", "'T", "'re", "'LL", ...), 0 if none.
func contraction(s string, i int) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	lower := func(b byte) byte { return b | 0x20 }
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		if isASCIILetter(s[i+1]) {
			return 2
		}
	case 'r':
		if i+2 < len(s) && lower(s[i+2]) == 'e' && isASCIILetter(s[i+2]) {
			return 3
		}
	case 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' && isASCIILetter(s[i+2]) {
			return 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' && isASCIILetter(s[i+2]) {
			return 3
		}
	}
	return 0
}

func isASCIILetter(b byte) bool { return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' }

// gpt2Contraction is the case-sensitive contraction of the GPT-2 pattern.
func gpt2Contraction(s string, i int) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	switch s[i+1] {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && s[i+2] == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && s[i+2] == 'l' {
			return 3
		}
	}
	return 0
}

// spaceTail handles the whitespace alternatives shared by all patterns:
// for a whitespace run s[i:k] it returns the end of `\s+(?!\S)` if that
// matches, else of `\s+`. (Run length >= 1 is guaranteed by the caller.)
func spaceTail(s string, i, k int) int {
	if k == len(s) {
		return k
	}
	// Give back the last whitespace character so the lookahead sees
	// whitespace rather than the non-space that follows the run.
	_, w := utf8.DecodeLastRuneInString(s[i:k])
	if k-w > i {
		return k - w
	}
	return k
}

// spaceRun returns the end of the whitespace run starting at i and the
// end of its last \r or \n (0 if it contains none).
func spaceRun(s string, i int) (end, lastNL int) {
	j := i
	for j < len(s) {
		r, w := decode(s, j)
		if !isSpace(r) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = j + 1
		}
		j += w
	}
	return j, lastNL
}

// splitLlamaLike implements the Llama 3 pattern (maxDigits 3) and the
// Qwen2 pattern (maxDigits 1).
func splitLlamaLike(s string, i int, maxDigits int) int {
	if n := contraction(s, i); n > 0 {
		return i + n
	}
	r, w := decode(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	letters := func(j int) int {
		for j < len(s) {
			r, w := decode(s, j)
			if !isLetter(r) {
				break
			}
			j += w
		}
		return j
	}
	if isLetter(r) {
		return letters(i + w)
	}
	if r != '\r' && r != '\n' && !isNumber(r) && i+w < len(s) {
		if r2, _ := decode(s, i+w); isLetter(r2) {
			return letters(i + w)
		}
	}
	// \p{N}{1,n}
	if isNumber(r) {
		j := i + w
		for n := 1; n < maxDigits && j < len(s); n++ {
			r, w := decode(s, j)
			if !isNumber(r) {
				break
			}
			j += w
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	if j := punctRun(s, i, r, w); j > 0 {
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Only whitespace remains.
	k, lastNL := spaceRun(s, i)
	if lastNL > 0 { // \s*[\r\n]+
		return lastNL
	}
	return spaceTail(s, i, k)
}

// punctRun matches ` ?[^\s\p{L}\p{N}]+` at i (r, w being the rune there)
// and returns its end, or 0.
func punctRun(s string, i int, r rune, w int) int {
	j := i
	if r == ' ' {
		j += w
		if j >= len(s) {
			return 0
		}
	}
	start := j
	for j < len(s) {
		r, w := decode(s, j)
		if isSpace(r) || isLetter(r) || isNumber(r) {
			break
		}
		j += w
	}
	if j == start {
		return 0
	}
	return j
}

// splitGPT2 implements the GPT-2 pattern.
func splitGPT2(s string, i int) int {
	if n := gpt2Contraction(s, i); n > 0 {
		return i + n
	}
	r, w := decode(s, i)
	j := i
	if r == ' ' && i+w < len(s) {
		j += w
		r, w = decode(s, j)
	}
	// ` ?\p{L}+` and ` ?\p{N}+`
	for _, class := range [...]func(rune) bool{isLetter, isNumber} {
		if class(r) {
			k := j + w
			for k < len(s) {
				r, w := decode(s, k)
				if !class(r) {
					break
				}
				k += w
			}
			return k
		}
	}
	r, w = decode(s, i)
	if j := punctRun(s, i, r, w); j > 0 {
		return j
	}
	k, _ := spaceRun(s, i)
	return spaceTail(s, i, k)
}

// preTokenize calls fn with each pre-token of s in order.
func preTokenize(kind preKind, s string, fn func(piece string)) {
	for i := 0; i < len(s); {
		var j int
		switch kind {
		case preLlama3:
			j = splitLlamaLike(s, i, 3)
		case preQwen2:
			j = splitLlamaLike(s, i, 1)
		default:
			j = splitGPT2(s, i)
		}
		if j <= i { // cannot happen: every rune belongs to one class
			j = i + 1
		}
		fn(s[i:j])
		i = j
	}
}
