package api

import "strings"

// stopMatcher applies stop sequences to streamed text. Text that could be
// the start of a stop sequence is held back until the next piece decides
// it, so a client never sees part of a stop sequence, streamed or not.
type stopMatcher struct {
	stops   []string
	pending string // held-back text: a proper prefix of some stop sequence
}

// push adds generated text and returns what may be sent now. stopped
// reports that a stop sequence matched: out is then the text before it,
// and generation must end.
func (m *stopMatcher) push(s string) (out string, stopped bool) {
	if len(m.stops) == 0 {
		return s, false
	}
	buf := m.pending + s
	best := -1
	for _, st := range m.stops {
		if i := strings.Index(buf, st); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	if best >= 0 {
		m.pending = ""
		return buf[:best], true
	}
	hold := 0
	for _, st := range m.stops {
		for k := min(len(st)-1, len(buf)); k > hold; k-- {
			if strings.HasSuffix(buf, st[:k]) {
				hold = k
				break
			}
		}
	}
	m.pending = buf[len(buf)-hold:]
	return buf[:len(buf)-hold], false
}

// flush returns the held-back text at the end of generation.
func (m *stopMatcher) flush() string {
	s := m.pending
	m.pending = ""
	return s
}
