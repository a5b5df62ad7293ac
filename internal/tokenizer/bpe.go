package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Byte-level BPE stores tokens as text in which every byte is one printable
// character: GPT-2's bytes_to_unicode table keeps the printable Latin-1
// bytes (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) and maps the other 68 bytes, in
// order, to U+0100 onwards.
var byteToRune, runeToByte = byteLevelTables()

// runeToByte is indexed by rune (all byte-level runes are below 0x144);
// -1 marks runes outside the table.
func byteLevelTables() (b2r [256]rune, r2b [0x144]int16) {
	for i := range r2b {
		r2b[i] = -1
	}
	n := rune(0)
	for b := range 256 {
		if b >= 0x21 && b <= 0x7E || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			b2r[b] = rune(b)
		} else {
			b2r[b] = 256 + n
			n++
		}
		r2b[b2r[b]] = int16(b)
	}
	return b2r, r2b
}

// byteLevelDecode turns byte-level token text into the bytes it stands for;
// ok is false if s contains a character outside the table.
func byteLevelDecode(s string) (string, bool) {
	ascii := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf || runeToByte[c] < 0 {
			ascii = false
			break
		}
	}
	if ascii { // printable ASCII maps to itself
		return s, true
	}
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r >= rune(len(runeToByte)) || runeToByte[r] < 0 {
			return "", false
		}
		b = append(b, byte(runeToByte[r]))
	}
	return string(b), true
}

// byteLevelEncode is the inverse of byteLevelDecode.
func byteLevelEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteToRune[s[i]])
	}
	return b.String()
}

// scratch holds the per-call working memory of the merge loops, reused
// across the pre-tokens of one Encode call.
type scratch struct {
	sym  []symbol
	heap pairHeap
}

// symbol is one node of the doubly linked list of a word's current tokens.
type symbol struct {
	id         int32
	start, end int32 // byte range in the word (SPM)
	prev, next int32 // -1 at the ends
	dead       bool
}

// candidate is a possible merge of sym[left] with its successor. It is
// stale if either side changed since it was queued; the left/right ids
// detect that.
type candidate struct {
	prio  float64 // lower first: merge rank (BPE) or -score (SPM)
	left  int32
	lid   int32
	rid   int32
	size  int32 // SPM: byte length of the pair, to detect staleness
	merge int32
}

// pairHeap is a binary min-heap of candidates (typed, so pushing does not
// box values the way container/heap would).
type pairHeap []candidate

func (c candidate) before(d candidate) bool {
	if c.prio != d.prio {
		return c.prio < d.prio
	}
	return c.left < d.left // ties: leftmost first
}

