package tokenizer

// StreamDecoder turns a stream of token ids into text incrementally. It
// never emits part of a UTF-8 sequence: bytes that may still be completed
// by later tokens are held back; bytes that provably cannot be completed
// are emitted as U+FFFD right away (one per maximal invalid subpart, the
// same rule Decode applies), and Flush replaces an incomplete tail with
// U+FFFD. For any ids, the concatenation of every Next result and the
// final Flush equals Decode(ids).
//
// A StreamDecoder is not safe for concurrent use; the Tokenizer it came
// from may be shared.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte // a proper prefix of a UTF-8 sequence (at most 3 bytes)
	started bool   // some byte has been seen (for the SentencePiece leading space)
}

// NewStreamDecoder returns a decoder at the start of a sequence.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t, pending: make([]byte, 0, 8)}
}

// Next consumes one token and returns the text that became complete.
func (d *StreamDecoder) Next(id int32) string {
	var buf [32]byte
	return string(d.AppendNext(buf[:0], id))
}

// AppendNext is Next appending to dst instead of allocating a string; with
// a dst of sufficient capacity it allocates nothing.
func (d *StreamDecoder) AppendNext(dst []byte, id int32) []byte {
	p := d.t.Piece(id)
	if len(p) == 0 {
		return dst
	}
	if !d.started {
		d.started = true
		if d.t.stripFirst && p[0] == ' ' {
			p = p[1:]
		}
	}
	if len(d.pending) == 0 {
		// Fast path: emit the piece's complete prefix directly.
		i := 0
		for i < len(p) {
			c, partial, bad := validPrefix(p[i:])
			switch {
			case c > 0:
				dst = append(dst, p[i:i+c]...)
				i += c
			case partial:
				d.pending = append(d.pending, p[i:]...)
				return dst
			default:
				dst = append(dst, "\uFFFD"...)
				i += bad
			}
		}
		return dst
	}
	for i := 0; i < len(p); i++ {
		d.pending = append(d.pending, p[i])
		dst = d.drain(dst, false)
	}
	return dst
}

// drain emits what of pending is decided; with final, everything.
func (d *StreamDecoder) drain(dst []byte, final bool) []byte {
	i := 0
	for i < len(d.pending) {
		c, partial, bad := validPrefix(d.pending[i:])
		switch {
		case c > 0:
			dst = append(dst, d.pending[i:i+c]...)
			i += c
		case partial && !final:
			n := copy(d.pending, d.pending[i:])
			d.pending = d.pending[:n]
			return dst
		case partial:
			dst = append(dst, "\uFFFD"...)
			i = len(d.pending)
		default:
			dst = append(dst, "\uFFFD"...)
			i += bad
		}
	}
	d.pending = d.pending[:0]
	return dst
}

// Flush returns the held-back bytes (as U+FFFD: they are an incomplete
// sequence) and resets the decoder for a new sequence.
func (d *StreamDecoder) Flush() string {
	out := string(d.drain(nil, true))
	d.started = false
	return out
}

// Pending reports whether bytes are held back.
func (d *StreamDecoder) Pending() bool { return len(d.pending) > 0 }
