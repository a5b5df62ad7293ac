package workerapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// URL is the worker's base URL (scheme://host:port, no path).
	URL    string
	Secret []byte
	// HTTP is the client used; default a client without an overall timeout
	// (a generate response lasts as long as its generation) keeping up to
	// 256 idle connections to the worker.
	HTTP *http.Client
	// InfoMaxAge is how old Info's cached answer may get before it is
	// refreshed (in the background); default 250 ms.
	InfoMaxAge time.Duration
	// CallTimeout bounds info and abort calls; default 5 s.
	CallTimeout time.Duration
	Logger      *slog.Logger
}

// Client is a worker across HTTP: it implements engine.Decoder and
// engine.Prefiller (which ones work depends on the worker). It is safe for
// concurrent use.
type Client struct {
	cfg  ClientConfig
	base *url.URL
	http *http.Client
	log  *slog.Logger

	// mu guards the cached info.
	mu struct {
		sync.Mutex
		info    engine.WorkerInfo
		at      time.Time // zero: never fetched
		loading bool      // a background refresh is running
	}
}

var (
	_ engine.Decoder   = (*Client)(nil)
	_ engine.Prefiller = (*Client)(nil)
)

// NewClient returns a client of the worker at cfg.URL.
func NewClient(cfg ClientConfig) (*Client, error) {
	if len(cfg.Secret) < transfer.MinSecret {
		return nil, fmt.Errorf("workerapi: cluster secret shorter than %d bytes", transfer.MinSecret)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("workerapi: worker URL %q is not scheme://host:port", cfg.URL)
	}
	u.Path = ""
	if cfg.InfoMaxAge <= 0 {
		cfg.InfoMaxAge = 250 * time.Millisecond
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	c := &Client{cfg: cfg, base: u, http: cfg.HTTP, log: cfg.Logger}
	if c.http == nil {
		// One connection per stream in flight: keep enough of them idle
		// for a busy router instead of the default two per host.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 256
		c.http = &http.Client{Transport: tr}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// URL is the worker's base URL.
func (c *Client) URL() string { return c.base.String() }

func (c *Client) do(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	u := *c.base
	u.Path = path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set(AuthHeader, sign(c.cfg.Secret, method, path, body))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.http.Do(req)
}

// unreachable is the request error of a worker that could not be asked.
func (c *Client) unreachable(err error) error {
	c.log.Warn("workerapi: worker unreachable", "url", c.base.String(), "err", err)
	return reqerr.New(reqerr.KindPeerLost, "worker %s unreachable", c.base.Host)
}

// answerError turns a non-200 response into the worker's error.
func (c *Client) answerError(resp *http.Response) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSmallBody))
	if err == nil {
		var eb errorBody
		if decodeStrict(b, &eb) == nil && eb.Error != nil {
			if e, err := eb.Error.err(); err == nil {
				if resp.StatusCode == http.StatusUnauthorized {
					c.log.Error("workerapi: the worker refused our cluster signature", "url", c.base.String())
				}
				return e
			}
		}
	}
	return reqerr.New(reqerr.KindInternal, "worker %s answered %d without a readable error", c.base.Host, resp.StatusCode)
}

// FetchInfo asks the worker for its info now.
func (c *Client) FetchInfo(ctx context.Context) (engine.WorkerInfo, error) {
	resp, err := c.do(ctx, http.MethodGet, PathInfo, nil)
	if err != nil {
		return engine.WorkerInfo{}, c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engine.WorkerInfo{}, c.answerError(resp)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSmallBody))
	if err != nil {
		return engine.WorkerInfo{}, c.unreachable(err)
	}
	var j infoJSON
	if err := decodeStrict(b, &j); err != nil {
		return engine.WorkerInfo{}, reqerr.New(reqerr.KindInternal, "worker %s info: %v", c.base.Host, err)
	}
	return j.info(), nil
}

// Info implements engine.Decoder and engine.Prefiller. It returns the
// worker's info as of at most InfoMaxAge ago, refreshing it in the
// background when older (the first call waits for it). While the worker
// cannot be reached the last answer is returned with Draining set, so that
// nobody pairs new work with it.
func (c *Client) Info() engine.WorkerInfo {
	c.mu.Lock()
	fresh := !c.mu.at.IsZero() && time.Since(c.mu.at) < c.cfg.InfoMaxAge
	if fresh || (c.mu.loading && !c.mu.at.IsZero()) {
		i := c.mu.info
		c.mu.Unlock()
		return i
	}
	first := c.mu.at.IsZero()
	c.mu.loading = true
	c.mu.Unlock()
	if first {
		return c.refreshInfo()
	}
	go c.refreshInfo()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.info
}

func (c *Client) refreshInfo() engine.WorkerInfo {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CallTimeout)
	defer cancel()
	i, err := c.FetchInfo(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.loading = false
	c.mu.at = time.Now()
	if err != nil {
		c.mu.info.Draining = true
	} else {
		c.mu.info = i
	}
	return c.mu.info
}

func samplingToJSON(s engine.Sampling) samplingJSON {
	return samplingJSON{Temperature: s.Temperature, TopP: s.TopP, Seed: s.Seed}
}

