package tokenizer

import (
	"sort"
	"unicode/utf8"
)

// NFC normalization (Unicode canonical composition), which Qwen's
// tokenizer.json applies to every text fragment before pre-tokenization.
// The standard library has no normalizer and the module may not depend on
// golang.org/x/text, so this is a small implementation of UAX #15 over
// tables generated from Python's unicodedata (nfc_tables.go). Nearly all
// text is already NFC and takes the fast path, which only scans.

const (
	hangulS      = 0xAC00
	hangulL      = 0x1100
	hangulV      = 0x1161
	hangulT      = 0x11A7
	hangulLCount = 19
	hangulVCount = 21
	hangulTCount = 28
	hangulNCount = hangulVCount * hangulTCount
	hangulSCount = hangulLCount * hangulNCount
)

func nfcIsUnstable(r rune) bool {
	i := sort.Search(len(nfcUnstable), func(i int) bool { return nfcUnstable[i].hi >= r })
	return i < len(nfcUnstable) && nfcUnstable[i].lo <= r
}

func combiningClass(r rune) uint8 {
	if r < 0x300 {
		return 0
	}
	i := sort.Search(len(nfcCCC), func(i int) bool { return nfcCCC[i].hi >= r })
	if i < len(nfcCCC) && nfcCCC[i].lo <= r {
		return nfcCCC[i].c
	}
	return 0
}

// decomposeRune appends the full canonical decomposition of r.
func decomposeRune(dst []rune, r rune) []rune {
	if r >= hangulS && r < hangulS+hangulSCount {
		s := r - hangulS
		dst = append(dst, hangulL+s/hangulNCount, hangulV+(s%hangulNCount)/hangulTCount)
		if t := s % hangulTCount; t != 0 {
			dst = append(dst, hangulT+t)
		}
		return dst
	}
	i := sort.Search(len(nfcDecomp), func(i int) bool { return nfcDecomp[i].r >= r })
	if i == len(nfcDecomp) || nfcDecomp[i].r != r {
		return append(dst, r)
	}
	d := nfcDecomp[i]
	dst = decomposeRune(dst, d.a)
	if d.n == 2 {
		dst = decomposeRune(dst, d.b)
	}
	return dst
}

// composePair returns the primary composite of a and b, if any.
func composePair(a, b rune) (rune, bool) {
	// Hangul LV and LVT.
	if a >= hangulL && a < hangulL+hangulLCount && b >= hangulV && b < hangulV+hangulVCount {
		return hangulS + ((a-hangulL)*hangulVCount+(b-hangulV))*hangulTCount, true
	}
	if a >= hangulS && a < hangulS+hangulSCount && (a-hangulS)%hangulTCount == 0 && b > hangulT && b < hangulT+hangulTCount {
		return a + (b - hangulT), true
	}
	i := sort.Search(len(nfcComp), func(i int) bool {
		return nfcComp[i].a > a || nfcComp[i].a == a && nfcComp[i].b >= b
	})
	if i < len(nfcComp) && nfcComp[i].a == a && nfcComp[i].b == b {
		return nfcComp[i].c, true
	}
	return 0, false
}

// nfc returns s in Normalization Form C. Invalid UTF-8 bytes are kept as
// they are (they are not characters and take no part in composition).
//
// Only the neighbourhood of runes NFC may change is normalized: a stable
// rune (a starter with no decomposition that combines with nothing before
// it) bounds what composition and reordering can reach, so the segment
// from the stable rune before an unstable run to the stable rune after it
// is normalized and the rest is copied.
func nfc(s string) string {
	var out []byte
	last := 0       // s[:last] has been handled
	prevStart := -1 // start of the last stable rune seen at or after last
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0xCC { // ASCII, continuation bytes and leads of runes below U+0300: all stable
			if c < 0x80 || c >= 0xC0 {
				prevStart = i
			}
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && w == 1 || !nfcIsUnstable(r) {
			prevStart = i
			i += w
			continue
		}
		start := i
		if prevStart >= last {
			start = prevStart
		}
		j := i + w
		for j < len(s) {
			r, w := utf8.DecodeRuneInString(s[j:])
			if r == utf8.RuneError && w == 1 || !nfcIsUnstable(r) {
				break
			}
			j += w
		}
		if out == nil {
			out = make([]byte, 0, len(s)+8)
		}
		out = append(out, s[last:start]...)
		out = nfcSegment(out, s[start:j])
		last, i, prevStart = j, j, -1
	}
	if out == nil {
		return s
	}
	return string(append(out, s[last:]...))
}

// nfcSegment appends the NFC form of seg: full canonical decomposition,
// canonical ordering, canonical composition.
// Invalid bytes (the segment may hold stray continuation bytes) are
// barriers copied as they are.
func nfcSegment(out []byte, seg string) []byte {
	var buf []rune
	flush := func() {
		for _, r := range compose(canonicalOrder(buf)) {
			out = utf8.AppendRune(out, r)
		}
		buf = buf[:0]
	}
	for i := 0; i < len(seg); {
		r, w := utf8.DecodeRuneInString(seg[i:])
		if r == utf8.RuneError && w == 1 {
			flush()
			out = append(out, seg[i])
		} else {
			buf = decomposeRune(buf, r)
		}
		i += w
	}
	flush()
	return out
}

// canonicalOrder sorts each run of non-starters by combining class,
// stably.
func canonicalOrder(rs []rune) []rune {
	for i := 0; i < len(rs); {
		if combiningClass(rs[i]) == 0 {
			i++
			continue
		}
		j := i
		for j < len(rs) && combiningClass(rs[j]) != 0 {
			j++
		}
		run := rs[i:j]
		sort.SliceStable(run, func(a, b int) bool { return combiningClass(run[a]) < combiningClass(run[b]) })
		i = j
	}
	return rs
}

// compose applies canonical composition to a decomposed, ordered sequence.
func compose(rs []rune) []rune {
	if len(rs) == 0 {
		return rs
	}
	starter := -1
	if combiningClass(rs[0]) == 0 {
		starter = 0
	}
	out := rs[:1]
	lastCC := combiningClass(rs[0])
	if starter < 0 {
		lastCC = 255 // a leading non-starter blocks nothing but has no starter
	}
	for _, r := range rs[1:] {
		cc := combiningClass(r)
		if starter >= 0 {
			// r is blocked from the starter if something between them has
			// a class of zero or at least r's (lastCC tracks the last
			// uncomposed character after the starter).
			blocked := len(out)-1 != starter && (lastCC == 0 || lastCC >= cc)
			if !blocked {
				if c, ok := composePair(out[starter], r); ok {
					out[starter] = c
					continue
				}
			}
		}
		if cc == 0 {
			starter = len(out)
		}
		lastCC = cc
		out = append(out, r)
	}
	return out
}
