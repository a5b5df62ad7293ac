package tokenizer

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"strings"
)

// EncodeOptions control special-token handling in Encode.
type EncodeOptions struct {
	// AddSpecial adds BOS/EOS as the tokenizer's AddBOS/AddEOS say.
	AddSpecial bool
	// ParseSpecial recognises the text of control tokens (and the
	// unknown token) in the input, e.g. "<|im_start|>", and emits their
	// ids. Without it that text is tokenized like any other text.
	// User-defined tokens (type 4, e.g. Qwen3's "<think>") are always
	// recognised, as llama.cpp and Hugging Face tokenizers do.
	ParseSpecial bool
}

// Tokenizer is a compiled Config. It is immutable and safe for concurrent
// use.
type Tokenizer struct {
	cfg     Config
	spm     bool
	pre     preKind
	ignMerg bool // a pre-token that is itself a vocabulary entry skips merging (Llama 3)

	// pieces[id] is the text a token decodes to: raw bytes for byte-level
	// BPE tokens, "▁"→" " and <0xXX>→byte for SentencePiece tokens, the
	// stored text for control and user-defined tokens.
	pieces []string
	// byteTok is the token of each single byte: byte-level BPE's base
	// alphabet, or SentencePiece's <0xXX> fallback tokens (-1 if none).
	byteTok [256]int32

	// vocab maps the (decoded) text of mergeable tokens to their id.
	vocab map[string]int32
	// merges maps a pair of token ids to the rank of their merge and the
	// merged token (byte-level BPE).
	merges map[uint64]merge
	scores []float32

	// specials are the texts recognised before pre-tokenization, sorted
	// longest first within each first byte.
	specials   [256][]special
	eog        map[int32]bool
	cache      *wordCache
	addPrefix  bool
	stripFirst bool // SPM decode drops the space the prefix added
}

type merge struct {
	rank int32
	id   int32
}

type special struct {
	text   string
	id     int32
	always bool // user-defined: recognised even without ParseSpecial
}