// Generate implements engine.Decoder. ctx bounds the call until the worker
// has admitted the request; the generation then lives until the stream is
// closed, which cancels the HTTP request (the worker ends the sequence).
func (c *Client) Generate(ctx context.Context, r *engine.GenerateRequest) (engine.TokenStream, error) {
	if r.Open == nil {
		return nil, reqerr.New(reqerr.KindInvalidRequest, "generate without an Open")
	}
	body, err := json.Marshal(generateJSON{
		Open: transfer.Encode(r.Open), Tenant: r.Tenant, Prompt: r.Prompt, MaxTokens: r.MaxTokens,
		Sampling: samplingToJSON(r.Sampling), StopIDs: r.StopIDs, Logprobs: r.Logprobs, TopLogprobs: r.TopLogprobs,
	})
	if err != nil {
		return nil, reqerr.New(reqerr.KindInternal, "encoding a generate request: %v", err)
	}
	reqCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	resp, err := c.do(reqCtx, http.MethodPost, PathGenerate, body)
	if !stop() {
		// ctx ended before the worker answered: cancelling the request
		// tells the worker to drop the sequence.
		cancel()
		if err == nil {
			resp.Body.Close()
		}
		return nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, c.unreachable(err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		return nil, c.answerError(resp)
	}
	s := &stream{c: c, body: resp.Body, cancel: cancel, events: make(chan result, 16), done: make(chan struct{})}
	go s.read()
	return s, nil
}

type result struct {
	ev  engine.TokenEvent
	err error
}

// stream is a generate response being read. A goroutine decodes lines
// into events (bounded: when the router reads slowly, TCP slows the
// worker); Next takes them.
type stream struct {
	c      *Client
	body   io.ReadCloser
	cancel context.CancelFunc
	events chan result
	done   chan struct{} // closed by Close
	closed atomic.Bool
	sticky error // Next's goroutine only
}

func (s *stream) send(r result) bool {
	select {
	case s.events <- r:
		return true
	case <-s.done:
		return false
	}
}

func (s *stream) read() {
	defer s.body.Close()
	sc := bufio.NewScanner(s.body)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		ev, final, err := decodeEvent(sc.Bytes())
		switch {
		case err != nil:
			s.c.log.Error("workerapi: malformed event from the worker", "url", s.c.base.String(), "err", err)
			s.send(result{err: reqerr.New(reqerr.KindInternal, "malformed event from worker %s", s.c.base.Host)})
			return
		case final != nil:
			s.send(result{err: final})
			return
		}
		if !s.send(result{ev: ev}) {
			return
		}
		if ev.Finish != "" {
			s.send(result{err: io.EOF})
			// Read the end of the response so the connection can be reused.
			io.Copy(io.Discard, io.LimitReader(s.body, maxLine))
			return
		}
	}
	select {
	case <-s.done:
		return
	default:
	}
	s.send(result{err: reqerr.New(reqerr.KindPeerLost, "worker %s ended the stream before its last token", s.c.base.Host)})
}

// Next implements engine.TokenStream.
func (s *stream) Next(ctx context.Context) (engine.TokenEvent, error) {
	if s.sticky != nil {
		return engine.TokenEvent{}, s.sticky
	}
	select {
	case r := <-s.events:
		if r.err != nil {
			s.sticky = r.err
		}
		return r.ev, r.err
	case <-ctx.Done():
		return engine.TokenEvent{}, ctx.Err()
	}
}

// Close implements engine.TokenStream: it cancels the request, which the
// worker sees as the router leaving.
func (s *stream) Close() {
	if s.closed.Swap(true) {
		return
	}
	close(s.done)
	s.cancel()
}

// Prefill implements engine.Prefiller: it returns when the worker answers,
// and ctx ending closes the request, which aborts the room on the worker.
func (c *Client) Prefill(ctx context.Context, r *engine.PrefillRequest) error {
	if r.Prefill == nil {
		return reqerr.New(reqerr.KindInvalidRequest, "prefill without a Prefill message")
	}
	body, err := json.Marshal(prefillJSON{
		Prefill: transfer.Encode(r.Prefill), Tenant: r.Tenant, Prompt: r.Prompt,
		Sampling: samplingToJSON(r.Sampling), DecodeAddr: r.DecodeAddr,
	})
	if err != nil {
		return reqerr.New(reqerr.KindInternal, "encoding a prefill request: %v", err)
	}
	resp, err := c.do(ctx, http.MethodPost, PathPrefill, body)
	if ctx.Err() != nil {
		if err == nil {
			resp.Body.Close()
		}
		return ctx.Err()
	}
	if err != nil {
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c.answerError(resp)
	}
	return c.readOK(resp)
}

func (c *Client) readOK(resp *http.Response) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSmallBody))
	if err != nil {
		return c.unreachable(err)
	}
	var ok okJSON
	if err := decodeStrict(b, &ok); err != nil || !ok.OK {
		return reqerr.New(reqerr.KindInternal, "worker %s answered 200 without ok", c.base.Host)
	}
	return nil
}

// Abort implements engine.Decoder and engine.Prefiller. It waits at most
// CallTimeout; a failure is logged (the worker's own timeouts end the room).
func (c *Client) Abort(m *transfer.Abort) {
	body, err := json.Marshal(abortJSON{Abort: transfer.Encode(m)})
	if err != nil {
		c.log.Error("workerapi: encoding an abort", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CallTimeout)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, PathAbort, body)
	if err != nil {
		c.log.Warn("workerapi: abort not delivered", "url", c.base.String(), "room", m.Room, "err", err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.log.Warn("workerapi: abort refused", "url", c.base.String(), "room", m.Room, "err", c.answerError(resp))
		return
	}
	if err := c.readOK(resp); err != nil {
		c.log.Warn("workerapi: abort answer", "url", c.base.String(), "err", err)
	}
}
