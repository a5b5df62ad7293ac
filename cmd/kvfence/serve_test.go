package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/router"
	"github.com/kvfence/kvfence/internal/router/api"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

const (
	serveTestCtx   = 256
	serveModelName = "tiny-serve"
)

// serveFixture is `kvfence serve` running in this process on a loopback
// port, with a tiny model built for the test.
type serveFixture struct {
	t       *testing.T
	url     string
	model   *model.Model // the same file, loaded again for reference generations
	keys    map[string]string
	httpc   *http.Client
	cancel  context.CancelFunc
	served  chan error
	logBuf  *syncBuffer
	stopped bool
}

type syncBuffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var serveTenants = []string{"team-a", "team-b", "team-c", "team-d"}

func startServe(t *testing.T, extra ...string) *serveFixture {
	t.Helper()
	goroutines := runtime.NumGoroutine()
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny.gguf")
	if err := modelbuild.Write(modelbuild.Options{
		Arch: "qwen3", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 96, Ctx: serveTestCtx,
		Type: gguf.TypeQ8_0, Seed: 11, Tokenizer: tokenizer.Tiny(), Name: "tiny",
	}, path); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	var keyFile strings.Builder
	for i, name := range serveTenants {
		k := fmt.Sprintf("sk-serve-test-%d-0123456789abcdef", i)
		keys[name] = k
		fmt.Fprintf(&keyFile, "%s %s 8\n", k, name)
	}
	keyPath := filepath.Join(dir, "keys")
	if err := os.WriteFile(keyPath, []byte(keyFile.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--model", path, "--api-keys", keyPath, "--served-model-name", serveModelName,
		"--kv-cache-memory", "1MiB", "--threads", "1", "--shutdown-timeout", "5s"}, extra...)
	o, err := parseServeFlags(args)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &serveFixture{
		t: t, url: "http://" + ln.Addr().String(), keys: keys, cancel: cancel,
		served: make(chan error, 1), logBuf: &syncBuffer{},
		httpc: &http.Client{Transport: &http.Transport{}},
	}
	log := slog.New(slog.NewTextHandler(f.logBuf, nil))
	go func() { f.served <- serve(ctx, o, ln, log) }()
	f.model, err = model.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.stop()
		f.model.Close()
		f.httpc.CloseIdleConnections()
		serveWaitGoroutines(t, goroutines)
		if t.Failed() {
			t.Logf("serve log:\n%s", f.logBuf.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := f.httpc.Get(f.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-f.served:
			f.stopped = true
			t.Fatalf("serve returned before it was ready: %v\n%s", err, f.logBuf.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve not ready after 20s\n%s", f.logBuf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return f
}

// stop cancels serve's context (SIGTERM) and checks that it returns nil in
// bounded time.
func (f *serveFixture) stop() {
	f.t.Helper()
	if f.stopped {
		return
	}
	f.stopped = true
	f.cancel()
	select {
	case err := <-f.served:
		if err != nil {
			f.t.Errorf("serve returned %v, want nil after a graceful shutdown", err)
		}
	case <-time.After(20 * time.Second):
		f.t.Fatalf("serve did not return 20s after shutdown began")
	}
}

func (f *serveFixture) client(tenant string) openai.Client {
	return openai.NewClient(option.WithBaseURL(f.url+"/v1/"), option.WithAPIKey(f.keys[tenant]),
		option.WithMaxRetries(0), option.WithHTTPClient(f.httpc))
}

// metrics scrapes /metrics and returns the samples whose name starts with
// prefix, keyed by the sample's text before the value.
func (f *serveFixture) metrics(prefix string) map[string]float64 {
	f.t.Helper()
	resp, err := f.httpc.Get(f.url + "/metrics")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			f.t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// waitPoolsIdle waits until the pool gauges say every page of both pools is
// free (I5 at rest), and returns the gauges.
func (f *serveFixture) waitPoolsIdle() map[string]float64 {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := f.metrics("kvfence_kv_pool_pages")
		held := 0.0
		for _, role := range []string{"decode", "prefill"} {
			for _, state := range []string{"allocated", "deferred", "quarantined"} {
				v, ok := m[fmt.Sprintf(`kvfence_kv_pool_pages{role=%q,state=%q}`, role, state)]
				if !ok {
					f.t.Fatalf("no pool gauge for %s %s in %v", role, state, m)
				}
				held += v
			}
		}
		if held == 0 && m[`kvfence_kv_pool_pages{role="decode",state="free"}`] > 0 {
			return m
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("pages still held: %v", m)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reference is the plain model's greedy generation for a request: prompt
// tokens, generated ids, the text and the finish reason a server must give.
type reference struct {
	prompt int
	ids    []int32
	text   string
	finish string
}

func (f *serveFixture) reference(r *api.Request) reference {
	f.t.Helper()
	prompt, err := router.Tokenize(f.model.Tok, r)
	if err != nil {
		f.t.Fatal(err)
	}
	ids := serveGreedy(f.t, f.model, prompt, r.MaxTokens)
	ref := reference{prompt: len(prompt), ids: ids, finish: "length"}
	text := ids
	if f.model.Tok.IsEOG(ids[len(ids)-1]) {
		text, ref.finish = ids[:len(ids)-1], "stop"
	}
	ref.text = f.model.Tok.Decode(text)
	return ref
}

// serveGreedy runs the model directly: no engine, no pool, no transfer.
func serveGreedy(t testing.TB, m *model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	out, err := m.Greedy(prompt, n, m.Tok.IsEOG)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func serveWaitGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Errorf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func serveTestContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func serveChatReq(content string, max int) *api.Request {
	return &api.Request{Chat: true, Messages: []api.Message{{Role: "user", Content: content}}, MaxTokens: max}
}

func TestServeChatAndCompletions(t *testing.T) {
	f := startServe(t)
	ctx := serveTestContext(t)
	c := f.client("team-a")

	const content, max = "the cat sat on the mat", 10
	ref := f.reference(serveChatReq(content, max))
	chat := openai.ChatCompletionNewParams{
		Model:       serveModelName,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)},
		MaxTokens:   openai.Int(max),
		Temperature: openai.Float(0),
	}
	resp, err := c.Chat.Completions.New(ctx, chat)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0]; got.Message.Content != ref.text || string(got.FinishReason) != ref.finish {
		t.Fatalf("chat: %q (%s), want %q (%s)", got.Message.Content, got.FinishReason, ref.text, ref.finish)
	}
	if u := resp.Usage; u.PromptTokens != int64(ref.prompt) || u.CompletionTokens != int64(len(ref.ids)) || u.TotalTokens != int64(ref.prompt+len(ref.ids)) {
		t.Fatalf("chat usage %+v, want prompt %d completion %d", u, ref.prompt, len(ref.ids))
	}

	// Streaming, with usage in the last chunk.
	chat.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(ctx, chat)
	var text strings.Builder
	var finish string
	var usage openai.CompletionUsage
	for s.Next() {
		ch := s.Current()
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
			if ch.Choices[0].FinishReason != "" {
				finish = string(ch.Choices[0].FinishReason)
			}
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if text.String() != ref.text || finish != ref.finish || usage.CompletionTokens != int64(len(ref.ids)) || usage.PromptTokens != int64(ref.prompt) {
		t.Fatalf("chat stream: %q (%s) usage %+v, want %q (%s)", text.String(), finish, usage, ref.text, ref.finish)
	}

	// Completions, plain and streaming.
	const prompt = "in the beginning"
	cref := f.reference(&api.Request{Prompt: prompt, MaxTokens: 12})
	cparams := openai.CompletionNewParams{
		Model:       openai.CompletionNewParamsModel(serveModelName),
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0),
	}
	cresp, err := c.Completions.New(ctx, cparams)
	if err != nil {
		t.Fatal(err)
	}
	if got := cresp.Choices[0]; got.Text != cref.text || string(got.FinishReason) != cref.finish ||
		cresp.Usage.PromptTokens != int64(cref.prompt) || cresp.Usage.CompletionTokens != int64(len(cref.ids)) {
		t.Fatalf("completion: %q (%s) usage %+v, want %q (%s), %d + %d tokens", got.Text, got.FinishReason, cresp.Usage, cref.text, cref.finish, cref.prompt, len(cref.ids))
	}
	cs := c.Completions.NewStreaming(ctx, cparams)
	text.Reset()
	for cs.Next() {
		if ch := cs.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	cs.Close()
	if text.String() != cref.text {
		t.Fatalf("completion stream: %q, want %q", text.String(), cref.text)
	}

	// A stop sequence cuts the text before it, streaming or not.
	long := f.reference(&api.Request{Prompt: prompt, MaxTokens: 40})
	runes := []rune(long.text)
	if len(runes) < 6 {
		t.Fatalf("reference text %q too short to cut", long.text)
	}
	stop := string(runes[3:5])
	want := long.text[:strings.Index(long.text, stop)]
	cparams.MaxTokens = openai.Int(40)
	cparams.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}
	cresp, err = c.Completions.New(ctx, cparams)
	if err != nil {
		t.Fatal(err)
	}
	if got := cresp.Choices[0]; got.Text != want || got.FinishReason != "stop" {
		t.Fatalf("stop %q: %q (%s), want %q (stop)", stop, got.Text, got.FinishReason, want)
	}
	cs = c.Completions.NewStreaming(ctx, cparams)
	text.Reset()
	for cs.Next() {
		if ch := cs.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	cs.Close()
	if text.String() != want {
		t.Fatalf("stop %q streaming: %q, want %q", stop, text.String(), want)
	}

	// Models lists the served name with the context window.
	models, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != serveModelName {
		t.Fatalf("models %+v", models.Data)
	}
	f.waitPoolsIdle()
}

func TestServeErrors(t *testing.T) {
	f := startServe(t)
	ctx := serveTestContext(t)
	c := f.client("team-b")
	before := f.metrics("kvfence_admissions_rejected_total")

	long := strings.Repeat("x ", 300)
	for _, stream := range []bool{false, true} {
		params := openai.ChatCompletionNewParams{
			Model:     serveModelName,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(long)},
			MaxTokens: openai.Int(5),
		}
		var err error
		if stream {
			s := c.Chat.Completions.NewStreaming(ctx, params)
			for s.Next() {
			}
			err = s.Err()
			s.Close()
		} else {
			_, err = c.Chat.Completions.New(ctx, params)
		}
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "context_length_exceeded" ||
			!strings.Contains(apiErr.Message, strconv.Itoa(serveTestCtx)) {
			t.Fatalf("stream=%v: %v, want 400 context_length_exceeded naming %d", stream, err, serveTestCtx)
		}
	}
	// No page is held afterwards, and nothing reached a worker (the router
	// rejected it by token count).
	m := f.waitPoolsIdle()
	if m[`kvfence_kv_pool_pages{role="decode",state="free"}`] == 0 {
		t.Fatalf("pool gauges %v", m)
	}
	all := f.metrics("kvfence_")
	for _, name := range []string{
		`kvfence_decode_deferred_kv_release_total{outcome="drained"}`,
		`kvfence_decode_deferred_kv_release_total{outcome="timeout"}`,
		`kvfence_kv_pool_tokens{role="decode"}`,
		`kvfence_kv_fence_mismatches_total{role="decode"}`,
		`kvfence_kv_checksum_failures_total{role="decode"}`,
		`kvfence_kv_quarantined_pages_total{role="decode"}`,
		`kvfence_http_rejected_requests_total{reason="context_length_exceeded"}`,
	} {
		if _, ok := all[name]; !ok {
			t.Errorf("metric %s missing", name)
		}
	}
	if w := all[`kvfence_context_window_tokens{role="decode"}`]; w != serveTestCtx {
		t.Errorf("context window gauge %v, want %d", w, serveTestCtx)
	}
	if all[`kvfence_http_rejected_requests_total{reason="context_length_exceeded"}`] != 2 {
		t.Errorf("rejections counted: %v", all[`kvfence_http_rejected_requests_total{reason="context_length_exceeded"}`])
	}
	after := f.metrics("kvfence_admissions_rejected_total")
	if len(after) != len(before) {
		t.Fatalf("a worker saw the rejected request: %v -> %v", before, after)
	}

	// Unknown model: 404; bad key: 401.
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model: %v", err)
	}
	bad := openai.NewClient(option.WithBaseURL(f.url+"/v1/"), option.WithAPIKey("sk-not-a-key-0123456789"),
		option.WithMaxRetries(0), option.WithHTTPClient(f.httpc))
	_, err = bad.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: serveModelName, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad key: %v", err)
	}
}

// TestServeConcurrentGreedyEqualsModel: 16 concurrent greedy requests from 4
// tenants, each equal to the plain model's generation (I7).
func TestServeConcurrentGreedyEqualsModel(t *testing.T) {
	f := startServe(t)
	ctx := serveTestContext(t)
	contents := []string{"the cat", "hello there", "in the beginning was the word", "a b c d e f g", "zebra", "once upon a time", "the the the", "numbers 1 2 3"}
	refs := make([]reference, len(contents))
	for i, s := range contents {
		refs[i] = f.reference(serveChatReq(s, 16))
	}
	for i, r := range refs {
		t.Logf("reference %d: %d prompt tokens, %d generated, finish %s, %q", i, r.prompt, len(r.ids), r.finish, r.text)
	}
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := f.client(serveTenants[i%len(serveTenants)])
			k := i % len(contents)
			resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:       serveModelName,
				Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(contents[k])},
				MaxTokens:   openai.Int(16),
				Temperature: openai.Float(0),
			})
			switch {
			case err != nil:
				errs[i] = err
			case resp.Choices[0].Message.Content != refs[k].text:
				errs[i] = fmt.Errorf("%q, want %q", resp.Choices[0].Message.Content, refs[k].text)
			case resp.Usage.CompletionTokens != int64(len(refs[k].ids)):
				errs[i] = fmt.Errorf("%d completion tokens, want %d", resp.Usage.CompletionTokens, len(refs[k].ids))
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d (tenant %s): %v", i, serveTenants[i%len(serveTenants)], err)
		}
	}
	f.waitPoolsIdle()
}

