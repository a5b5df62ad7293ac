package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/reqerr"
)

func TestSSEFraming(t *testing.T) {
	tests := []struct {
		name, path, body string
		frames           []string // with ID for the request id
	}{
		{"completions with usage", "/v1/completions",
			`{"model":"kvfence-test","prompt":"x","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
			[]string{
				`{"id":"cmpl-ID","object":"text_completion","created":1750000000,"model":"kvfence-test","choices":[{"text":"e","index":0,"logprobs":null,"finish_reason":null}],"usage":null}`,
				`{"id":"cmpl-ID","object":"text_completion","created":1750000000,"model":"kvfence-test","choices":[{"text":"c","index":0,"logprobs":null,"finish_reason":null}],"usage":null}`,
				`{"id":"cmpl-ID","object":"text_completion","created":1750000000,"model":"kvfence-test","choices":[{"text":"h","index":0,"logprobs":null,"finish_reason":null}],"usage":null}`,
				`{"id":"cmpl-ID","object":"text_completion","created":1750000000,"model":"kvfence-test","choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],"usage":null}`,
				`{"id":"cmpl-ID","object":"text_completion","created":1750000000,"model":"kvfence-test","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}}`,
				`[DONE]`,
			}},
		{"chat without usage, a split character", "/v1/chat/completions",
			`{"model":"kvfence-test","messages":[{"role":"user","content":"\"é"}],"max_tokens":10,"stream":true}`,
			[]string{
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":"e"},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":"c"},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":"h"},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":"o"},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":":"},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":" "},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":"\""},"logprobs":null,"finish_reason":null}]}`,
				// The first byte of é completes no text: no chunk.
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{"content":"é"},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-ID","object":"chat.completion.chunk","created":1750000000,"model":"kvfence-test","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`,
				`[DONE]`,
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Config{}, false)
			srv := httptest.NewServer(f.h)
			defer srv.Close()
			resp, err := http.Post(srv.URL+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Cache-Control") != "no-cache" {
				t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
			}
			id := resp.Header.Get("X-Request-Id")
			var want strings.Builder
			for _, fr := range tt.frames {
				want.WriteString("data: " + strings.ReplaceAll(fr, "-ID", "-"+id) + "\n\n")
			}
			if string(raw) != want.String() {
				t.Fatalf("got\n%s\nwant\n%s", raw, want.String())
			}
		})
	}
}

func TestSSEErrorAfterFirstToken(t *testing.T) {
	f := newFixture(t, Config{}, false)
	rec := do(f, "POST", "/v1/completions", `{"model":"kvfence-test","prompt":"#fail-mid","stream":true}`, "")
	id := rec.Header().Get("X-Request-Id")
	chunk := func(s string) string {
		return `data: {"id":"cmpl-` + id + `","object":"text_completion","created":1750000000,"model":"kvfence-test","choices":[{"text":"` + s + `","index":0,"logprobs":null,"finish_reason":null}]}` + "\n\n"
	}
	want := chunk("e") + chunk("c") + chunk("h") +
		`data: {"error":{"message":"fence mismatch on page 3","type":"server_error","param":null,"code":"kv_integrity_error"}}` + "\n\n"
	if rec.Code != 200 || rec.Body.String() != want {
		t.Fatalf("got %d\n%s\nwant\n%s", rec.Code, rec.Body, want)
	}
	f.assertClosed(t)
}

// serve runs f.h behind a real server and reports each finished request.
func serve(t *testing.T, f *fixture) (*httptest.Server, chan struct{}) {
	done := make(chan struct{}, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { done <- struct{}{} }()
		f.h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, done
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestClientDisconnectCancelsBackend(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			f := newFixture(t, Config{}, false)
			srv, done := serve(t, f)
			ctx, cancel := context.WithCancel(context.Background())
			body := fmt.Sprintf(`{"model":"kvfence-test","prompt":"#block","stream":%v}`, stream)
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/completions", strings.NewReader(body))
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			wait(t, f.b.blocked, "the backend to block")
			cancel()
			if err := wait(t, f.b.cancelled, "the backend context to end"); !errors.Is(err, context.Canceled) {
				t.Fatalf("backend saw %v", err)
			}
			wait(t, done, "the handler to return")
			wait(t, errc, "the client")
			f.assertClosed(t)
			want := `kvfence_http_requests_total{code="499",endpoint="completions"} 1` + "\n"
			if out := do(f, "GET", "/metrics", "", "").Body.String(); !strings.Contains(out, want) {
				t.Fatalf("metrics lack %q:\n%s", want, out)
			}
		})
	}
}

