package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// constBackend streams n copies of one token without allocating, so the
// benchmark measures the HTTP layer alone.
type constBackend struct{ n int }

type constStream struct {
	n, i int
	res  Result
}

func (b *constBackend) Models() []ModelInfo { return []ModelInfo{{ID: "m"}} }
func (b *constBackend) Generate(ctx context.Context, r *Request) (Stream, error) {
	return &constStream{n: b.n, res: Result{PromptTokens: 3}}, nil
}
func (s *constStream) Next(ctx context.Context) (Token, error) {
	if s.i == s.n {
		s.res.FinishReason = FinishLength
		return Token{}, io.EOF
	}
	s.i++
	s.res.CompletionTokens = s.i
	return Token{Text: " token", Bytes: " token", ID: 7, Logprob: -0.5}, nil
}
func (s *constStream) Result() Result { return s.res }
func (s *constStream) Close()         {}

// discardWriter is a flushable ResponseWriter that keeps nothing.
type discardWriter struct {
	h http.Header
	n int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
func (w *discardWriter) Flush()                      {}

// BenchmarkStream reports the cost of streaming one request of n tokens;
// allocs/op must not grow with n (nothing is allocated per token).
func BenchmarkStream(b *testing.B) {
	for _, tc := range []struct {
		name string
		body string
	}{
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":100000}`},
		{"chat-logprobs", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"logprobs":true,"max_tokens":100000}`},
		{"completions", `{"model":"m","prompt":"hi","stream":true,"max_tokens":100000}`},
	} {
		for _, n := range []int{64, 1024} {
			b.Run(tc.name+"/tokens="+strconv.Itoa(n), func(b *testing.B) {
				h := NewHandler(Config{}, &constBackend{n: n}, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
				path := "/v1/chat/completions"
				if tc.name == "completions" {
					path = "/v1/completions"
				}
				b.ReportAllocs()
				for b.Loop() {
					req, _ := http.NewRequest("POST", path, strings.NewReader(tc.body))
					h.ServeHTTP(&discardWriter{h: http.Header{}}, req)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
			})
		}
	}
}