// ErrNoChatTemplate is returned by ApplyChatTemplate when the tokenizer's
// chat template is absent or not one of the templates this package knows.
var ErrNoChatTemplate = errors.New("tokenizer: no known chat template")

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// New validates c and compiles it.
func New(c Config) (*Tokenizer, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	kind, ok := splitterFor(c.Pre)
	if !ok && c.Model == ModelGPT2 {
		return nil, fmt.Errorf("%w: pre-tokenizer %q not supported (supported: llama-bpe, qwen2, default)", ErrBadConfig, c.Pre)
	}
	t := &Tokenizer{
		cfg:     c,
		spm:     c.Model == ModelLlama,
		pre:     kind,
		ignMerg: kind == preLlama3,
		pieces:  make([]string, len(c.Tokens)),
		vocab:   make(map[string]int32, len(c.Tokens)),
		eog:     map[int32]bool{},
		cache:   &wordCache{seed: maphash.MakeSeed()},
		scores:  c.Scores,
	}
	for i := range t.byteTok {
		t.byteTok[i] = -1
	}
	typ := func(id int) int32 {
		if c.Types == nil {
			return TypeNormal
		}
		return c.Types[id]
	}
	for id, tok := range c.Tokens {
		ty := typ(id)
		switch ty {
		case TypeControl, TypeUnknown, TypeUserDefined:
			t.pieces[id] = tok
			if tok != "" {
				t.specials[tok[0]] = append(t.specials[tok[0]], special{tok, int32(id), ty == TypeUserDefined})
			}
			if ty == TypeUserDefined {
				// User-defined tokens are ordinary vocabulary to the merge
				// step as well (SentencePiece treats them so).
				if t.spm {
					t.vocab[strings.ReplaceAll(tok, " ", "▁")] = int32(id)
				}
			}
			continue
		case TypeUnused:
			t.pieces[id] = tok
			continue
		}
		if t.spm {
			if b, ok := parseByteToken(tok); ok && (ty == TypeByte || c.Types == nil) {
				t.pieces[id] = string([]byte{b})
				t.byteTok[b] = int32(id)
				continue
			}
			t.pieces[id] = strings.ReplaceAll(tok, "▁", " ")
			t.vocab[tok] = int32(id)
			continue
		}
		raw, ok := byteLevelDecode(tok)
		if !ok {
			// Not byte-level text (a few vocabularies carry such tokens);
			// it can be decoded but never produced by merging.
			t.pieces[id] = tok
			continue
		}
		t.pieces[id] = raw
		if _, dup := t.vocab[raw]; !dup {
			t.vocab[raw] = int32(id)
		}
		if len(raw) == 1 && t.byteTok[raw[0]] < 0 {
			t.byteTok[raw[0]] = int32(id)
		}
	}
	for _, l := range &t.specials {
		sort.SliceStable(l, func(i, j int) bool { return len(l[i].text) > len(l[j].text) })
	}
	if t.spm {
		if c.Scores == nil {
			return nil, fmt.Errorf("%w: llama tokenizer without scores", ErrBadConfig)
		}
		t.addPrefix = c.AddSpacePrefix
		t.stripFirst = c.AddSpacePrefix
	} else {
		for b := range 256 {
			if t.byteTok[b] < 0 {
				return nil, fmt.Errorf("%w: byte-level vocabulary lacks byte 0x%02x", ErrBadConfig, b)
			}
		}
		t.merges = make(map[uint64]merge, len(c.Merges))
		for rank, m := range c.Merges {
			l, r, ok := splitMerge(m)
			if !ok {
				return nil, fmt.Errorf("%w: merge %d is not two space-separated tokens", ErrBadConfig, rank)
			}
			lr, ok1 := byteLevelDecode(l)
			rr, ok2 := byteLevelDecode(r)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("%w: merge %d is not byte-level text", ErrBadConfig, rank)
			}
			li, ok1 := t.vocab[lr]
			ri, ok2 := t.vocab[rr]
			mi, ok3 := t.vocab[lr+rr]
			if !ok1 || !ok2 || !ok3 {
				// Merges into tokens the vocabulary lacks can never apply.
				continue
			}
			k := pairKey(li, ri)
			if _, dup := t.merges[k]; !dup {
				t.merges[k] = merge{rank: int32(rank), id: mi}
			}
		}
	}
	for _, id := range []int32{c.EOS, c.EOT} {
		if id >= 0 {
			t.eog[id] = true
		}
	}
	// Tokens that end a turn in the families supported, whether or not the
	// metadata names them (llama.cpp does the same).
	for id, tok := range c.Tokens {
		if typ(id) != TypeControl && typ(id) != TypeUserDefined {
			continue
		}
		switch tok {
		case "<|eot_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>", "<|eom_id|>", "</s>", "<|end|>":
			t.eog[int32(id)] = true
		}
	}
	return t, nil
}

func splitMerge(m string) (string, string, bool) {
	i := strings.IndexByte(m, ' ')
	if i <= 0 || i == len(m)-1 || strings.IndexByte(m[i+1:], ' ') >= 0 {
		return "", "", false
	}
	return m[:i], m[i+1:], true
}

func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	var b byte
	for _, c := range []byte(s[3:5]) {
		b <<= 4
		switch {
		case '0' <= c && c <= '9':
			b |= c - '0'
		case 'A' <= c && c <= 'F':
			b |= c - 'A' + 10
		case 'a' <= c && c <= 'f':
			b |= c - 'a' + 10
		default:
			return 0, false
		}
	}
	return b, true
}

// Config returns the configuration t was built from. Its slices are shared
// with t: treat them as read-only.
func (t *Tokenizer) Config() Config { return t.cfg }

// VocabSize is the number of token ids.
func (t *Tokenizer) VocabSize() int { return len(t.cfg.Tokens) }

// BOS is the beginning-of-sequence token, -1 if none.
func (t *Tokenizer) BOS() int32 { return t.cfg.BOS }

// EOS is the end-of-sequence token, -1 if none.
func (t *Tokenizer) EOS() int32 { return t.cfg.EOS }