func (h *pairHeap) push(c candidate) {
	*h = append(*h, c)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].before(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *pairHeap) pop() candidate {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && s[l].before(s[m]) {
			m = l
		}
		if l+1 < n && s[l+1].before(s[m]) {
			m = l + 1
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// bpeWord appends the tokens of one pre-token (raw bytes).
func (t *Tokenizer) bpeWord(out []int32, word string, sc *scratch) []int32 {
	if len(word) == 0 {
		return out
	}
	if len(word) == 1 {
		return append(out, t.byteTok[word[0]])
	}
	if t.ignMerg {
		if id, ok := t.vocab[word]; ok {
			return append(out, id)
		}
	}
	if len(word) <= cacheMaxWord {
		if ids, ok := t.cache.get(word); ok {
			return append(out, ids...)
		}
		n := len(out)
		if len(word) <= smallWord {
			out = t.bpeSmall(out, word)
		} else {
			out = t.bpeHeap(out, word, sc)
		}
		t.cache.put(word, append([]int32(nil), out[n:]...))
		return out
	}
	return t.bpeHeap(out, word, sc)
}

// bpeHeap merges with a priority queue of candidate pairs: O(n log n) for
// long pre-tokens (runs of spaces, digits or base64).
func (t *Tokenizer) bpeHeap(out []int32, word string, sc *scratch) []int32 {
	sym := sc.sym[:0]
	for i := 0; i < len(word); i++ {
		sym = append(sym, symbol{id: t.byteTok[word[i]], prev: int32(i) - 1, next: int32(i) + 1})
	}
	sym[len(sym)-1].next = -1
	h := sc.heap[:0]
	push := func(l int32) {
		r := sym[l].next
		if r < 0 {
			return
		}
		if m, ok := t.merges[pairKey(sym[l].id, sym[r].id)]; ok {
			h.push(candidate{prio: float64(m.rank), left: l, lid: sym[l].id, rid: sym[r].id, merge: m.id})
		}
	}
	for i := range sym {
		push(int32(i))
	}
	for len(h) > 0 {
		c := h.pop()
		l := &sym[c.left]
		if l.dead || l.id != c.lid || l.next < 0 || sym[l.next].id != c.rid {
			continue
		}
		r := &sym[l.next]
		l.id = c.merge
		r.dead = true
		l.next = r.next
		if r.next >= 0 {
			sym[r.next].prev = c.left
		}
		if l.prev >= 0 {
			push(l.prev)
		}
		push(c.left)
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		out = append(out, sym[i].id)
	}
	sc.sym, sc.heap = sym, h
	return out
}

// smallWord is the pre-token length up to which bpeSmall's quadratic scan
// beats the heap (most words are short).
const smallWord = 32

// bpeSmall is bpeWord for short words: arrays on the stack, a linear scan
// for the lowest-ranked (then leftmost) pair.
func (t *Tokenizer) bpeSmall(out []int32, word string) []int32 {
	const none = int32(1<<31 - 1)
	var ids, ranks, merged [smallWord]int32
	n := len(word)
	for i := range n {
		ids[i] = t.byteTok[word[i]]
	}
	rank := func(i int) {
		if m, ok := t.merges[pairKey(ids[i], ids[i+1])]; ok {
			ranks[i], merged[i] = m.rank, m.id
		} else {
			ranks[i] = none
		}
	}
	for i := range n - 1 {
		rank(i)
	}
	for n > 1 {
		best := 0
		for i := 1; i < n-1; i++ {
			if ranks[i] < ranks[best] {
				best = i
			}
		}
		if ranks[best] == none {
			break
		}
		ids[best] = merged[best]
		copy(ids[best+1:n], ids[best+2:n])
		if best+2 < n {
			copy(ranks[best+1:], ranks[best+2:n-1])
			copy(merged[best+1:], merged[best+2:n-1])
		}
		n--
		if best > 0 {
			rank(best - 1)
		}
		if best < n-1 {
			rank(best)
		}
	}
	return append(out, ids[:n]...)
}

// encodeSPM tokenizes a fragment the SentencePiece way: spaces become "▁"
// (with one prefixed when the fragment starts the text or follows a special
// token), characters are merged pairwise by the score of the merged piece,
// highest first, and pieces outside the vocabulary fall back to <0xXX>
// byte tokens (or the unknown token).
func (t *Tokenizer) encodeSPM(out []int32, s string, prevSpecial bool, sc *scratch) []int32 {
	if t.addPrefix && prevSpecial {
		s = " " + s
	}
	s = strings.ReplaceAll(s, " ", "▁")
	sym := sc.sym[:0]
	for i := 0; i < len(s); {
		_, w := utf8.DecodeRuneInString(s[i:])
		n := int32(len(sym))
		sym = append(sym, symbol{start: int32(i), end: int32(i + w), prev: n - 1, next: n + 1})
		i += w
	}
	if len(sym) == 0 {
		return out
	}
	sym[len(sym)-1].next = -1
	h := sc.heap[:0]
	push := func(l int32) {
		r := sym[l].next
		if r < 0 {
			return
		}
		id, ok := t.vocab[s[sym[l].start:sym[r].end]]
		if !ok {
			return
		}
		h.push(candidate{prio: -float64(t.scores[id]), left: l, size: sym[r].end - sym[l].start, lid: sym[l].end - sym[l].start, merge: id})
	}
	for i := range sym {
		push(int32(i))
	}
	for len(h) > 0 {
		c := h.pop()
		l := &sym[c.left]
		if l.dead || l.next < 0 || l.end-l.start != c.lid || sym[l.next].end-l.start != c.size {
			continue
		}
		r := &sym[l.next]
		l.end = r.end
		r.dead = true
		l.next = r.next
		if r.next >= 0 {
			sym[r.next].prev = c.left
		}
		if l.prev >= 0 {
			push(l.prev)
		}
		push(c.left)
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		piece := s[sym[i].start:sym[i].end]
		if id, ok := t.vocab[piece]; ok {
			out = append(out, id)
			continue
		}
		all := true
		for j := 0; j < len(piece); j++ {
			all = all && t.byteTok[piece[j]] >= 0
		}
		switch {
		case all:
			for j := 0; j < len(piece); j++ {
				out = append(out, t.byteTok[piece[j]])
			}
		case t.cfg.UNK >= 0:
			out = append(out, t.cfg.UNK)
		}
	}
	sc.sym, sc.heap = sym, h
	return out
}