// TestServeGracefulShutdown: a shutdown with a request in flight finishes
// it within --shutdown-timeout or aborts it, frees everything and returns nil.
func TestServeGracefulShutdown(t *testing.T) {
	f := startServe(t, "--shutdown-timeout", "300ms")
	ctx := serveTestContext(t)
	c := f.client("team-c")
	s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(serveModelName),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("the cat")},
		MaxTokens: openai.Int(200),
	})
	if !s.Next() {
		t.Fatalf("no first chunk: %v", s.Err())
	}
	f.stop() // fails the test unless serve returns nil
	for s.Next() {
	}
	s.Close()
	if !strings.Contains(f.logBuf.String(), "shut down") {
		t.Fatalf("no shutdown line in the log:\n%s", f.logBuf.String())
	}
	// The server is gone: new requests fail to connect.
	if _, err := f.httpc.Get(f.url + "/healthz"); err == nil {
		t.Fatal("server still answering after shutdown")
	}
}

func TestServeFlags(t *testing.T) {
	o, err := parseServeFlags([]string{"--kv-cache-memory", "2GiB", "--abort-policy", "immediate", "--unsafe-no-checksum", "--unsafe-no-tombstones"})
	if err != nil {
		t.Fatal(err)
	}
	if o.kvCacheMemory != 2<<30 || o.abortPolicy != router.AbortImmediate || !o.protections.NoChecksum || !o.protections.NoTombstones ||
		o.protections.NoFenceCheck || len(o.unsafeFlagsChanged) != 2 || o.host != "127.0.0.1" || o.port != 8080 {
		t.Fatalf("options %+v", o)
	}
	for in, want := range map[string]string{"256MiB": "256MiB", "1G": "1GiB", "1.5GiB": "1536MiB", "1000": "1000", "64KiB": "64KiB"} {
		var b byteSize
		if err := b.Set(in); err != nil || b.String() != want {
			t.Errorf("byteSize %q: %q, %v; want %q", in, b.String(), err, want)
		}
	}
	for _, bad := range [][]string{{"--abort-policy", "later"}, {"--kv-cache-memory", "lots"}, {"--port", "70000"}} {
		if _, err := parseServeFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	var out strings.Builder
	if code := run(context.Background(), []string{"serve", "--help"}, &out, io.Discard); code != 0 {
		t.Fatalf("serve --help exit %d", code)
	}
}

// TestServePoolSmallerThanWindow: I6. A pool that cannot hold the context
// window refuses to start, naming both numbers; --lower-context-to-fit
// lowers the window to the pool instead, and the API and the metrics say so.
func TestServePoolSmallerThanWindow(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny.gguf")
	if err := modelbuild.Write(modelbuild.Options{
		Arch: "qwen3", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 96, Ctx: serveTestCtx,
		Type: gguf.TypeQ8_0, Seed: 11, Tokenizer: tokenizer.Tiny(), Name: "tiny",
	}, path); err != nil {
		t.Fatal(err)
	}
	// A page of this model is 64 + 2 layers x (K+V) x 16 slots x 2 heads x
	// 32 dims x 4 bytes = 16448 bytes: 64 KiB holds 3 pages, 48 tokens.
	o, err := parseServeFlags([]string{"--model", path, "--kv-cache-memory", "64KiB", "--threads", "1"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logBuf syncBuffer
	err = serve(context.Background(), o, ln, slog.New(slog.NewTextHandler(&logBuf, nil)))
	if err == nil || !strings.Contains(err.Error(), "48 tokens") || !strings.Contains(err.Error(), "256 tokens") || !strings.Contains(err.Error(), "--lower-context-to-fit") {
		t.Fatalf("serve with a small pool: %v", err)
	}

	f := startServe(t, "--kv-cache-memory", "64KiB", "--lower-context-to-fit")
	c := f.client("team-a")
	models, err := c.Models.List(serveTestContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 {
		t.Fatalf("models %+v", models.Data)
	}
	if w := f.metrics("kvfence_context_window_tokens")[`kvfence_context_window_tokens{role="decode"}`]; w != 48 {
		t.Fatalf("context window gauge %v, want 48", w)
	}
	if !strings.Contains(f.logBuf.String(), "pool_tokens=48") {
		t.Fatalf("the log does not give the pool in tokens:\n%s", f.logBuf.String())
	}
}