// IsEOG reports whether id ends generation: EOS, EOT, and the end-of-turn
// control tokens of the supported families.
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

// EOGs returns the end-of-generation ids in increasing order.
func (t *Tokenizer) EOGs() []int32 {
	ids := make([]int32, 0, len(t.eog))
	for id := range t.eog {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// TokenText is the vocabulary entry of id as stored ("" if out of range).
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= len(t.cfg.Tokens) {
		return ""
	}
	return t.cfg.Tokens[id]
}

// TokenID returns the id of the vocabulary entry text (a linear scan: for
// setup and tests, not for hot paths).
func (t *Tokenizer) TokenID(text string) (int32, bool) {
	for id, tok := range t.cfg.Tokens {
		if tok == text {
			return int32(id), true
		}
	}
	return -1, false
}

// Encode tokenizes text. It never fails: bytes the vocabulary cannot
// represent become byte tokens or the unknown token.
func (t *Tokenizer) Encode(text string, opt EncodeOptions) []int32 {
	out := make([]int32, 0, len(text)/3+4)
	if opt.AddSpecial && t.cfg.AddBOS && t.cfg.BOS >= 0 {
		out = append(out, t.cfg.BOS)
	}
	var sc scratch
	prevSpecial := true // SentencePiece prefixes a space to text after a special token
	start := 0
	for i := 0; i < len(text); {
		if sp, ok := t.matchSpecial(text, i, opt.ParseSpecial); ok {
			if start < i {
				out = t.encodeText(out, text[start:i], prevSpecial, &sc)
			}
			out = append(out, sp.id)
			prevSpecial = true
			i += len(sp.text)
			start = i
			continue
		}
		i++
	}
	if start < len(text) {
		out = t.encodeText(out, text[start:], prevSpecial, &sc)
	}
	if opt.AddSpecial && t.cfg.AddEOS && t.cfg.EOS >= 0 {
		out = append(out, t.cfg.EOS)
	}
	return out
}

func (t *Tokenizer) matchSpecial(text string, i int, parseSpecial bool) (special, bool) {
	l := t.specials[text[i]]
	for _, sp := range l {
		if (parseSpecial || sp.always) && strings.HasPrefix(text[i:], sp.text) {
			return sp, true
		}
	}
	return special{}, false
}

// encodeText tokenizes a fragment that contains no special token.
func (t *Tokenizer) encodeText(out []int32, s string, prevSpecial bool, sc *scratch) []int32 {
	if t.spm {
		return t.encodeSPM(out, s, prevSpecial, sc)
	}
	if t.pre == preQwen2 {
		s = nfc(s)
	}
	preTokenize(t.pre, s, func(piece string) {
		out = t.bpeWord(out, piece, sc)
	})
	return out
}

// Decode renders ids as text. Control tokens render as their text; byte
// sequences that are not valid UTF-8 become U+FFFD (one per maximal
// invalid subsequence, as WHATWG decoders do). Out-of-range ids render as
// nothing.
func (t *Tokenizer) Decode(ids []int32) string {
	var raw []byte
	for _, id := range ids {
		if id < 0 || int(id) >= len(t.pieces) {
			continue
		}
		raw = append(raw, t.pieces[id]...)
	}
	if t.stripFirst && len(raw) > 0 && raw[0] == ' ' {
		raw = raw[1:]
	}
	return toValidUTF8(raw)
}

// Piece is the raw bytes id decodes to (possibly part of a UTF-8
// sequence), "" when out of range.
func (t *Tokenizer) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	return t.pieces[id]
}

// IsControl reports whether id is a control, unknown or unused token:
// one that stands for structure rather than text (callers that show
// generated text usually skip these, as llama.cpp does by default).
func (t *Tokenizer) IsControl(id int32) bool {
	if id < 0 || int(id) >= len(t.cfg.Tokens) || t.cfg.Types == nil {
		return false
	}
	switch t.cfg.Types[id] {
	case TypeControl, TypeUnknown, TypeUnused:
		return true
	}
	return false
}
