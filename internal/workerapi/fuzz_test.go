package workerapi

import (
	"math"
	"testing"

	"github.com/kvfence/kvfence/internal/reqerr"
)

// FuzzDecodeEvent: no panic, and every line that decodes re-encodes to a
// line that decodes to the same event (or error).
func FuzzDecodeEvent(f *testing.F) {
	for _, ev := range fakeEvents {
		line, _ := appendEvent(nil, ev)
		f.Add(line)
	}
	f.Add(appendErrorLine(nil, &reqerr.ContextLengthError{Prompt: 5000, MaxTokens: 100, Limit: 4096}))
	f.Add(appendErrorLine(nil, reqerr.New(reqerr.KindIntegrity, "fence mismatch on page %d", 3)))
	f.Add([]byte(`{"token":{"id":1,"logprob":"nan"}}`))
	f.Add([]byte(`{"token":{"id":1,"logprob":1e999}}`))
	f.Add([]byte(`{"error":{"kind":"aborted","code":1}}`))
	f.Add([]byte(`{"token":{"id":1},"error":{"kind":"aborted","code":7}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, final, err := decodeEvent(line)
		if err != nil {
			return
		}
		if final != nil {
			again, final2, err := decodeEvent(appendErrorLine(nil, final))
			if err != nil || final2 == nil || final2.Error() != final.Error() || again.ID != 0 {
				t.Fatalf("error %v does not round-trip: %v %v", final, final2, err)
			}
			return
		}
		out, err := appendEvent(nil, ev)
		if err != nil {
			t.Fatalf("decoded event %+v does not encode: %v", ev, err)
		}
		ev2, final2, err := decodeEvent(out)
		if err != nil || final2 != nil || ev2.ID != ev.ID || ev2.Finish != ev.Finish || len(ev2.Top) != len(ev.Top) ||
			math.Float32bits(ev2.Logprob) != math.Float32bits(ev.Logprob) && !(math.IsNaN(float64(ev.Logprob)) && math.IsNaN(float64(ev2.Logprob))) {
			t.Fatalf("event %+v does not round-trip: %+v %v %v", ev, ev2, final2, err)
		}
	})
}

// FuzzParseRequests: request bodies from anyone holding the secret decode
// to a request or an invalid_request error, never a panic.
func FuzzParseRequests(f *testing.F) {
	e := &env{}
	e.auth = mustAuth()
	g, _ := jsonGenerate(e, "t")
	f.Add(g)
	f.Add([]byte(`{"prefill":"AAAA","prompt":[1,2]}`))
	f.Add([]byte(`{"open":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := parseGenerate(b); err == nil {
			if r.Open == nil {
				t.Fatal("generate request without its Open")
			}
		} else if reqerr.KindOf(err) != reqerr.KindInvalidRequest {
			t.Fatalf("error of kind %v", reqerr.KindOf(err))
		}
		if r, err := parsePrefill(b); err == nil {
			if r.Prefill == nil {
				t.Fatal("prefill request without its Prefill")
			}
		} else if reqerr.KindOf(err) != reqerr.KindInvalidRequest {
			t.Fatalf("error of kind %v", reqerr.KindOf(err))
		}
	})
}
