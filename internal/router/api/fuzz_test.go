package api

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

var fuzzLimits = decodeLimits{defaultChatMax: 4096, defaultCompMax: 16, maxTokensLimit: 1 << 20}

var chatSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":"b","refusal":null}],"max_completion_tokens":7,"stop":["x","y"],"logprobs":true,"top_logprobs":3,"stream":true,"stream_options":{"include_usage":true},"seed":-1,"temperature":0.5,"top_p":1}`,
	`{"model":"m","messages":[{"role":"user","content":"a"}],"n":2}`,
	`{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":"5"}`,
	`{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":1e400}`,
	`{"model":"m","messages":[{"role":"robot","content":"a"}]}`,
	`{"model":"m","messages":[]}`,
	`{"model":"m","messages":[{"role":"user","content":"\ud800"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"a"}],"unknown":{"deep":[1,2,{"x":null}]}}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
	`[]`, `null`, ``, `{`, `{"model":null}`, `{"stop":[null]}`, `{"messages":[null]}`,
}

var completionSeeds = []string{
	`{"model":"m","prompt":"hi"}`,
	`{"model":"m","prompt":["hi"],"logprobs":5,"echo":false,"best_of":1,"suffix":"","stop":"\n","max_tokens":3}`,
	`{"model":"m","prompt":[1,2]}`,
	`{"model":"m","prompt":[["a"]]}`,
	`{"model":"m","prompt":[]}`,
	`{"model":"m","prompt":"a","logprobs":-1}`,
	`{"model":"m","prompt":"a","stream_options":{"include_usage":true}}`,
	`{"model":"m","prompt":"a","max_tokens":-0}`,
	`{"model":"m","prompt":"a","max_tokens":1.0000000000000002}`,
}

// checkDecoded holds for every request decoding accepts.
func checkDecoded(t *testing.T, c call, err error) {
	if err != nil {
		pe, ok := err.(*ParamError)
		if !ok {
			t.Fatalf("decode error %T %v is not a *ParamError", err, err)
		}
		info := ErrorFor(err)
		body := appendError(nil, &info)
		if info.Status != 400 || !json.Valid(body) || pe.Message == "" {
			t.Fatalf("error response %d %s", info.Status, body)
		}
		return
	}
	r := c.req
	if r.Model == "" || r.MaxTokens < 1 || r.MaxTokens > fuzzLimits.maxTokensLimit {
		t.Fatalf("accepted %+v", r)
	}
	if r.Temperature < 0 || r.Temperature > 2 || r.TopP < 0 || r.TopP > 1 || r.TopLogprobs < 0 || r.TopLogprobs > maxTopLogprobs {
		t.Fatalf("accepted out-of-range sampling %+v", r)
	}
	if r.TopLogprobs > 0 && !r.Logprobs {
		t.Fatal("top_logprobs without logprobs")
	}
	if len(c.stop) > maxStop {
		t.Fatalf("%d stops", len(c.stop))
	}
	for _, s := range c.stop {
		if s == "" || !utf8.ValidString(s) {
			t.Fatalf("stop %q", s)
		}
	}
	if c.includeUsage && !c.stream {
		t.Fatal("include_usage without stream")
	}
	if r.Chat {
		if len(r.Messages) == 0 {
			t.Fatal("no messages")
		}
		for _, m := range r.Messages {
			if m.Role != "system" && m.Role != "user" && m.Role != "assistant" || !utf8.ValidString(m.Content) {
				t.Fatalf("message %+v", m)
			}
		}
	} else if r.Prompt == "" || !utf8.ValidString(r.Prompt) {
		t.Fatalf("prompt %q", r.Prompt)
	}
}

func FuzzDecodeChatRequest(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := decodeChat(body, fuzzLimits)
		checkDecoded(t, c, err)
	})
}

func FuzzDecodeCompletionRequest(f *testing.F) {
	for _, s := range completionSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := decodeCompletion(body, fuzzLimits)
		checkDecoded(t, c, err)
	})
}

// TestSeedsThroughHandler runs the fuzz seeds through the whole handler:
// every answer is a 200 or a JSON error, and nothing panics (the recover
// middleware would turn a panic into a 500, which fails here).
func TestSeedsThroughHandler(t *testing.T) {
	f := newFixture(t, Config{}, false)
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		seeds := chatSeeds
		if path == "/v1/completions" {
			seeds = completionSeeds
		}
		for _, s := range seeds {
			s = strings.ReplaceAll(s, `"model":"m"`, `"model":"kvfence-test"`)
			rec := do(f, "POST", path, s, "")
			if rec.Code >= 500 {
				t.Fatalf("%s %s: %d %s", path, s, rec.Code, rec.Body)
			}
			if rec.Code != 200 && !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s %s: invalid error body %s", path, s, rec.Body)
			}
		}
	}
	f.assertClosed(t)
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "\x00\x1f\x7f", "é\u2028\u2029", "\xff\xc3", "<&>", "\U0001F600"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("appendString(%q) = %s: %v", s, b, err)
		}
		// Valid UTF-8 round-trips; invalid bytes become U+FFFD, as
		// encoding/json does.
		if want := strings.ToValidUTF8(s, "\ufffd"); utf8.ValidString(s) && back != s || !utf8.ValidString(s) && !validReplacement(s, back) {
			t.Fatalf("appendString(%q) decodes to %q, want %q", s, back, want)
		}
	})
}

// validReplacement: back is s with each invalid byte replaced by U+FFFD.
func validReplacement(s, back string) bool {
	var sb strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			sb.WriteString("\ufffd")
		} else {
			sb.WriteString(s[i : i+n])
		}
		i += n
	}
	return sb.String() == back
}

func FuzzStopMatcher(f *testing.F) {
	f.Add("hello world", "lo w", "ld", uint64(0x0102030405))
	f.Add("aaab", "aab", "", uint64(1))
	f.Add("abcabd", "abd", "cab", uint64(0xffff))
	f.Add("abcd", "abcd", "bc", uint64(0)) // the short stop completes first
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, cuts uint64) {
		var stops []string
		for _, s := range []string{stop1, stop2} {
			if s != "" {
				stops = append(stops, s)
			}
		}
		// Reference: after each piece, the whole text so far is searched;
		// generation ends at the first piece after which a stop sequence
		// occurs, cut at its earliest occurrence. (Which stop wins depends
		// on the pieces when two overlap: a short one can complete before a
		// long one that starts earlier.)
		m := stopMatcher{stops: stops}
		var got strings.Builder
		want, wantStop := "", false
		stopped := false
		seen := 0
		for rest := text; rest != "" && !stopped; {
			n := 1 + int(cuts%4)
			cuts = cuts/4 | cuts<<62
			n = min(n, len(rest))
			out, st := m.push(rest[:n])
			got.WriteString(out)
			stopped = st
			rest = rest[n:]
			seen += n
			if !wantStop {
				best := -1
				for _, s := range stops {
					if i := strings.Index(text[:seen], s); i >= 0 && (best < 0 || i < best) {
						best = i
					}
				}
				if best >= 0 {
					want, wantStop = text[:best], true
				}
			}
		}
		if !stopped {
			got.WriteString(m.flush())
		}
		if !wantStop {
			want = text
		}
		if got.String() != want || stopped != wantStop {
			t.Fatalf("text %q stops %q: got %q stopped %v, want %q %v", text, stops, got.String(), stopped, want, wantStop)
		}
	})
}
