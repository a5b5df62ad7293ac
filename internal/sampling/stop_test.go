package sampling

import (
	"strings"
	"testing"

	"github.com/kvfence/kvfence/internal/tokenizer"
)

func TestStopper(t *testing.T) {
	cases := []struct {
		name    string
		stops   []string
		pieces  []string
		emitted []string // per Push
		stopped int      // index of the Push that stops, -1 if none
		flush   string
	}{
		{"no stops", nil, []string{"ab", "c"}, []string{"ab", "c"}, -1, ""},
		{"split across tokens", []string{"STOP"}, []string{"hello S", "TO", "P world"},
			[]string{"hello ", "", ""}, 2, ""},
		{"false start released", []string{"STOP"}, []string{"a ST", "OX", "!"},
			[]string{"a ", "STOX", "!"}, -1, ""},
		{"held at end is flushed", []string{"STOP"}, []string{"x STO"},
			[]string{"x "}, -1, "STO"},
		{"stop inside one piece", []string{"\n\n"}, []string{"line\n\nmore"}, []string{"line"}, 0, ""},
		{"earliest of several", []string{"cd", "bcx", "b"}, []string{"abcd"}, []string{"a"}, 0, ""},
		{"overlapping prefix", []string{"aab"}, []string{"a", "a", "a", "b"}, []string{"", "", "a", ""}, 3, ""},
		{"multibyte", []string{"世界"}, []string{"你好世", "界!"}, []string{"你好", ""}, 1, ""},
		{"after stop nothing", []string{"x"}, []string{"x", "more"}, []string{"", ""}, 0, ""},
		{"empty stop ignored", []string{""}, []string{"abc"}, []string{"abc"}, -1, ""},
	}
	for _, c := range cases {
		s := NewStopper(c.stops)
		stoppedAt := -1
		for i, p := range c.pieces {
			got, stopped := s.Push(p)
			if got != c.emitted[i] {
				t.Errorf("%s: push %d (%q) emitted %q want %q", c.name, i, p, got, c.emitted[i])
			}
			if stopped && stoppedAt < 0 {
				stoppedAt = i
			}
		}
		if stoppedAt != c.stopped {
			t.Errorf("%s: stopped at %d want %d", c.name, stoppedAt, c.stopped)
		}
		if got := s.Flush(); got != c.flush {
			t.Errorf("%s: flush %q want %q", c.name, got, c.flush)
		}
	}
}

// TestStopperWithTokenizer streams a real tokenization through the
// StreamDecoder and the Stopper: the output must be the text up to the
// first stop string, however the tokens cut it.
func TestStopperWithTokenizer(t *testing.T) {
	c, err := tokenizer.BundledQwen3()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(c)
	if err != nil {
		t.Fatal(err)
	}
	text := "The answer is 42.\nObservation: 世界 says 😀 hello.\n\nUser: next"
	for _, stop := range []string{"Observation:", "界 s", "😀", "\n\nUser:", "nothing", "t"} {
		d := tok.NewStreamDecoder()
		s := NewStopper([]string{stop})
		var out strings.Builder
		stopped := false
		for _, id := range tok.Encode(text, tokenizer.EncodeOptions{}) {
			e, st := s.Push(d.Next(id))
			out.WriteString(e)
			if st {
				stopped = true
				break
			}
		}
		if !stopped {
			e, _ := s.Push(d.Flush())
			out.WriteString(e)
			out.WriteString(s.Flush())
		}
		want, _, found := strings.Cut(text, stop)
		if out.String() != want || stopped != found {
			t.Errorf("stop %q: got %q (stopped %v), want %q", stop, out.String(), stopped, want)
		}
	}
}

func TestStopperAllocs(t *testing.T) {
	s := NewStopper([]string{"</answer>", "STOP"})
	dst := make([]byte, 0, 64)
	pieces := []string{"some ", "text <", "/ans", "wer", " S", "TOP"}
	allocs := testing.AllocsPerRun(100, func() {
		for _, p := range pieces[:4] {
			dst, _ = s.AppendPush(dst[:0], p)
		}
		s.Flush()
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run", allocs)
	}
}
