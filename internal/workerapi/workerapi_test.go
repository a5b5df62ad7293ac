package workerapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

var testSecret = []byte("kvfence-test-cluster-secret-0123")

// fakeWorker is a Decoder and Prefiller whose behaviour the tenant name
// picks; it records what reached it.
type fakeWorker struct {
	mu       sync.Mutex
	gens     []*engine.GenerateRequest
	prefills []*engine.PrefillRequest
	aborts   []*transfer.Abort
	closed   chan struct{} // a "forever" stream was closed
	ctxEnded chan struct{} // a blocking call saw its ctx end
}

func newFake() *fakeWorker {
	return &fakeWorker{closed: make(chan struct{}, 8), ctxEnded: make(chan struct{}, 8)}
}

var fakeInfo = engine.WorkerInfo{Role: "decode", Model: "tiny", ContextWindow: 256, PageSize: 16, PoolPages: 64,
	PoolTokens: 1024, FreePages: 60, Running: 2, Queued: 1, MaxRunning: 8, Peer: 7, TransferAddr: "127.0.0.1:9"}

func (f *fakeWorker) Info() engine.WorkerInfo { return fakeInfo }

// fakeEvents is what a normal generation streams.
var fakeEvents = []engine.TokenEvent{
	{ID: 11, Logprob: -0.25, Top: []engine.TopLogprob{{ID: 11, Logprob: -0.25}, {ID: 12, Logprob: float32(math.Inf(-1))}}},
	{ID: 0, Logprob: -1e-7},
	{ID: 13, Logprob: float32(math.Inf(-1))},
	{ID: 2, Logprob: -3.1415927, Finish: engine.FinishLength},
}

func (f *fakeWorker) Generate(ctx context.Context, r *engine.GenerateRequest) (engine.TokenStream, error) {
	f.mu.Lock()
	f.gens = append(f.gens, r)
	f.mu.Unlock()
	switch r.Tenant {
	case "too-long":
		return nil, &reqerr.ContextLengthError{Prompt: len(r.Prompt), MaxTokens: r.MaxTokens, Limit: 100}
	case "overloaded":
		return nil, reqerr.New(reqerr.KindOverloaded, "queue full (%d)", 256)
	case "plain-error":
		return nil, errors.New("some text that must not travel")
	case "slow-admit":
		<-ctx.Done()
		f.ctxEnded <- struct{}{}
		return nil, ctx.Err()
	case "fail-mid":
		return &fakeStream{f: f, events: fakeEvents[:2], err: reqerr.New(reqerr.KindIntegrity, "fence mismatch on page %d", 3)}, nil
	case "forever":
		return &fakeStream{f: f, forever: true}, nil
	}
	return &fakeStream{f: f, events: fakeEvents}, nil
}

func (f *fakeWorker) Abort(m *transfer.Abort) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aborts = append(f.aborts, m)
}

func (f *fakeWorker) Prefill(ctx context.Context, r *engine.PrefillRequest) error {
	f.mu.Lock()
	f.prefills = append(f.prefills, r)
	f.mu.Unlock()
	switch r.Tenant {
	case "block":
		<-ctx.Done()
		f.ctxEnded <- struct{}{}
		return ctx.Err()
	case "too-long":
		return &reqerr.ContextLengthError{Prompt: len(r.Prompt), MaxTokens: 1, Limit: 3}
	case "lost":
		return reqerr.New(reqerr.KindPeerLost, "room x: decode peer 7 reconnected")
	}
	return nil
}

type fakeStream struct {
	f       *fakeWorker
	events  []engine.TokenEvent
	err     error
	forever bool
	i       int
	once    sync.Once
}

func (s *fakeStream) Next(ctx context.Context) (engine.TokenEvent, error) {
	if s.forever {
		select {
		case <-ctx.Done():
			return engine.TokenEvent{}, ctx.Err()
		case <-time.After(time.Millisecond):
			s.i++
			return engine.TokenEvent{ID: int32(s.i)}, nil
		}
	}
	if s.i < len(s.events) {
		s.i++
		return s.events[s.i-1], nil
	}
	if s.err != nil {
		return engine.TokenEvent{}, s.err
	}
	return engine.TokenEvent{}, io.EOF
}

func (s *fakeStream) Close() {
	s.once.Do(func() {
		if s.forever {
			s.f.closed <- struct{}{}
		}
	})
}

