package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router/tenants"
)

// echoBackend is a deterministic scripted generator: it answers "echo: "
// followed by the last message (or the prompt), one token per ASCII byte and
// two tokens per multi-byte character (the first completes no text, as a
// real tokenizer's byte tokens do). Prompt tokens are the prompt's runes
// (plus 2 per chat message). Markers in the text script failures:
//
//	#fail-first  the first Next returns an integrity error
//	#fail-mid    Next returns an integrity error after 3 tokens
//	#block       Next blocks until its context ends
//	#panic       Next panics
type echoBackend struct {
	models []ModelInfo

	mu struct {
		sync.Mutex
		last    Request // the last request seen by Generate
		open    int     // streams not yet closed
		closed  int     // Close calls
		doubles int     // Close calls on a closed stream
	}
	generateErr error         // returned by Generate when set
	blocked     chan struct{} // receives when a #block stream starts waiting
	cancelled   chan error    // receives the ctx error a #block stream saw
}

const testModel = "kvfence-test"
const testContext = 200

func newEchoBackend() *echoBackend {
	return &echoBackend{
		models:    []ModelInfo{{ID: testModel, Created: 1700000000, OwnedBy: "kvfence", ContextLength: testContext}},
		blocked:   make(chan struct{}, 16),
		cancelled: make(chan error, 16),
	}
}

func (b *echoBackend) Models() []ModelInfo { return b.models }

func (b *echoBackend) Generate(ctx context.Context, r *Request) (Stream, error) {
	b.mu.Lock()
	b.mu.last = *r
	b.mu.Unlock()
	if b.generateErr != nil {
		return nil, b.generateErr
	}
	var input string
	prompt := 0
	if r.Chat {
		for _, m := range r.Messages {
			prompt += utf8.RuneCountInString(m.Content) + 2
		}
		input = r.Messages[len(r.Messages)-1].Content
	} else {
		input = r.Prompt
		prompt = utf8.RuneCountInString(input)
	}
	max := r.MaxTokens
	if r.MaxTokensAuto {
		max = min(max, testContext-prompt)
	}
	if max < 1 || prompt+max > testContext {
		return nil, &reqerr.ContextLengthError{Prompt: prompt, MaxTokens: r.MaxTokens, Limit: testContext}
	}
	s := &echoStream{b: b, req: *r, max: max, res: Result{PromptTokens: prompt}}
	for _, c := range "echo: " + input {
		var buf [4]byte
		n := utf8.EncodeRune(buf[:], c)
		if n == 1 {
			s.script = append(s.script, Token{Text: string(c), Bytes: string(c)})
			continue
		}
		s.script = append(s.script, Token{Bytes: string(buf[:1])}, Token{Text: string(c), Bytes: string(buf[1:n])})
	}
	b.mu.Lock()
	b.mu.open++
	b.mu.Unlock()
	return s, nil
}

func (b *echoBackend) counts() (open, closed, doubles int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.open, b.mu.closed, b.mu.doubles
}

func (b *echoBackend) last() Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.last
}

type echoStream struct {
	b      *echoBackend
	req    Request
	script []Token
	max    int
	i      int
	res    Result
	err    error
	closed bool
}

func (s *echoStream) input() string {
	if s.req.Chat {
		return s.req.Messages[len(s.req.Messages)-1].Content
	}
	return s.req.Prompt
}

func (s *echoStream) Next(ctx context.Context) (Token, error) {
	if s.err != nil {
		return Token{}, s.err
	}
	if err := ctx.Err(); err != nil {
		return Token{}, err
	}
	in := s.input()
	switch {
	case strings.Contains(in, "#fail-first") && s.i == 0,
		strings.Contains(in, "#fail-mid") && s.i == 3:
		s.err = reqerr.New(reqerr.KindIntegrity, "fence mismatch on page 3")
		return Token{}, s.err
	case strings.Contains(in, "#block"):
		s.b.blocked <- struct{}{}
		<-ctx.Done()
		s.b.cancelled <- ctx.Err()
		s.err = ctx.Err()
		return Token{}, s.err
	case strings.Contains(in, "#panic"):
		panic("echoStream: scripted panic")
	}
	if s.i == len(s.script) || s.i == s.max {
		s.res.FinishReason = FinishStop
		if s.i == s.max {
			s.res.FinishReason = FinishLength
		}
		s.err = io.EOF
		return Token{}, io.EOF
	}
	t := s.script[s.i]
	t.ID = int32(s.i)
	if s.req.Logprobs {
		t.Logprob = -float32(s.i+1) / 8
		for j := range s.req.TopLogprobs {
			t.Top = append(t.Top, TopLogprob{ID: int32(1000 + j), Bytes: fmt.Sprintf("alt%d", j), Logprob: -float32(j + 1)})
		}
	}
	s.i++
	s.res.CompletionTokens = s.i
	return t, nil
}

func (s *echoStream) Result() Result { return s.res }

func (s *echoStream) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.closed {
		s.b.mu.doubles++
		return
	}
	s.closed = true
	s.b.mu.open--
	s.b.mu.closed++
}

// Test fixtures.

const (
	keyA = "sk-test-tenant-a-0001"
	keyB = "sk-test-tenant-b-0001"
)

type fixture struct {
	b   *echoBackend
	h   http.Handler
	reg *prometheus.Registry
	now time.Time
}

func newFixture(t testing.TB, cfg Config, withKeys bool) *fixture {
	t.Helper()
	f := &fixture{b: newEchoBackend(), reg: prometheus.NewRegistry(), now: time.Unix(1750000000, 0)}
	var keys *tenants.Keys
	if withKeys {
		var err error
		keys, err = tenants.ParseKeys(strings.NewReader(keyA + " tenant-a 2\n" + keyB + " tenant-b\n"))
		if err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return f.now }
	}
	f.h = NewHandler(cfg, f.b, keys, f.reg, slog.New(slog.DiscardHandler))
	return f
}

// assertClosed checks every stream the backend handed out was closed once.
func (f *fixture) assertClosed(t testing.TB) {
	t.Helper()
	open, _, doubles := f.b.counts()
	if open != 0 || doubles != 0 {
		t.Fatalf("streams: %d open, %d closed twice; the handler must Close each exactly once", open, doubles)
	}
}
