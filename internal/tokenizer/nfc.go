package tokenizer

import (
	"sort"
	"strings"
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
func nfc(s string) string {
	stable := true
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0xCC { // every rune below U+0300 is stable
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError && nfcIsUnstable(r) {
			stable = false
			break
		}
		i += w
	}
	if stable {
		return s
	}
	// Work segment by segment between invalid bytes, which pass through.
	var b strings.Builder
	b.Grow(len(s))
	var buf []rune
	start := 0
	flush := func(end int) {
		buf = buf[:0]
		for _, r := range s[start:end] {
			buf = decomposeRune(buf, r)
		}
		buf = canonicalOrder(buf)
		buf = compose(buf)
		for _, r := range buf {
			b.WriteRune(r)
		}
	}
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && w == 1 {
			flush(i)
			b.WriteByte(s[i])
			start = i + 1
		}
		i += w
	}
	flush(len(s))
	return b.String()
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
