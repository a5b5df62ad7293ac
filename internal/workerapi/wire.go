package workerapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

// Paths of the internal API.
const (
	PathGenerate = "/internal/v1/generate"
	PathPrefill  = "/internal/v1/prefill"
	PathAbort    = "/internal/v1/abort"
	PathInfo     = "/internal/v1/info"
)

// Bounds of what either side reads.
const (
	// DefaultMaxBody bounds a request body: a 1M-token prompt is about 8 MB
	// of JSON.
	DefaultMaxBody = 32 << 20
	// maxLine bounds one NDJSON event (a token with 20 alternatives is well
	// under 2 KB).
	maxLine = 64 << 10
	// maxSmallBody bounds error, info and ok bodies.
	maxSmallBody = 1 << 20
	// maxTop is the most alternatives an event may carry (OpenAI's limit).
	maxTop = 20
)

type samplingJSON struct {
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	Seed        uint64  `json:"seed"`
}

type generateJSON struct {
	Open        []byte       `json:"open"` // the signed transfer.Open frame
	Tenant      string       `json:"tenant"`
	Prompt      []int32      `json:"prompt"`
	MaxTokens   int          `json:"max_tokens"`
	Sampling    samplingJSON `json:"sampling"`
	StopIDs     []int32      `json:"stop_ids,omitempty"`
	Logprobs    bool         `json:"logprobs,omitempty"`
	TopLogprobs int          `json:"top_logprobs,omitempty"`
}

type prefillJSON struct {
	Prefill    []byte       `json:"prefill"` // the signed transfer.Prefill frame
	Tenant     string       `json:"tenant"`
	Prompt     []int32      `json:"prompt"`
	Sampling   samplingJSON `json:"sampling"`
	DecodeAddr string       `json:"decode_addr,omitempty"`
}

type abortJSON struct {
	Abort []byte `json:"abort"` // the signed transfer.Abort frame
}

type okJSON struct {
	OK bool `json:"ok"`
}

type infoJSON struct {
	Role          string `json:"role"`
	Model         string `json:"model"`
	ContextWindow int    `json:"context_window"`
	PageSize      int    `json:"page_size"`
	PoolPages     int    `json:"pool_pages"`
	PoolTokens    int    `json:"pool_tokens"`
	FreePages     int    `json:"free_pages"`
	Running       int    `json:"running"`
	Queued        int    `json:"queued"`
	MaxRunning    int    `json:"max_running"`
	Peer          uint32 `json:"peer"`
	TransferAddr  string `json:"transfer_addr,omitempty"`
	Draining      bool   `json:"draining,omitempty"`
}

func infoToJSON(i engine.WorkerInfo) infoJSON {
	return infoJSON{Role: i.Role, Model: i.Model, ContextWindow: i.ContextWindow, PageSize: i.PageSize,
		PoolPages: i.PoolPages, PoolTokens: i.PoolTokens, FreePages: i.FreePages, Running: i.Running,
		Queued: i.Queued, MaxRunning: i.MaxRunning, Peer: uint32(i.Peer), TransferAddr: i.TransferAddr,
		Draining: i.Draining}
}

func (j infoJSON) info() engine.WorkerInfo {
	return engine.WorkerInfo{Role: j.Role, Model: j.Model, ContextWindow: j.ContextWindow, PageSize: j.PageSize,
		PoolPages: j.PoolPages, PoolTokens: j.PoolTokens, FreePages: j.FreePages, Running: j.Running,
		Queued: j.Queued, MaxRunning: j.MaxRunning, Peer: transfer.PeerID(j.Peer), TransferAddr: j.TransferAddr,
		Draining: j.Draining}
}

// eventJSON is one NDJSON line of a generate response: exactly one of
// Token and Error.
type eventJSON struct {
	Token *tokenJSON `json:"token,omitempty"`
	Error *errorJSON `json:"error,omitempty"`
}

type tokenJSON struct {
	ID      int32     `json:"id"`
	Logprob logprob   `json:"logprob"`
	Top     []topJSON `json:"top,omitempty"`
	Finish  string    `json:"finish,omitempty"`
}

type topJSON struct {
	ID      int32   `json:"id"`
	Logprob logprob `json:"logprob"`
}

// logprob is a float32 that survives JSON exactly, infinities included (a
// probability that underflows has log -Inf, which JSON numbers cannot say).
type logprob float32

func (l logprob) MarshalJSON() ([]byte, error) {
	f := float64(l)
	switch {
	case math.IsInf(f, -1):
		return []byte(`"-inf"`), nil
	case math.IsInf(f, 1):
		return []byte(`"+inf"`), nil
	case math.IsNaN(f):
		return []byte(`"nan"`), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 32), nil
}