func TestTenantConcurrencyLimit(t *testing.T) {
	f := newFixture(t, Config{}, true)
	srv, done := serve(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	post := func(ctx context.Context, key, prompt string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/completions",
			strings.NewReader(`{"model":"kvfence-test","prompt":"`+prompt+`","max_tokens":2}`))
		req.Header.Set("Authorization", "Bearer "+key)
		return http.DefaultClient.Do(req)
	}
	// tenant-a's limit is 2: two blocked requests fill it.
	for range 2 {
		go func() {
			if resp, err := post(ctx, keyA, "#block"); err == nil {
				resp.Body.Close()
			}
		}()
		wait(t, f.b.blocked, "a request to block")
	}
	resp, err := post(context.Background(), keyA, "hi")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := errorBody("Too many requests in flight for your API key's tenant (limit 2); retry when one finishes.", "rate_limit_error", "", "overloaded")
	if resp.StatusCode != 429 || string(body) != want || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	wait(t, done, "the rejected request")
	// Another tenant is not affected.
	resp, err = post(context.Background(), keyB, "hi")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"text":"ec"`) {
		t.Fatalf("tenant-b: %d %s", resp.StatusCode, body)
	}
	wait(t, done, "tenant-b's request")
	// Ending the blocked requests frees the slots.
	cancel()
	wait(t, done, "blocked request 1")
	wait(t, done, "blocked request 2")
	resp, err = post(context.Background(), keyA, "hi")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the slots freed: %d", resp.StatusCode)
	}
	wait(t, done, "the last request")
	f.assertClosed(t)
	if n := f.h.(*handler).limiter.Tenants(); n != 0 {
		t.Fatalf("limiter holds %d tenants at rest", n)
	}
}

func TestPanicBecomes500(t *testing.T) {
	f := newFixture(t, Config{}, false)
	rec := do(f, "POST", "/v1/chat/completions", `{"model":"kvfence-test","messages":[{"role":"user","content":"#panic"}],"stream":true}`, "")
	want := errorBody("The server had an error while processing your request.", "server_error", "", "internal_error")
	if rec.Code != 500 || rec.Body.String() != want {
		t.Fatalf("got %d %s", rec.Code, rec.Body)
	}
	f.assertClosed(t)
	// And the handler goes on serving.
	rec = do(f, "POST", "/v1/completions", `{"model":"kvfence-test","prompt":"a","max_tokens":1}`, "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"text":"e"`) {
		t.Fatalf("after a panic: %d %s", rec.Code, rec.Body)
	}
}

