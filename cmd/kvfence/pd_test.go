//go:build unix

package main

// Tests of a disaggregated deployment as operators run it: separate
// `kvfence router`, `kvfence prefill` and `kvfence decode` processes on
// loopback, talking over HTTP and TCP, driven by the official OpenAI Go SDK.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// pdKeys is the API key file of the test deployments: four tenants.
const pdKeys = "sk-test-key-aaaaaaaa tenant-a\nsk-test-key-bbbbbbbb tenant-b\nsk-test-key-cccccccc tenant-c\nsk-test-key-dddddddd tenant-d\n"

var pdKeyList = []string{"sk-test-key-aaaaaaaa", "sk-test-key-bbbbbbbb", "sk-test-key-cccccccc", "sk-test-key-dddddddd"}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// pdClient is an SDK client of a deployment and the model it serves.
type pdClient struct {
	openai.Client
	model string
}

func (c *pdCluster) client(key string) pdClient {
	return pdClient{
		Client: openai.NewClient(option.WithBaseURL(c.base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0)),
		model:  pdModels[c.model].Name,
	}
}

// apiError returns the OpenAI error of err, failing the test if err is not
// one.
func apiError(t *testing.T, err error) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("want an API error, got %v", err)
	}
	return e
}

func TestPDRefusesToStartWithoutClusterSecret(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	bin := kvfenceBinary(t)
	for _, args := range [][]string{
		{"decode", "--port", "0"},
		{"prefill", "--port", "0"},
		{"router", "--port", "0", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"},
	} {
		cmd := exec.CommandContext(ctx, bin, args...)
		env := []string{}
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "KVFENCE_CLUSTER_SECRET=") {
				env = append(env, e)
			}
		}
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("%s: want exit code 1, got %v", args[0], err)
		}
		for _, want := range []string{"no cluster secret", "--cluster-secret-file", "KVFENCE_CLUSTER_SECRET"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("%s: message %q does not say %q", args[0], stderr.String(), want)
			}
		}
	}
}

func TestPDHelpExplainsFlags(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	bin := kvfenceBinary(t)
	for cmdName, flags := range map[string][]string{
		"decode":  {"--model", "--host", "--port", "--transfer-port", "--transfer-backend", "--peer-id", "--context-length", "--page-size", "--kv-cache-memory", "--max-running-requests", "--cluster-secret-file", "--shutdown-timeout"},
		"prefill": {"--model", "--host", "--port", "--chunked-prefill-size", "--page-size", "--kv-cache-memory", "--cluster-secret-file", "--shutdown-timeout"},
		"router":  {"--prefill", "--decode", "--host", "--port", "--api-keys", "--abort-policy", "--cluster-secret-file", "--shutdown-timeout"},
	} {
		cmd := exec.CommandContext(ctx, bin, cmdName, "--help")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s --help: %v\n%s", cmdName, err, out)
		}
		for _, f := range flags {
			// The flag package prints "  -name value\n    \thelp".
			i := bytes.Index(out, []byte("  -"+strings.TrimPrefix(f, "--")+" "))
			if i < 0 {
				i = bytes.Index(out, []byte("  -"+strings.TrimPrefix(f, "--")+"\n"))
			}
			if i < 0 {
				t.Errorf("%s --help does not explain %s:\n%s", cmdName, f, out)
			}
		}
	}
}

// TestPD runs one three-process deployment and checks the API through it.
func TestPD(t *testing.T) {
	keys := writeFile(t, "keys", pdKeys)
	c := startPD(t, pdConfig{model: "tiny", prefills: 1,
		worker:    []string{"--kv-cache-memory", "4MiB"},
		routerArg: []string{"--api-keys", keys}})
	t.Run("Startup", func(t *testing.T) { testPDStartup(t, c) })
	t.Run("OpenAI", func(t *testing.T) { testPDOpenAI(t, c) })
	t.Run("Malformed", func(t *testing.T) { testPDMalformed(t, c) })
	t.Run("GreedyEqualsGenerate", func(t *testing.T) { testPDGreedyEqualsGenerate(t, c) })
	t.Run("GracefulShutdown", func(t *testing.T) { testPDShutdown(t, c) })
}