func (l *logprob) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"-inf"`:
		*l = logprob(math.Inf(-1))
		return nil
	case `"+inf"`:
		*l = logprob(math.Inf(1))
		return nil
	case `"nan"`:
		*l = logprob(math.NaN())
		return nil
	}
	if len(b) == 0 || b[0] == '"' || b[0] == 'n' || b[0] == 't' || b[0] == 'f' || b[0] == '[' || b[0] == '{' {
		return fmt.Errorf("logprob: not a number: %.20q", b)
	}
	f, err := strconv.ParseFloat(string(b), 32)
	if err != nil {
		return fmt.Errorf("logprob: %w", err)
	}
	*l = logprob(f)
	return nil
}

// errorJSON is a request error: the reqerr kind (code and name, which must
// agree) and, for context_length_exceeded, its numbers.
type errorJSON struct {
	Kind      string `json:"kind"`
	Code      uint8  `json:"code"`
	Detail    string `json:"detail,omitempty"`
	Prompt    int    `json:"prompt,omitempty"`
	MaxTokens int    `json:"max_tokens,omitempty"`
	Limit     int    `json:"limit,omitempty"`
}

type errorBody struct {
	Error *errorJSON `json:"error"`
}

// errorToJSON describes err for the wire. Errors outside the reqerr
// vocabulary become internal_error without their text, which nobody
// vouched is free of request data.
func errorToJSON(err error) *errorJSON {
	var cl *reqerr.ContextLengthError
	if errors.As(err, &cl) {
		k := reqerr.KindContextLength
		return &errorJSON{Kind: k.String(), Code: uint8(k), Prompt: cl.Prompt, MaxTokens: cl.MaxTokens, Limit: cl.Limit}
	}
	var re *reqerr.Error
	if errors.As(err, &re) {
		return &errorJSON{Kind: re.Kind.String(), Code: uint8(re.Kind), Detail: re.Detail}
	}
	k := reqerr.KindInternal
	return &errorJSON{Kind: k.String(), Code: uint8(k), Detail: "worker error"}
}

// err rebuilds the original error.
func (e *errorJSON) err() (error, error) {
	k := reqerr.Kind(e.Code)
	if !k.Valid() || k.String() != e.Kind {
		return nil, fmt.Errorf("workerapi: error kind %q does not match code %d", e.Kind, e.Code)
	}
	if e.Prompt < 0 || e.MaxTokens < 0 || e.Limit < 0 {
		return nil, errors.New("workerapi: negative numbers in an error")
	}
	if k == reqerr.KindContextLength {
		return &reqerr.ContextLengthError{Prompt: e.Prompt, MaxTokens: e.MaxTokens, Limit: e.Limit}, nil
	}
	return &reqerr.Error{Kind: k, Detail: e.Detail}, nil
}

// statusOf is the HTTP status of a request error answered before a stream
// starts. The body carries the kind; the status is for people and proxies.
func statusOf(err error) int {
	switch reqerr.KindOf(err) {
	case reqerr.KindContextLength, reqerr.KindInvalidRequest:
		return http.StatusBadRequest
	case reqerr.KindUnknownModel:
		return http.StatusNotFound
	case reqerr.KindOverloaded:
		return http.StatusTooManyRequests
	case reqerr.KindNoWorkers, reqerr.KindShuttingDown, reqerr.KindPeerLost:
		return http.StatusServiceUnavailable
	case reqerr.KindAborted:
		return http.StatusConflict
	default:
		return http.StatusInternalServerError
	}
}

// decodeStrict decodes exactly one JSON value of b into v: unknown fields
// and trailing data are errors.
func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// decodeEvent decodes one NDJSON line: a token event, or the request's
// error (final), or an error about the line itself.
func decodeEvent(line []byte) (ev engine.TokenEvent, final error, err error) {
	var e eventJSON
	if err := decodeStrict(line, &e); err != nil {
		return ev, nil, fmt.Errorf("workerapi: event: %w", err)
	}
	switch {
	case (e.Token == nil) == (e.Error == nil):
		return ev, nil, errors.New("workerapi: event has neither or both of token and error")
	case e.Error != nil:
		final, err := e.Error.err()
		return ev, final, err
	}
	t := e.Token
	switch t.Finish {
	case "", engine.FinishStop, engine.FinishLength:
	default:
		return ev, nil, fmt.Errorf("workerapi: unknown finish reason %.20q", t.Finish)
	}
	if len(t.Top) > maxTop {
		return ev, nil, fmt.Errorf("workerapi: %d top logprobs", len(t.Top))
	}
	ev = engine.TokenEvent{ID: t.ID, Logprob: float32(t.Logprob), Finish: t.Finish}
	if len(t.Top) > 0 {
		ev.Top = make([]engine.TopLogprob, len(t.Top))
		for i, x := range t.Top {
			ev.Top[i] = engine.TopLogprob{ID: x.ID, Logprob: float32(x.Logprob)}
		}
	}
	return ev, nil, nil
}

// appendEvent appends ev as one NDJSON line.
func appendEvent(b []byte, ev engine.TokenEvent) ([]byte, error) {
	t := tokenJSON{ID: ev.ID, Logprob: logprob(ev.Logprob), Finish: ev.Finish}
	if len(ev.Top) > 0 {
		t.Top = make([]topJSON, len(ev.Top))
		for i, x := range ev.Top {
			t.Top[i] = topJSON{ID: x.ID, Logprob: logprob(x.Logprob)}
		}
	}
	j, err := json.Marshal(eventJSON{Token: &t})
	if err != nil {
		return b, err
	}
	return append(append(b, j...), '\n'), nil
}

func appendErrorLine(b []byte, err error) []byte {
	j, _ := json.Marshal(eventJSON{Error: errorToJSON(err)})
	return append(append(b, j...), '\n')
}

// decodeFrame decodes a signed protocol frame carried in JSON and checks its
// type. The MAC is the worker's machine's to verify.
func decodeFrame[M transfer.Message](b []byte, what string) (M, error) {
	var zero M
	if len(b) == 0 {
		return zero, fmt.Errorf("missing %s frame", what)
	}
	m, n, err := transfer.Decode(b)
	if err != nil {
		return zero, fmt.Errorf("%s frame: %w", what, err)
	}
	if n != len(b) {
		return zero, fmt.Errorf("%s frame: %d trailing bytes", what, len(b)-n)
	}
	mm, ok := m.(M)
	if !ok {
		return zero, fmt.Errorf("%s frame holds a %v", what, m.Type())
	}
	return mm, nil
}
