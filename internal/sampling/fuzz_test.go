package sampling

import (
	"strings"
	"testing"
)

// FuzzStopper checks the Stopper against the obvious reference: whatever
// the pieces, the released text is the whole text up to the earliest stop
// string, and Push reports a stop exactly when there is one.
func FuzzStopper(f *testing.F) {
	f.Add("hello STOP world", "STOP", "x", uint64(0x1234))
	f.Add("aaab", "aab", "", uint64(7))
	f.Add("你好世界!", "世界", "好世", uint64(99))
	f.Add("\n\nUser:", "\n\n", "User", uint64(1))
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, cuts uint64) {
		s := NewStopper([]string{stop1, stop2})
		var out strings.Builder
		stopped := false
		// Cut text into pieces where the bits of cuts say.
		start := 0
		for i := 1; i <= len(text) && !stopped; i++ {
			if i == len(text) || cuts>>(uint(i)%64)&1 == 1 {
				e, st := s.Push(text[start:i])
				out.WriteString(e)
				stopped = st
				start = i
			}
		}
		if !stopped {
			out.WriteString(s.Flush())
		}
		want, found := text, false
		for _, x := range []string{stop1, stop2} {
			if x == "" {
				continue
			}
			if i := strings.Index(text, x); i >= 0 && (!found || i < len(want)) {
				want, found = text[:i], true
			}
		}
		if out.String() != want || stopped != found {
			t.Fatalf("text %q stops %q %q: got %q (stopped %v), want %q (%v)", text, stop1, stop2, out.String(), stopped, want, found)
		}
	})
}