// testPDStartup checks the I6 log lines and the worker endpoints.
func testPDStartup(t *testing.T, c *pdCluster) {
	ctx := testContext(t, 20*time.Second)
	if log := strings.TrimSpace(c.router.logText()); !strings.HasSuffix(log, "url="+c.base+"/v1") {
		t.Errorf("router: the last line does not name the URL:\n%s", log)
	}
	for _, p := range append([]*proc{c.decode}, c.prefills...) {
		log := p.logText()
		lines := strings.Split(strings.TrimSpace(log), "\n")
		var pool string
		for _, l := range lines {
			if strings.Contains(l, `msg="KV pool"`) {
				pool = l
			}
		}
		for _, want := range []string{"pages=", "pool_tokens=", "context_window=256"} {
			if !strings.Contains(pool, want) {
				t.Errorf("%s: pool line %q lacks %s", p.name, pool, want)
			}
		}
		if last := lines[len(lines)-1]; !strings.Contains(last, "url=http://127.0.0.1:") {
			t.Errorf("%s: last line %q does not name the URL", p.name, last)
		}
		for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ok\n"} {
			body, status := get(t, ctx, p.waitURL(t)+path)
			if status != 200 || body != want {
				t.Errorf("%s %s: %d %q", p.name, path, status, body)
			}
		}
		// The internal API refuses calls without the cluster secret.
		body, status := get(t, ctx, p.waitURL(t)+"/internal/v1/info")
		if status != http.StatusUnauthorized {
			t.Errorf("%s: unauthenticated info: %d %q", p.name, status, body)
		}
	}
	if w := metric(t, ctx, c.decode.waitURL(t), "kvfence_context_window_tokens", "role", "decode"); w != 256 {
		t.Errorf("decode context window metric %v", w)
	}
	for _, role := range []string{"decode", "prefill"} {
		if n := metric(t, ctx, c.base, "kvfence_router_workers_available", "role", role); n != 1 {
			t.Errorf("router: %v %s workers available, want 1", n, role)
		}
	}
	pages := poolPages(t, ctx, c.decode.waitURL(t))
	tokens := metric(t, ctx, c.decode.waitURL(t), "kvfence_kv_pool_tokens", "role", "decode")
	if pages["free"]*16 != tokens || tokens < 256 {
		t.Errorf("decode pool %v, %v tokens", pages, tokens)
	}
}

func get(t *testing.T, ctx context.Context, url string) (string, int) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// completion is one generation as the tests compare them.
type completion struct {
	text   string
	finish string
	usage  openai.CompletionUsage
}

func complete(ctx context.Context, cl pdClient, prompt string, maxTokens int, stop []string, stream bool) (completion, error) {
	p := openai.CompletionNewParams{
		Model:       openai.CompletionNewParamsModel(cl.model),
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:   openai.Int(int64(maxTokens)),
		Temperature: openai.Float(0),
	}
	if len(stop) > 0 {
		p.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: stop}
	}
	if !stream {
		r, err := cl.Completions.New(ctx, p)
		if err != nil {
			return completion{}, err
		}
		if len(r.Choices) != 1 {
			return completion{}, fmt.Errorf("%d choices", len(r.Choices))
		}
		return completion{text: r.Choices[0].Text, finish: string(r.Choices[0].FinishReason), usage: r.Usage}, nil
	}
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := cl.Completions.NewStreaming(ctx, p)
	var c completion
	for s.Next() {
		ch := s.Current()
		if ch.JSON.Usage.Valid() && ch.Usage.TotalTokens > 0 {
			c.usage = ch.Usage
		}
		for _, x := range ch.Choices {
			c.text += x.Text
			if x.FinishReason != "" {
				c.finish = string(x.FinishReason)
			}
		}
	}
	return c, s.Err()
}

func chat(ctx context.Context, cl pdClient, msg string, maxTokens int, stream bool) (completion, error) {
	p := openai.ChatCompletionNewParams{
		Model:       cl.model,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(msg)},
		MaxTokens:   openai.Int(int64(maxTokens)),
		Seed:        openai.Int(1),
		Temperature: openai.Float(0),
	}
	if !stream {
		r, err := cl.Chat.Completions.New(ctx, p)
		if err != nil {
			return completion{}, err
		}
		if len(r.Choices) != 1 {
			return completion{}, fmt.Errorf("%d choices", len(r.Choices))
		}
		return completion{text: r.Choices[0].Message.Content, finish: r.Choices[0].FinishReason, usage: r.Usage}, nil
	}
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := cl.Chat.Completions.NewStreaming(ctx, p)
	var c completion
	for s.Next() {
		ch := s.Current()
		if len(ch.Choices) == 0 {
			c.usage = ch.Usage
		}
		for _, x := range ch.Choices {
			c.text += x.Delta.Content
			if x.FinishReason != "" {
				c.finish = x.FinishReason
			}
		}
	}
	return c, s.Err()
}

