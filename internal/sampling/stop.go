package sampling

import (
	"slices"
	"strings"

	"github.com/kvfence/kvfence/internal/tokenizer"
)

// StopIDs is the set of token ids that end generation.
type StopIDs struct{ ids []int32 }

// NewStopIDs returns the end-of-generation ids of tok (unless ignoreEOG)
// plus extra.
func NewStopIDs(tok *tokenizer.Tokenizer, extra []int32, ignoreEOG bool) StopIDs {
	var ids []int32
	if tok != nil && !ignoreEOG {
		ids = append(ids, tok.EOGs()...)
	}
	ids = append(ids, extra...)
	slices.Sort(ids)
	return StopIDs{ids: slices.Compact(ids)}
}

// Has reports whether id ends generation.
func (s StopIDs) Has(id int32) bool {
	_, ok := slices.BinarySearch(s.ids, id)
	return ok
}

// Stopper watches the detokenized output for stop strings. Text pushed into
// it is released as soon as it cannot be the start of a stop string; text
// that could be is held back until the following text decides. When a stop
// string appears, the text before it is released and the stop string and
// everything after it are dropped (OpenAI's stop semantics).
//
// Push valid UTF-8 (a tokenizer.StreamDecoder's output): a held-back
// suffix always starts on a rune boundary, so released text is valid too.
// A Stopper is not safe for concurrent use.
type Stopper struct {
	stops   []string
	maxLen  int
	held    []byte // text that may begin a stop string (< maxLen bytes)
	buf     []byte
	stopped bool
}

// NewStopper returns a Stopper for the given stop strings (empty strings
// are ignored; with none, Push releases everything at once).
func NewStopper(stops []string) *Stopper {
	s := &Stopper{}
	for _, x := range stops {
		if x != "" {
			s.stops = append(s.stops, x)
			s.maxLen = max(s.maxLen, len(x))
		}
	}
	s.held = make([]byte, 0, s.maxLen)
	s.buf = make([]byte, 0, 2*s.maxLen+64)
	return s
}

// Push adds text and returns what may be emitted now; stopped reports that
// a stop string was found (Push then ignores further input).
func (s *Stopper) Push(text string) (emit string, stopped bool) {
	out, stopped := s.AppendPush(nil, text)
	return string(out), stopped
}

// AppendPush is Push appending the released text to dst; it allocates
// nothing once its buffers have grown to the longest text pushed.
func (s *Stopper) AppendPush(dst []byte, text string) ([]byte, bool) {
	if s.stopped {
		return dst, true
	}
	if len(s.stops) == 0 {
		return append(dst, text...), false
	}
	s.buf = append(append(s.buf[:0], s.held...), text...)
	// The earliest stop string wins; one found must start in the new
	// text or the held part (held text never contains a whole one).
	first := -1
	for _, x := range s.stops {
		if i := strings.Index(unsafeString(s.buf), x); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		s.stopped = true
		s.held = s.held[:0]
		return append(dst, s.buf[:first]...), true
	}
	// Hold back the longest suffix that is a proper prefix of a stop string.
	keep := 0
	for _, x := range s.stops {
		for k := min(len(x)-1, len(s.buf)); k > keep; k-- {
			if string(s.buf[len(s.buf)-k:]) == x[:k] {
				keep = k
				break
			}
		}
	}
	cut := len(s.buf) - keep
	dst = append(dst, s.buf[:cut]...)
	s.held = append(s.held[:0], s.buf[cut:]...)
	return dst, false
}

// Flush returns the held-back text at the end of generation (unless a stop
// string was found) and resets the Stopper.
func (s *Stopper) Flush() string {
	out := ""
	if !s.stopped {
		out = string(s.held)
	}
	s.held = s.held[:0]
	s.stopped = false
	return out
}

// Held reports how many bytes are held back.
func (s *Stopper) Held() int { return len(s.held) }
