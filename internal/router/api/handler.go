package api

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router/tenants"
)

// Config configures the HTTP layer. Zero values take the defaults named.
type Config struct {
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	// Default 4 MiB (a 128k-token prompt is about 0.5 MB of text).
	MaxBodyBytes int64
	// DefaultChatMaxTokens is the max_tokens of a chat request that sets
	// none (the backend lowers it to what fits; see Request.MaxTokens).
	// Default 4096.
	DefaultChatMaxTokens int
	// DefaultCompletionMaxTokens is the same for completions. Default 16,
	// OpenAI's documented default.
	DefaultCompletionMaxTokens int
	// MaxTokensLimit bounds max_tokens before the model is known; a model
	// with a known context length bounds it below that length. Default 1<<20.
	MaxTokensLimit int
	// DefaultMaxConcurrent is the in-flight limit of a tenant whose key line
	// gives none, and of tenant "default" when no key file is configured.
	// 0 means unlimited.
	DefaultMaxConcurrent int
	// Ready reports readiness for /readyz: nil means ready. Nil func: always ready.
	Ready func() error
	// Now is the clock (response "created" and latency metrics). Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 4 << 20
	}
	if c.DefaultChatMaxTokens <= 0 {
		c.DefaultChatMaxTokens = 4096
	}
	if c.DefaultCompletionMaxTokens <= 0 {
		c.DefaultCompletionMaxTokens = 16
	}
	if c.MaxTokensLimit <= 0 {
		c.MaxTokensLimit = 1 << 20
	}
	if c.Ready == nil {
		c.Ready = func() error { return nil }
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

type handler struct {
	cfg     Config
	lim     decodeLimits
	backend Backend
	keys    *tenants.Keys // nil: open server, every request is tenants.Default
	limiter *tenants.Limiter
	m       *metrics
	metrics http.Handler
	log     *slog.Logger
}

// NewHandler returns the router's HTTP handler: the OpenAI API under /v1,
// and /healthz, /readyz, /metrics. keys nil means no key file: every request
// is tenant tenants.Default. The handler registers its metrics on reg (a
// fresh registry when nil) and serves reg's metrics at /metrics, so the
// caller registers the other components' metrics on the same registry.
// /healthz, /readyz and /metrics need no API key; they show no tenant data.
func NewHandler(cfg Config, b Backend, keys *tenants.Keys, reg *prometheus.Registry, log *slog.Logger) http.Handler {
	cfg = cfg.withDefaults()
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &handler{
		cfg: cfg,
		lim: decodeLimits{
			defaultChatMax: cfg.DefaultChatMaxTokens,
			defaultCompMax: cfg.DefaultCompletionMaxTokens,
			maxTokensLimit: cfg.MaxTokensLimit,
		},
		backend: b,
		keys:    keys,
		limiter: tenants.NewLimiter(),
		m:       newMetrics(reg),
		metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		log:     log,
	}
}

// statusWriter records the status sent, for metrics and for knowing
// whether an error can still change the status.
type statusWriter struct {
	http.ResponseWriter
	code     int  // status sent; 0 before WriteHeader
	recorded int  // status to record instead (499: client gone), 0 if none
	failed   bool // a write failed: the client is gone
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	if err != nil {
		w.failed = true
	}
	return n, err
}

// Unwrap lets http.ResponseController reach Flush.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) status() int {
	if w.recorded != 0 {
		return w.recorded
	}
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

func endpointOf(path string) string {
	switch {
	case path == "/v1/chat/completions":
		return epChat
	case path == "/v1/completions":
		return epCompletions
	case path == "/v1/models" || strings.HasPrefix(path, "/v1/models/"):
		return epModels
	case path == "/healthz":
		return epHealth
	case path == "/readyz":
		return epReady
	case path == "/metrics":
		return epMetrics
	}
	return epOther
}

func (h *handler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w := &statusWriter{ResponseWriter: rw}
	id := newRequestID()
	w.Header().Set("X-Request-Id", id)
	ep := endpointOf(r.URL.Path)
	defer func() {
		p := recover()
		headersOut := w.code != 0
		if p != nil && p != http.ErrAbortHandler {
			// A last resort: tests show decoding never panics on input. The
			// panic value and stack are programmer-facing, not request data.
			h.log.Error("panic serving request", "request_id", id, "endpoint", ep,
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if !headersOut {
				h.writeError(w, ErrorInfo{Status: http.StatusInternalServerError, Type: typeServer,
					Code: reqerr.KindInternal.String(), Message: "The server had an error while processing your request."})
			}
			h.m.rejected.WithLabelValues(reqerr.KindInternal.String()).Inc()
		}
		h.m.requests.WithLabelValues(ep, strconv.Itoa(w.status())).Inc()
		if p != nil && (p == http.ErrAbortHandler || headersOut) {
			// Headers are out: cut the connection so the client sees a
			// broken response, not a complete-looking one.
			panic(http.ErrAbortHandler)
		}
	}()

	switch ep {
	case epChat, epCompletions:
		if r.Method != http.MethodPost {
			h.fail(w, r, id, "", errMethod)
			return
		}
		h.generate(w, r, id, ep == epChat)
	case epModels:
		if r.Method != http.MethodGet {
			h.fail(w, r, id, "", errMethod)
			return
		}
		h.models(w, r, id)
	case epHealth:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	case epReady:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := h.cfg.Ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready: "+err.Error()+"\n")
			return
		}
		io.WriteString(w, "ok\n")
	case epMetrics:
		h.metrics.ServeHTTP(w, r)
	default:
		h.fail(w, r, id, "", errNoRoute)
	}
}

func newRequestID() string {
	var b [12]byte
	rand.Read(b[:]) // never fails (crypto/rand crashes the program instead)
	return hex.EncodeToString(b[:])
}

// authenticate returns the request's tenant.
func (h *handler) authenticate(r *http.Request) (tenants.Tenant, error) {
	if h.keys == nil {
		return tenants.Tenant{Name: tenants.Default}, nil
	}
	auth := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(auth) < len(prefix) || !strings.EqualFold(auth[:len(prefix)], prefix) {
		return tenants.Tenant{}, errMissingKey
	}
	key := strings.TrimSpace(auth[len(prefix):])
	if key == "" {
		return tenants.Tenant{}, errMissingKey
	}
	t, ok := h.keys.Lookup(key)
	if !ok {
		return tenants.Tenant{}, errInvalidKey
	}
	return t, nil
}

// fail sends err as an error response (or records a gone client) and
// counts it. tenant is "" when not yet known.
func (h *handler) fail(w *statusWriter, r *http.Request, id, tenant string, err error) {
	info := ErrorFor(err)
	h.m.rejected.WithLabelValues(info.Reason).Inc()
	h.logFailure(r, id, tenant, info, err)
	if info.Status == StatusClientClosed || r.Context().Err() != nil {
		w.recorded = StatusClientClosed
		return
	}
	h.writeError(w, info)
}

func (h *handler) logFailure(r *http.Request, id, tenant string, info ErrorInfo, err error) {
	attrs := []any{"request_id", id, "endpoint", endpointOf(r.URL.Path), "status", info.Status, "reason", info.Reason}
	if tenant != "" {
		attrs = append(attrs, "tenant", tenant)
	}
	switch {
	case info.Log:
		// err is ours or the backend's: errors carry ids and counts, never
		// request text (STYLE.md rule 5).
		h.log.Error("request failed", append(attrs, "err", err.Error())...)
	case info.Status >= 500:
		h.log.Warn("request failed", attrs...)
	default:
		h.log.Debug("request rejected", append(attrs, "param", info.Param)...)
	}
}

func (h *handler) writeError(w *statusWriter, info ErrorInfo) {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	switch info.Status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		hdr.Set("Retry-After", "1")
	}
	w.WriteHeader(info.Status)
	w.Write(append(appendError(make([]byte, 0, 256), &info), '\n'))
}