type env struct {
	fake   *fakeWorker
	srv    *httptest.Server
	client *Client
	auth   *transfer.Auth
}

func newEnv(t *testing.T) *env {
	t.Helper()
	fake := newFake()
	h, err := NewHandler(HandlerConfig{Secret: testSecret, Decoder: fake, Prefiller: fake, MaxBody: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := NewClient(ClientConfig{URL: srv.URL, Secret: testSecret, InfoMaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	auth, _ := transfer.NewAuth(testSecret)
	return &env{fake: fake, srv: srv, client: c, auth: auth}
}

func (e *env) genRequest(tenant string) *engine.GenerateRequest {
	open := &transfer.Open{Envelope: transfer.Envelope{Room: transfer.RoomID{1, 2, 3}}, Prefill: 3, PromptTokens: 4, MaxTokens: 9}
	e.auth.Sign(open)
	return &engine.GenerateRequest{Open: open, Tenant: tenant, Prompt: []int32{5, 6, 7, 8}, MaxTokens: 9,
		Sampling: engine.Sampling{Temperature: 0.7, TopP: 0.9, Seed: math.MaxUint64 - 5}, StopIDs: []int32{2},
		Logprobs: true, TopLogprobs: 2}
}

func (e *env) prefillRequest(tenant string) *engine.PrefillRequest {
	pm := &transfer.Prefill{Envelope: transfer.Envelope{Room: transfer.RoomID{4}}, Decode: 7, PromptTokens: 3, MaxTokens: 1}
	e.auth.Sign(pm)
	return &engine.PrefillRequest{Prefill: pm, Tenant: tenant, Prompt: []int32{1, 2, 3},
		Sampling: engine.Sampling{Seed: 42}, DecodeAddr: "127.0.0.1:9999"}
}

func drain(t *testing.T, s engine.TokenStream) ([]engine.TokenEvent, error) {
	t.Helper()
	var evs []engine.TokenEvent
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func sameEvents(a, b []engine.TokenEvent) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.ID != y.ID || x.Finish != y.Finish || math.Float32bits(x.Logprob) != math.Float32bits(y.Logprob) || len(x.Top) != len(y.Top) {
			return false
		}
		for j := range x.Top {
			if x.Top[j].ID != y.Top[j].ID || math.Float32bits(x.Top[j].Logprob) != math.Float32bits(y.Top[j].Logprob) {
				return false
			}
		}
	}
	return true
}

func TestGenerateRoundTrip(t *testing.T) {
	e := newEnv(t)
	req := e.genRequest("a")
	s, err := e.client.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs, err := drain(t, s)
	if err != io.EOF {
		t.Fatalf("stream ended with %v, want io.EOF", err)
	}
	if !sameEvents(evs, fakeEvents) {
		t.Fatalf("events %+v, want %+v", evs, fakeEvents)
	}
	if _, err := s.Next(context.Background()); err != io.EOF {
		t.Fatalf("Next after the end: %v, want io.EOF again", err)
	}
	got := e.fake.gens[0]
	if !bytes.Equal(transfer.Encode(got.Open), transfer.Encode(req.Open)) || !e.auth.Verify(got.Open) {
		t.Fatal("the signed Open did not arrive intact")
	}
	got.Open, req.Open = nil, nil
	if !reflect.DeepEqual(got, req) {
		t.Fatalf("worker got %+v, want %+v", got, req)
	}
}

func TestGenerateErrorsKeepTheirKind(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		tenant string
		check  func(error) bool
	}{
		{"too-long", func(err error) bool {
			var cl *reqerr.ContextLengthError
			return errors.As(err, &cl) && *cl == reqerr.ContextLengthError{Prompt: 4, MaxTokens: 9, Limit: 100}
		}},
		{"overloaded", func(err error) bool {
			var re *reqerr.Error
			return errors.As(err, &re) && re.Kind == reqerr.KindOverloaded && re.Detail == "queue full (256)"
		}},
		{"plain-error", func(err error) bool {
			return reqerr.KindOf(err) == reqerr.KindInternal && !strings.Contains(err.Error(), "must not travel")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.tenant, func(t *testing.T) {
			s, err := e.client.Generate(context.Background(), e.genRequest(tt.tenant))
			if s != nil || !tt.check(err) {
				t.Fatalf("Generate: stream %v, error %#v", s, err)
			}
		})
	}
	// An error in the middle of the stream arrives after the tokens before it.
	s, err := e.client.Generate(context.Background(), e.genRequest("fail-mid"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs, err := drain(t, s)
	var re *reqerr.Error
	if !sameEvents(evs, fakeEvents[:2]) || !errors.As(err, &re) || re.Kind != reqerr.KindIntegrity || re.Detail != "fence mismatch on page 3" {
		t.Fatalf("events %v then %v", evs, err)
	}
	if _, again := s.Next(context.Background()); again != err {
		t.Fatalf("error not sticky: %v", again)
	}
}

func TestCloseEndsTheWorkerStream(t *testing.T) {
	e := newEnv(t)
	s, err := e.client.Generate(context.Background(), e.genRequest("forever"))
	if err != nil {
		t.Fatal(err)
	}
	evs := 0
	for evs < 3 {
		if _, err := s.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
		evs++
	}
	// ctx ending in Next leaves the generation alone.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		if _, err := s.Next(ctx); err != nil {
			if err != context.Canceled {
				t.Fatalf("Next with a done ctx: %v", err)
			}
			break
		}
	}
	if _, err := s.Next(context.Background()); err != nil {
		t.Fatalf("generation ended with its Next ctx: %v", err)
	}
	s.Close()
	select {
	case <-e.fake.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's stream was not closed after the client's Close")
	}
}

func TestGenerateCtxBeforeAdmission(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	s, err := e.client.Generate(ctx, e.genRequest("slow-admit"))
	if s != nil || err != context.DeadlineExceeded {
		t.Fatalf("Generate: %v, %v", s, err)
	}
	select {
	case <-e.fake.ctxEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's Generate did not see the request end")
	}
}

func TestPrefill(t *testing.T) {
	e := newEnv(t)
	req := e.prefillRequest("ok")
	if err := e.client.Prefill(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	got := e.fake.prefills[0]
	if !bytes.Equal(transfer.Encode(got.Prefill), transfer.Encode(req.Prefill)) {
		t.Fatal("the signed Prefill did not arrive intact")
	}
	got.Prefill, req.Prefill = nil, nil
	if !reflect.DeepEqual(got, req) {
		t.Fatalf("worker got %+v, want %+v", got, req)
	}
	err := e.client.Prefill(context.Background(), e.prefillRequest("too-long"))
	var cl *reqerr.ContextLengthError
	if !errors.As(err, &cl) || *cl != (reqerr.ContextLengthError{Prompt: 3, MaxTokens: 1, Limit: 3}) {
		t.Fatalf("too long: %#v", err)
	}
	if err := e.client.Prefill(context.Background(), e.prefillRequest("lost")); reqerr.KindOf(err) != reqerr.KindPeerLost {
		t.Fatalf("lost: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := e.client.Prefill(ctx, e.prefillRequest("block")); err != context.DeadlineExceeded {
		t.Fatalf("block: %v", err)
	}
	select {
	case <-e.fake.ctxEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's Prefill did not see the request end")
	}
}

func TestAbortAndInfo(t *testing.T) {
	e := newEnv(t)
	m := &transfer.Abort{Envelope: transfer.Envelope{Room: transfer.RoomID{9}}, Reason: reqerr.KindAborted, Decode: 7}
	e.auth.Sign(m)
	e.client.Abort(m)
	// Both roles of the fake got it (one worker serves both here).
	if len(e.fake.aborts) != 2 || !bytes.Equal(transfer.Encode(e.fake.aborts[0]), transfer.Encode(m)) {
		t.Fatalf("aborts %v", e.fake.aborts)
	}
	if got := e.client.Info(); got != fakeInfo {
		t.Fatalf("info %+v, want %+v", got, fakeInfo)
	}
	// A worker that goes away is reported draining, with its last info.
	c, err := NewClient(ClientConfig{URL: e.srv.URL, Secret: testSecret, InfoMaxAge: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Info(); got != fakeInfo {
		t.Fatalf("info %+v", got)
	}
	e.srv.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !c.Info().Draining {
		if time.Now().After(deadline) {
			t.Fatal("an unreachable worker is not reported draining")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := c.Info(); got.Model != "tiny" || got.PoolTokens != 1024 {
		t.Fatalf("draining info lost the last answer: %+v", got)
	}
	if _, err := c.Generate(context.Background(), e.genRequest("a")); reqerr.KindOf(err) != reqerr.KindPeerLost {
		t.Fatalf("Generate on a gone worker: %v", err)
	}
}

// raw sends a request by hand, signed with secret over sigBody (nil: no
// header), and returns the status and the decoded error kind.
func raw(t *testing.T, e *env, method, path string, body []byte, secret []byte, sigPath string, sigBody []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
	if secret != nil {
		req.Header.Set(AuthHeader, sign(secret, method, sigPath, sigBody))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb errorBody
	if decodeStrict(b, &eb) == nil && eb.Error != nil {
		return resp.StatusCode, eb.Error.Kind
	}
	return resp.StatusCode, ""
}

func TestAuthAndMalformedRequests(t *testing.T) {
	e := newEnv(t)
	good, _ := jsonGenerate(e, "a")
	other := []byte("another-cluster-secret-00000000")
	prefillFrame := transfer.Encode(e.prefillRequest("x").Prefill)
	tests := []struct {
		name       string
		path       string
		body       []byte
		secret     []byte
		sigPath    string
		sigBody    []byte
		wantStatus int
		wantKind   string
	}{
		{"no header", PathGenerate, good, nil, "", nil, 401, "invalid_request"},
		{"wrong secret", PathGenerate, good, other, PathGenerate, good, 401, "invalid_request"},
		{"signature of another path", PathPrefill, good, testSecret, PathGenerate, good, 401, "invalid_request"},
		{"signature of another body", PathGenerate, good, testSecret, PathGenerate, append(bytes.Clone(good), ' '), 401, "invalid_request"},
		{"abort unsigned", PathAbort, []byte(`{}`), nil, "", nil, 401, "invalid_request"},
		{"info unsigned", PathInfo, nil, nil, "", nil, 401, "invalid_request"},
		{"bad JSON", PathGenerate, []byte(`{"open":`), testSecret, PathGenerate, []byte(`{"open":`), 400, "invalid_request"},
		{"unknown field", PathGenerate, []byte(`{"open":"","n":2}`), testSecret, PathGenerate, []byte(`{"open":"","n":2}`), 400, "invalid_request"},
		{"trailing data", PathGenerate, append(bytes.Clone(good), []byte(`{}`)...), testSecret, PathGenerate, append(bytes.Clone(good), []byte(`{}`)...), 400, "invalid_request"},
		{"wrong frame type", PathGenerate, []byte(`{"open":"` + b64(prefillFrame) + `"}`), testSecret, PathGenerate, []byte(`{"open":"` + b64(prefillFrame) + `"}`), 400, "invalid_request"},
		{"garbage frame", PathPrefill, []byte(`{"prefill":"AAAA"}`), testSecret, PathPrefill, []byte(`{"prefill":"AAAA"}`), 400, "invalid_request"},
		{"prompt of strings", PathGenerate, []byte(`{"prompt":["a"]}`), testSecret, PathGenerate, []byte(`{"prompt":["a"]}`), 400, "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := http.MethodPost
			if tt.path == PathInfo {
				method = http.MethodGet
			}
			status, kind := raw(t, e, method, tt.path, tt.body, tt.secret, tt.sigPath, tt.sigBody)
			if status != tt.wantStatus || kind != tt.wantKind {
				t.Fatalf("status %d kind %q, want %d %q", status, kind, tt.wantStatus, tt.wantKind)
			}
		})
	}
	big := bytes.Repeat([]byte(" "), 2<<20)
	if status, kind := raw(t, e, http.MethodPost, PathGenerate, big, testSecret, PathGenerate, big); status != 413 || kind != "invalid_request" {
		t.Fatalf("big body: %d %q", status, kind)
	}
	if len(e.fake.gens)+len(e.fake.prefills)+len(e.fake.aborts) != 0 {
		t.Fatal("a refused request reached the worker")
	}
	// The signed, well-formed request passes.
	if status, _ := raw(t, e, http.MethodPost, PathGenerate, good, testSecret, PathGenerate, good); status != 200 || len(e.fake.gens) != 1 {
		t.Fatalf("good request: %d", status)
	}
}

func TestNewClientRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:80", "ftp://x", "http://x/prefix", "http://x?q=1", "http://"} {
		if _, err := NewClient(ClientConfig{URL: u, Secret: testSecret}); err == nil {
			t.Errorf("NewClient(%q) accepted", u)
		}
	}
	if _, err := NewClient(ClientConfig{URL: "http://127.0.0.1:1", Secret: []byte("short")}); err == nil {
		t.Error("short secret accepted")
	}
}