func TestRoutes(t *testing.T) {
	ready := error(nil)
	f := newFixture(t, Config{Ready: func() error { return ready }}, true)
	tests := []struct {
		method, path, key string
		status            int
		body              string
	}{
		{"GET", "/healthz", "", 200, "ok\n"},
		{"GET", "/readyz", "", 200, "ok\n"},
		{"GET", "/v1/chat/completions", keyA, 405, errorBody("Method not allowed for this URL.", inv, "", "method_not_allowed")},
		{"POST", "/v1/models", keyA, 405, errorBody("Method not allowed for this URL.", inv, "", "method_not_allowed")},
		{"GET", "/v1/engines", keyA, 404, errorBody("Unknown request URL. Served: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.", inv, "", "not_found")},
		{"GET", "/v1/models", "", 401, errorBody("You didn't provide an API key. Send it in the Authorization header: 'Authorization: Bearer YOUR_KEY'.", "authentication_error", "", "invalid_api_key")},
		{"GET", "/v1/models", keyA, 200, `{"object":"list","data":[{"id":"kvfence-test","object":"model","created":1700000000,"owned_by":"kvfence","max_model_len":200}]}` + "\n"},
		{"GET", "/v1/models/kvfence-test", keyA, 200, `{"id":"kvfence-test","object":"model","created":1700000000,"owned_by":"kvfence","max_model_len":200}` + "\n"},
		{"POST", "/v1/completions", "", 401, errorBody("You didn't provide an API key. Send it in the Authorization header: 'Authorization: Bearer YOUR_KEY'.", "authentication_error", "", "invalid_api_key")},
	}
	for _, tt := range tests {
		rec := do(f, tt.method, tt.path, "", tt.key)
		if rec.Code != tt.status || rec.Body.String() != tt.body {
			t.Errorf("%s %s: got %d %q\nwant %d %q", tt.method, tt.path, rec.Code, rec.Body, tt.status, tt.body)
		}
	}
	ready = errors.New("loading model")
	if rec := do(f, "GET", "/readyz", "", ""); rec.Code != 503 || rec.Body.String() != "not ready: loading model\n" {
		t.Errorf("readyz: %d %q", rec.Code, rec.Body)
	}
	// A key in lower-case scheme works; a key followed by junk does not.
	req := httptest.NewRequest("GET", "/v1/models", nil)
	req.Header.Set("Authorization", "bearer "+keyA)
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("lower-case bearer: %d", rec.Code)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, Config{}, true)
	do(f, "POST", "/v1/completions", `{"model":"kvfence-test","prompt":"ab","max_tokens":4}`, keyA)
	do(f, "POST", "/v1/completions", `{"model":"kvfence-test","prompt":"ab","max_tokens":4,"stream":true}`, keyB)
	do(f, "POST", "/v1/completions", `{"model":"kvfence-test","prompt":"ab","max_tokens":4}`, "")
	do(f, "POST", "/v1/completions", `{"model":"kvfence-test","prompt":"#fail-first"}`, keyA)
	do(f, "POST", "/v1/chat/completions", `{"model":"kvfence-test","messages":[],"max_tokens":4}`, keyA)
	rec := do(f, "GET", "/metrics", "", "")
	out := rec.Body.String()
	for _, want := range []string{
		`kvfence_http_requests_total{code="200",endpoint="completions"} 2`,
		`kvfence_http_requests_total{code="401",endpoint="completions"} 1`,
		`kvfence_http_requests_total{code="500",endpoint="completions"} 1`,
		`kvfence_http_requests_total{code="400",endpoint="chat_completions"} 1`,
		`kvfence_http_rejected_requests_total{reason="invalid_api_key"} 1`,
		`kvfence_http_rejected_requests_total{reason="kv_integrity_error"} 1`,
		`kvfence_http_rejected_requests_total{reason="invalid_request"} 1`,
		`kvfence_generation_tokens_total 8`,
		`kvfence_prompt_tokens_total 4`,
		`kvfence_time_to_first_token_seconds_count 2`,
		`kvfence_inter_token_latency_seconds_count 6`,
		`kvfence_e2e_request_latency_seconds_count 2`,
		`kvfence_http_requests_in_flight 0`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, secret := range []string{"tenant-a", "tenant-b", keyA, "kvfence-test", "fail-first"} {
		if strings.Contains(out, secret) {
			t.Errorf("metrics contain %q", secret)
		}
	}
	// Every series line parses as name{labels} value.
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") && strings.Count(l, " ") != 1 {
			t.Errorf("odd line %q", l)
		}
	}
}