func (h *handler) findModel(name string) (ModelInfo, bool) {
	for _, m := range h.backend.Models() {
		if m.ID == name {
			return m, true
		}
	}
	return ModelInfo{}, false
}

func unknownModel(name string) error {
	return reqerr.New(reqerr.KindUnknownModel, "The model '%s' does not exist.", echo(name))
}

func (h *handler) models(w *statusWriter, r *http.Request, id string) {
	if _, err := h.authenticate(r); err != nil {
		h.fail(w, r, id, "", err)
		return
	}
	buf := make([]byte, 0, 512)
	if name, ok := strings.CutPrefix(r.URL.Path, "/v1/models/"); ok {
		m, found := h.findModel(name)
		if !found {
			h.fail(w, r, id, "", unknownModel(name))
			return
		}
		buf = appendModel(buf, m)
	} else {
		buf = append(buf, `{"object":"list","data":[`...)
		for i, m := range h.backend.Models() {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendModel(buf, m)
		}
		buf = append(buf, "]}"...)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(buf, '\n'))
}

func appendModel(dst []byte, m ModelInfo) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, m.ID)
	dst = append(dst, `,"object":"model","created":`...)
	dst = strconv.AppendInt(dst, m.Created, 10)
	dst = append(dst, `,"owned_by":`...)
	owner := m.OwnedBy
	if owner == "" {
		owner = "kvfence"
	}
	dst = appendString(dst, owner)
	if m.ContextLength > 0 {
		// Not in OpenAI's schema; clients ignore it, tools built for
		// vLLM read it as max_model_len.
		dst = append(dst, `,"max_model_len":`...)
		dst = strconv.AppendInt(dst, int64(m.ContextLength), 10)
	}
	return append(dst, '}')
}

