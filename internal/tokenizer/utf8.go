package tokenizer

import "unicode/utf8"

// seqLen returns how many bytes the UTF-8 sequence starting with lead
// needs, and the valid range of its second byte; n is 0 for bytes that
// cannot start a sequence.
func seqLen(lead byte) (n int, lo, hi byte) {
	switch {
	case lead < 0x80:
		return 1, 0, 0
	case lead >= 0xC2 && lead <= 0xDF:
		return 2, 0x80, 0xBF
	case lead == 0xE0:
		return 3, 0xA0, 0xBF
	case lead == 0xED:
		return 3, 0x80, 0x9F
	case lead >= 0xE1 && lead <= 0xEF:
		return 3, 0x80, 0xBF
	case lead == 0xF0:
		return 4, 0x90, 0xBF
	case lead >= 0xF1 && lead <= 0xF3:
		return 4, 0x80, 0xBF
	case lead == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}

// validPrefix reports how b (len(b) >= 1) begins: complete is the length of
// a complete valid sequence at b[0] (0 if none); partial is true when b is
// a proper prefix of some valid sequence (more bytes could complete it);
// otherwise bad is the length of the maximal invalid subpart to replace
// with one U+FFFD (the WHATWG "maximal subpart" rule).
func validPrefix[T string | []byte](b T) (complete int, partial bool, bad int) {
	n, lo, hi := seqLen(b[0])
	if n == 0 {
		return 0, false, 1
	}
	if n == 1 {
		return 1, false, 0
	}
	for i := 1; i < n; i++ {
		if i >= len(b) {
			return 0, true, 0
		}
		l, h := byte(0x80), byte(0xBF)
		if i == 1 {
			l, h = lo, hi
		}
		if b[i] < l || b[i] > h {
			return 0, false, i
		}
	}
	return n, false, 0
}

// toValidUTF8 converts b to a string, replacing each maximal invalid
// subpart with U+FFFD.
func toValidUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		c, partial, bad := validPrefix(b[i:])
		switch {
		case c > 0:
			out = append(out, b[i:i+c]...)
			i += c
		case partial:
			out = append(out, "\uFFFD"...)
			i = len(b)
		default:
			out = append(out, "\uFFFD"...)
			i += bad
		}
	}
	return string(out)
}