func TestErrorFor(t *testing.T) {
	tests := []struct {
		err                       error
		status                    int
		typ, code, param, message string
		reason                    string
		log                       bool
	}{
		{&reqerr.ContextLengthError{Prompt: 5000, MaxTokens: 100, Limit: 4096}, 400, inv, "context_length_exceeded", "",
			"this model's maximum context length is 4096 tokens; the request has 5000 prompt tokens and asks for 100 more (5100 in total). Please reduce the length of the prompt or of max_tokens.",
			"context_length_exceeded", false},
		{fmt.Errorf("room 7: %w", &reqerr.ContextLengthError{Prompt: 1, MaxTokens: 2, Limit: 2}), 400, inv, "context_length_exceeded", "",
			"this model's maximum context length is 2 tokens; the request has 1 prompt tokens and asks for 2 more (3 in total). Please reduce the length of the prompt or of max_tokens.",
			"context_length_exceeded", false},
		{reqerr.New(reqerr.KindInvalidRequest, "seed out of range"), 400, inv, "invalid_request", "", "seed out of range", "invalid_request", false},
		{reqerr.New(reqerr.KindUnknownModel, ""), 404, inv, "model_not_found", "model", "The model does not exist.", "model_not_found", false},
		{reqerr.New(reqerr.KindOverloaded, "queue full"), 429, "rate_limit_error", "overloaded", "", "queue full", "overloaded", false},
		{reqerr.New(reqerr.KindNoWorkers, ""), 503, "service_unavailable_error", "no_workers", "", "No worker is available to serve the request; retry later.", "no_workers", false},
		{reqerr.New(reqerr.KindShuttingDown, ""), 503, "service_unavailable_error", "shutting_down", "", "The server is shutting down.", "shutting_down", false},
		{reqerr.New(reqerr.KindAborted, "shutdown timeout"), 503, "service_unavailable_error", "aborted", "", "shutdown timeout", "aborted", false},
		{reqerr.New(reqerr.KindPeerLost, "prefill 2 epoch 5"), 502, "server_error", "peer_lost", "", "prefill 2 epoch 5", "peer_lost", false},
		{fmt.Errorf("x: %w", reqerr.New(reqerr.KindIntegrity, "checksum mismatch on page 9")), 500, "server_error", "kv_integrity_error", "", "checksum mismatch on page 9", "kv_integrity_error", true},
		{reqerr.New(reqerr.KindInternal, "bug"), 500, "server_error", "internal_error", "", "The server had an error while processing your request.", "internal_error", true},
		{errors.New("disk on fire at /secret/path"), 500, "server_error", "internal_error", "", "The server had an error while processing your request.", "internal_error", true},
		{paramErr("stop", codeInvalid, "bad stop"), 400, inv, "invalid_value", "stop", "bad stop", "invalid_request", false},
		{&http.MaxBytesError{Limit: 10}, 413, inv, "request_too_large", "", "The request body is larger than the limit of 10 bytes.", "request_too_large", false},
		{errMissingKey, 401, "authentication_error", "invalid_api_key", "", "You didn't provide an API key. Send it in the Authorization header: 'Authorization: Bearer YOUR_KEY'.", "invalid_api_key", false},
		{errInvalidKey, 401, "authentication_error", "invalid_api_key", "", "Incorrect API key provided.", "invalid_api_key", false},
		{context.Canceled, 499, inv, "client_closed", "", "The client closed the request.", "aborted", false},
		{fmt.Errorf("next: %w", context.Canceled), 499, inv, "client_closed", "", "The client closed the request.", "aborted", false},
	}
	for _, tt := range tests {
		got := ErrorFor(tt.err)
		want := ErrorInfo{Status: tt.status, Type: tt.typ, Code: tt.code, Param: tt.param, Message: tt.message, Reason: tt.reason, Log: tt.log}
		if got != want {
			t.Errorf("ErrorFor(%v)\n got %+v\nwant %+v", tt.err, got, want)
		}
	}
	// Every kind maps to a status and a non-empty message.
	for k := reqerr.Kind(0); k.Valid(); k++ {
		info := ErrorFor(reqerr.New(k, ""))
		if info.Status < 400 || info.Message == "" || info.Reason != k.String() && k != reqerr.KindUnknown {
			t.Errorf("kind %v: %+v", k, info)
		}
	}
}