// generate serves the two completion endpoints.
func (h *handler) generate(w *statusWriter, r *http.Request, id string, chat bool) {
	start := h.cfg.Now()
	tenant, err := h.authenticate(r)
	if err != nil {
		h.fail(w, r, id, "", err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if !errors.As(err, &mbe) {
			err = paramErr("", codeInvalidJSON, "The request body could not be read.")
		}
		h.fail(w, r, id, tenant.Name, err)
		return
	}
	var c call
	if chat {
		c, err = decodeChat(body, h.lim)
	} else {
		c, err = decodeCompletion(body, h.lim)
	}
	if err != nil {
		h.fail(w, r, id, tenant.Name, err)
		return
	}
	model, ok := h.findModel(c.req.Model)
	if !ok {
		h.fail(w, r, id, tenant.Name, unknownModel(c.req.Model))
		return
	}
	if n := model.ContextLength; n > 0 {
		if c.req.MaxTokensAuto {
			c.req.MaxTokens = max(1, min(c.req.MaxTokens, n-1))
		} else if c.req.MaxTokens >= n {
			h.fail(w, r, id, tenant.Name, paramErr("max_tokens", codeInvalid,
				"Invalid 'max_tokens': %d tokens leave no room for a prompt; this model's maximum context length is %d tokens.",
				c.req.MaxTokens, n))
			return
		}
	}
	limit := tenant.MaxConcurrent
	if limit == 0 {
		limit = h.cfg.DefaultMaxConcurrent
	}
	if !h.limiter.Acquire(tenant.Name, limit) {
		h.fail(w, r, id, tenant.Name, reqerr.New(reqerr.KindOverloaded,
			"Too many requests in flight for your API key's tenant (limit %d); retry when one finishes.", limit))
		return
	}
	h.m.inFlight.Inc()
	done := false
	// release frees what the request holds. It runs before the last byte
	// of the response is written, so that a client that sends its next
	// request as soon as it has read this one never finds its tenant's slot
	// still taken, and the backend's work is released first.
	var s Stream
	release := func() {
		if done {
			return
		}
		done = true
		if s != nil {
			s.Close()
		}
		h.limiter.Release(tenant.Name)
		h.m.inFlight.Dec()
	}
	defer release()

	c.req.ID, c.req.Tenant = id, tenant.Name
	s, err = h.backend.Generate(r.Context(), &c.req)
	if err != nil {
		s = nil
		release()
		h.fail(w, r, id, tenant.Name, err)
		return
	}
	g := &gen{h: h, w: w, r: r, c: &c, s: s, release: release, id: id, tenant: tenant.Name, start: start,
		created: start.Unix(), stop: stopMatcher{stops: c.stop}, buf: make([]byte, 0, 512)}
	if chat {
		g.respID = "chatcmpl-" + id
	} else {
		g.respID = "cmpl-" + id
	}
	g.run()
}