// promptTokenCount is the number of tokens the router counts for a
// completion prompt.
func promptTokenCount(t *testing.T, c *pdCluster, prompt string, chatMsg bool) int {
	t.Helper()
	tok, _, err := routerTokenizer(pdModel(t, "tiny"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := promptTokens(tok, prompt, chatMsg)
	if err != nil {
		t.Fatal(err)
	}
	return len(ids)
}

func testPDOpenAI(t *testing.T, c *pdCluster) {
	ctx := testContext(t, 60*time.Second)
	cl := c.client(pdKeyList[0])

	models, err := cl.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "pd-tiny" {
		t.Fatalf("models %+v", models.Data)
	}

	type gen func(stream bool) (completion, error)
	for _, tc := range []struct {
		name   string
		gen    gen
		prompt int // prompt tokens
	}{
		{"completions", func(s bool) (completion, error) { return complete(ctx, cl, "the cat sat on", 12, nil, s) },
			promptTokenCount(t, c, "the cat sat on", false)},
		{"chat", func(s bool) (completion, error) { return chat(ctx, cl, "hello there", 12, s) },
			promptTokenCount(t, c, "hello there", true)},
	} {
		plain, err := tc.gen(false)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		streamed, err := tc.gen(true)
		if err != nil {
			t.Fatalf("%s streaming: %v", tc.name, err)
		}
		u := plain.usage
		if int(u.PromptTokens) != tc.prompt || u.CompletionTokens < 1 || u.CompletionTokens > 12 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("%s: usage %+v, want %d prompt tokens and 1..12 completion tokens", tc.name, u, tc.prompt)
		}
		if want := map[bool]string{true: "length", false: "stop"}[u.CompletionTokens == 12]; plain.finish != want {
			t.Errorf("%s: finish %q after %d tokens, want %q", tc.name, plain.finish, u.CompletionTokens, want)
		}
		// Greedy: streaming gives the same tokens, text and counts.
		if streamed.text != plain.text || streamed.finish != plain.finish || streamed.usage.PromptTokens != u.PromptTokens ||
			streamed.usage.CompletionTokens != u.CompletionTokens || streamed.usage.TotalTokens != u.TotalTokens {
			t.Errorf("%s: streamed %+v, plain %+v", tc.name, streamed, plain)
		}
	}

	t.Run("StopSequences", func(t *testing.T) {
		full, err := complete(ctx, cl, "once upon a time", 24, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		runes := []rune(full.text)
		if len(runes) < 6 {
			t.Fatalf("greedy text %q too short to cut", full.text)
		}
		stop := string(runes[3:5])
		want := full.text[:strings.Index(full.text, stop)]
		for _, stream := range []bool{false, true} {
			got, err := complete(ctx, cl, "once upon a time", 24, []string{"\x00never", stop}, stream)
			if err != nil {
				t.Fatal(err)
			}
			if got.text != want || got.finish != "stop" {
				t.Errorf("stream=%v: stop %q in %q: got %q (%s), want %q", stream, stop, full.text, got.text, got.finish, want)
			}
		}
	})

	t.Run("ContextLengthExceeded", func(t *testing.T) {
		long := strings.Repeat("the ", 300) // about 300 tokens, window 256
		n := promptTokenCount(t, c, long, false)
		for _, tc := range []struct {
			prompt    string
			maxTokens int
			tokens    int
		}{{long, 8, n}, {"short prompt", 250, promptTokenCount(t, c, "short prompt", false)}} {
			_, err := complete(ctx, cl, tc.prompt, tc.maxTokens, nil, false)
			e := apiError(t, err)
			if e.StatusCode != 400 || e.Code != "context_length_exceeded" || e.Type != "invalid_request_error" ||
				!strings.Contains(e.Message, "256") || !strings.Contains(e.Message, strconv.Itoa(tc.tokens)) {
				t.Errorf("status %d code %q type %q message %q; want 400 context_length_exceeded naming 256 and %d",
					e.StatusCode, e.Code, e.Type, e.Message, tc.tokens)
			}
		}
		// No page is held afterwards (I3); the other requests of this test
		// have ended, so the pool is at rest.
		waitPoolAtRest(t, ctx, c.decode.waitURL(t), 10*time.Second)
	})
}

// testPDMalformed sends requests the API must refuse with a precise 4xx,
// while well-formed requests go on being served.
func testPDMalformed(t *testing.T, c *pdCluster) {
	ctx := testContext(t, 60*time.Second)
	huge := `{"model":"pd-tiny","prompt":"` + strings.Repeat("a", 10<<20) + `"}`
	for _, tc := range []struct {
		name, path, key, body string
		status                int
		code, param           string
	}{
		{"bad json", "/v1/completions", pdKeyList[0], `{"model":"pd-tiny","prompt":`, 400, "invalid_json", ""},
		{"not an object", "/v1/chat/completions", pdKeyList[0], `[1,2]`, 400, "invalid_json", ""},
		{"wrong type", "/v1/completions", pdKeyList[1], `{"model":"pd-tiny","prompt":"hi","max_tokens":"ten"}`, 400, "invalid_type", "max_tokens"},
		{"wrong type chat", "/v1/chat/completions", pdKeyList[1], `{"model":"pd-tiny","messages":"hi"}`, 400, "invalid_type", "messages"},
		{"negative max_tokens", "/v1/completions", pdKeyList[2], `{"model":"pd-tiny","prompt":"hi","max_tokens":-1}`, 400, "invalid_value", "max_tokens"},
		{"huge max_tokens", "/v1/completions", pdKeyList[2], `{"model":"pd-tiny","prompt":"hi","max_tokens":1000000000000}`, 400, "invalid_value", "max_tokens"},
		{"max_tokens over the window", "/v1/chat/completions", pdKeyList[2], `{"model":"pd-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":100000}`, 400, "invalid_value", "max_tokens"},
		{"prompt + max_tokens over the window", "/v1/chat/completions", pdKeyList[2], `{"model":"pd-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":250}`, 400, "context_length_exceeded", ""},
		{"unknown model", "/v1/completions", pdKeyList[3], `{"model":"gpt-4","prompt":"hi"}`, 404, "model_not_found", "model"},
		{"invalid utf-8", "/v1/completions", pdKeyList[3], "{\"model\":\"pd-tiny\",\"prompt\":\"\xff\xfe\"}", 400, "invalid_json", ""},
		{"10 MB body", "/v1/completions", pdKeyList[0], huge, 413, "request_too_large", ""},
		{"n > 1", "/v1/completions", pdKeyList[0], `{"model":"pd-tiny","prompt":"hi","n":2}`, 400, "unsupported_parameter", "n"},
		{"no key", "/v1/completions", "", `{"model":"pd-tiny","prompt":"hi"}`, 401, "invalid_api_key", ""},
		{"bad key", "/v1/completions", "sk-test-key-xxxxxxxx", `{"model":"pd-tiny","prompt":"hi"}`, 401, "invalid_api_key", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A well-formed request runs beside each malformed one.
			var wg sync.WaitGroup
			var good completion
			var goodErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				good, goodErr = complete(ctx, c.client(pdKeyList[1]), "a good request", 4, nil, false)
			}()
			req, _ := http.NewRequestWithContext(ctx, "POST", c.base+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    string  `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("status %d, body %q is not an OpenAI error: %v", resp.StatusCode, body, err)
			}
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			want := tc.code
			if resp.StatusCode != tc.status || e.Error.Code != want || param != tc.param || e.Error.Message == "" {
				t.Errorf("got %d %q param %q (%s), want %d %q param %q", resp.StatusCode, e.Error.Code, param, e.Error.Message, tc.status, want, tc.param)
			}
			wg.Wait()
			if goodErr != nil || good.usage.CompletionTokens < 1 {
				t.Errorf("the well-formed request beside it: %+v, %v", good, goodErr)
			}
		})
	}
}

// generateGreedy runs `kvfence generate` for prompt, the reference of I7.
func generateGreedy(t *testing.T, ctx context.Context, model, prompt string, n int, chat bool) string {
	t.Helper()
	args := []string{"generate", "--model", pdModel(t, model), "--prompt", prompt, "-n", strconv.Itoa(n), "--threads", "1"}
	if chat {
		args = append(args, "--chat")
	}
	cmd := exec.CommandContext(ctx, kvfenceBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("generate: %v\n%s", err, stderr.String())
	}
	return strings.TrimSuffix(stdout.String(), "\n")
}

// testPDGreedyEqualsGenerate checks I7 across processes: 32 concurrent
// greedy requests from 4 tenants produce what `kvfence generate` produces
// for the same prompts alone.
func testPDGreedyEqualsGenerate(t *testing.T, c *pdCluster) {
	ctx := testContext(t, 120*time.Second)
	prompts := []string{
		"the quick brown fox", "in the beginning", "hello world", "a tale of two cities",
		"to be or not to be", "the rain in spain", "it was the best of times", "call me ishmael",
	}
	const n = 20
	// want[chat][prompt] is what generate gives alone.
	var want [2][]string
	for ci := range want {
		for _, p := range prompts {
			w := generateGreedy(t, ctx, "tiny", p, n, ci == 1)
			// The comparison means something only if the outputs are
			// long enough to differ.
			if len([]rune(w)) < n/2 {
				t.Errorf("generate (chat %v) gave only %q for %q", ci == 1, w, p)
			}
			want[ci] = append(want[ci], w)
		}
	}
	// Request i: prompt i%8, tenant i%4, chat for (i/4)%2, streaming for
	// (i/8)%2: every tenant, mode and prompt mixed in one burst.
	const requests = 32
	got := make([]completion, requests)
	errs := make([]error, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.client(pdKeyList[i%len(pdKeyList)])
			p, stream := prompts[i%len(prompts)], (i/8)%2 == 1
			if (i/4)%2 == 1 {
				got[i], errs[i] = chat(ctx, cl, p, n, stream)
			} else {
				got[i], errs[i] = complete(ctx, cl, p, n, nil, stream)
			}
		}()
	}
	wg.Wait()
	// How much the requests shared decode steps depends on timing: logged,
	// not asserted.
	t.Logf("decode: %v steps, at most %v sequences in one step",
		metric(t, ctx, c.decode.waitURL(t), "kvfence_decode_steps_total"),
		metric(t, ctx, c.decode.waitURL(t), "kvfence_decode_max_batch_sequences"))
	for i := range requests {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
			continue
		}
		if w := want[(i/4)%2][i%len(prompts)]; got[i].text != w {
			t.Errorf("request %d (prompt %q, tenant %d, chat %v): %q, generate alone: %q",
				i, prompts[i%len(prompts)], i%4, (i/4)%2 == 1, got[i].text, w)
		}
	}
	waitPoolAtRest(t, ctx, c.decode.waitURL(t), 10*time.Second)
}

// testPDShutdown sends SIGTERM to the router and the decode worker while
// requests stream through them: the requests finish, then every process
// exits 0.
func testPDShutdown(t *testing.T, c *pdCluster) {
	ctx := testContext(t, 60*time.Second)
	cl := c.client(pdKeyList[0])
	var streams []*ssestream.Stream[openai.Completion]
	for _, p := range []string{"a long story", "another long story"} {
		s := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:       openai.CompletionNewParamsModel(cl.model),
			Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(p)},
			MaxTokens:   openai.Int(200),
			Temperature: openai.Float(0),
		})
		if !s.Next() {
			t.Fatalf("no first chunk: %v", s.Err())
		}
		streams = append(streams, s)
	}
	_ = c.router.cmd.Process.Signal(syscall.SIGTERM)
	_ = c.decode.cmd.Process.Signal(syscall.SIGTERM)
	for i, s := range streams {
		finish := ""
		for s.Next() {
			for _, x := range s.Current().Choices {
				if x.FinishReason != "" {
					finish = string(x.FinishReason)
				}
			}
		}
		if err := s.Err(); err != nil || finish == "" {
			t.Errorf("request %d in flight at SIGTERM: finish %q, err %v", i, finish, err)
		}
	}
	for _, p := range append([]*proc{c.router, c.decode}, c.prefills...) {
		if code := p.terminate(t, 30*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM:\n%s", p.name, code, p.logText())
		}
		if !strings.Contains(p.logText(), "shutting down") {
			t.Errorf("%s did not log its shutdown", p.name)
		}
	}
}

// TestPDWorkerCapacity checks I6 on the worker commands: a pool smaller
// than the context window refuses to start, naming both numbers, unless
// --lower-context-to-fit lowers the window, which the log says.
func TestPDWorkerCapacity(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	model := pdModel(t, "tiny")
	// A tiny page is 8256 bytes: 10 pages hold 160 tokens, the window is 256.
	for _, role := range []string{"decode", "prefill"} {
		cmd := exec.CommandContext(ctx, kvfenceBinary(t), role, "--model", model, "--port", "0", "--kv-cache-memory", "82560")
		cmd.Env = append(os.Environ(), "KVFENCE_CLUSTER_SECRET="+pdSecret)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !bytes.Contains(out, []byte("160")) || !bytes.Contains(out, []byte("256")) {
			t.Errorf("%s with a 160-token pool: %v\n%s", role, err, out)
		}
		p := startProc(t, role, nil, role, "--model", model, "--port", "0", "--kv-cache-memory", "82560", "--lower-context-to-fit")
		p.waitURL(t)
		if log := p.logText(); !strings.Contains(log, "lowered from 256 to 160") || !strings.Contains(log, "context_window=160") {
			t.Errorf("%s with --lower-context-to-fit:\n%s", role, log)
		}
		if w := metric(t, ctx, p.waitURL(t), "kvfence_context_window_tokens", "role", role); w != 160 {
			t.Errorf("%s: window metric %v", role, w)
		}
	}
}
