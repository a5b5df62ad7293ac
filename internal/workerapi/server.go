package workerapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

// HandlerConfig configures a worker's internal API.
type HandlerConfig struct {
	// Secret is the cluster secret (at least transfer.MinSecret bytes).
	Secret []byte
	// Decoder serves generate on a decode worker; Prefiller serves prefill
	// on a prefill worker. At least one is set; an endpoint whose role is
	// missing answers 404.
	Decoder   engine.Decoder
	Prefiller engine.Prefiller
	// MaxBody bounds request bodies; default DefaultMaxBody.
	MaxBody int64
	Logger  *slog.Logger
}

type handler struct {
	cfg HandlerConfig
	log *slog.Logger
	mux *http.ServeMux
}

// NewHandler returns the internal API of a worker, to be mounted at the root
// of its HTTP server (the paths are absolute: /internal/v1/...).
func NewHandler(cfg HandlerConfig) (http.Handler, error) {
	if len(cfg.Secret) < transfer.MinSecret {
		return nil, fmt.Errorf("workerapi: cluster secret shorter than %d bytes", transfer.MinSecret)
	}
	if cfg.Decoder == nil && cfg.Prefiller == nil {
		return nil, errors.New("workerapi: neither a Decoder nor a Prefiller to serve")
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	h := &handler{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.mux.HandleFunc("POST "+PathGenerate, h.generate)
	h.mux.HandleFunc("POST "+PathPrefill, h.prefill)
	h.mux.HandleFunc("POST "+PathAbort, h.abort)
	h.mux.HandleFunc("GET "+PathInfo, h.info)
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, errorBody{Error: errorToJSON(err)})
}

func invalid(format string, args ...any) error {
	return reqerr.New(reqerr.KindInvalidRequest, format, args...)
}

// body reads the request body within MaxBody and checks X-Kvfence-Auth; it
// answers the request itself and returns false when either fails.
func (h *handler) body(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, invalid("body over %d bytes", mbe.Limit))
		} else {
			writeError(w, http.StatusBadRequest, invalid("reading the body failed"))
		}
		return nil, false
	}
	if !verify(h.cfg.Secret, r.Method, r.URL.Path, b, r.Header.Get(AuthHeader)) {
		h.log.Warn("workerapi: request without a valid cluster signature", "path", r.URL.Path, "remote", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, reqerr.New(reqerr.KindInvalidRequest, "missing or invalid "+AuthHeader))
		return nil, false
	}
	return b, true
}

func sampling(s samplingJSON) engine.Sampling {
	return engine.Sampling{Temperature: s.Temperature, TopP: s.TopP, Seed: s.Seed}
}

// parseGenerate decodes a generate body. The engine checks the request
// against its signed Open; this checks only the shape.
func parseGenerate(b []byte) (*engine.GenerateRequest, error) {
	var req generateJSON
	if err := decodeStrict(b, &req); err != nil {
		return nil, invalid("generate request: %v", err)
	}
	open, err := decodeFrame[*transfer.Open](req.Open, "open")
	if err != nil {
		return nil, invalid("%v", err)
	}
	return &engine.GenerateRequest{
		Open: open, Tenant: req.Tenant, Prompt: req.Prompt, MaxTokens: req.MaxTokens,
		Sampling: sampling(req.Sampling), StopIDs: req.StopIDs, Logprobs: req.Logprobs, TopLogprobs: req.TopLogprobs,
	}, nil
}

// parsePrefill decodes a prefill body.
func parsePrefill(b []byte) (*engine.PrefillRequest, error) {
	var req prefillJSON
	if err := decodeStrict(b, &req); err != nil {
		return nil, invalid("prefill request: %v", err)
	}
	pm, err := decodeFrame[*transfer.Prefill](req.Prefill, "prefill")
	if err != nil {
		return nil, invalid("%v", err)
	}
	return &engine.PrefillRequest{Prefill: pm, Tenant: req.Tenant, Prompt: req.Prompt,
		Sampling: sampling(req.Sampling), DecodeAddr: req.DecodeAddr}, nil
}

func (h *handler) generate(w http.ResponseWriter, r *http.Request) {
	b, ok := h.body(w, r)
	if !ok {
		return
	}
	if h.cfg.Decoder == nil {
		writeError(w, http.StatusNotFound, invalid("this worker does not decode"))
		return
	}
	gr, err := parseGenerate(b)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	ctx := r.Context()
	stream, err := h.cfg.Decoder.Generate(ctx, gr)
	if err != nil {
		if ctx.Err() != nil {
			return // the router left
		}
		writeError(w, statusOf(err), err)
		return
	}
	// Close ends the sequence unless it finished: when the router cancels
	// the request (its stream was closed) this is the abort.
	defer stream.Close()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	var line []byte
	for {
		ev, err := stream.Next(ctx)
		switch {
		case err == io.EOF:
			return
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			line = appendErrorLine(line[:0], err)
		default:
			if line, err = appendEvent(line[:0], ev); err != nil {
				h.log.Error("workerapi: encoding a token event", "err", err)
				line = appendErrorLine(line[:0], reqerr.New(reqerr.KindInternal, "event encoding"))
			}
		}
		if _, werr := w.Write(line); werr != nil {
			return
		}
		if rc.Flush() != nil || err != nil {
			return
		}
	}
}

func (h *handler) prefill(w http.ResponseWriter, r *http.Request) {
	b, ok := h.body(w, r)
	if !ok {
		return
	}
	if h.cfg.Prefiller == nil {
		writeError(w, http.StatusNotFound, invalid("this worker does not prefill"))
		return
	}
	pr, err := parsePrefill(b)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	// The request's context is the Prefill call's: a router that gives up
	// closes the request and the worker aborts the room.
	if err := h.cfg.Prefiller.Prefill(r.Context(), pr); err != nil {
		if r.Context().Err() != nil {
			return
		}
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, okJSON{OK: true})
}

func (h *handler) abort(w http.ResponseWriter, r *http.Request) {
	b, ok := h.body(w, r)
	if !ok {
		return
	}
	var req abortJSON
	if err := decodeStrict(b, &req); err != nil {
		writeError(w, http.StatusBadRequest, invalid("abort request: %v", err))
		return
	}
	m, err := decodeFrame[*transfer.Abort](req.Abort, "abort")
	if err != nil {
		writeError(w, http.StatusBadRequest, invalid("%v", err))
		return
	}
	if h.cfg.Decoder != nil {
		h.cfg.Decoder.Abort(m)
	}
	if h.cfg.Prefiller != nil {
		h.cfg.Prefiller.Abort(m)
	}
	writeJSON(w, http.StatusOK, okJSON{OK: true})
}

func (h *handler) info(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.body(w, r); !ok {
		return
	}
	var i engine.WorkerInfo
	if h.cfg.Decoder != nil {
		i = h.cfg.Decoder.Info()
	} else {
		i = h.cfg.Prefiller.Info()
	}
	writeJSON(w, http.StatusOK, infoToJSON(i))
}
