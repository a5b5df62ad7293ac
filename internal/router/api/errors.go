package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvfence/kvfence/internal/reqerr"
)

// Errors the api package raises itself (reqerr has no kind for them).
var (
	// errMissingKey: no Authorization: Bearer header while keys are configured.
	errMissingKey = errors.New("missing API key")
	// errInvalidKey: a key that is in no key file line.
	errInvalidKey = errors.New("invalid API key")
	// errNoRoute: a path the server does not serve.
	errNoRoute = errors.New("no such route")
	// errMethod: a method the path does not accept.
	errMethod = errors.New("method not allowed")
)

// StatusClientClosed is recorded (in metrics and logs, never sent) for a
// request whose client went away: nginx's 499.
const StatusClientClosed = 499

// OpenAI error types.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuth           = "authentication_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable_error"
)

// ErrorInfo is how one error reaches the client: an HTTP status and the
// body {"error":{"message","type","param","code"}}.
type ErrorInfo struct {
	Status  int
	Type    string
	Code    string
	Param   string // "" is sent as null
	Message string
	// Reason labels the rejected-requests metric. It is a reqerr kind name
	// or one of a fixed set of api names, never request data.
	Reason string
	// Log: the error text should be logged because the message hides it.
	Log bool
}

// ErrorFor maps an error to its HTTP form. It is the only place statuses
// are chosen; every failure a client can see goes through it.
//
//	*ParamError                      400 invalid_request_error, code and param from the error
//	*http.MaxBytesError              413 invalid_request_error request_too_large
//	missing / invalid API key        401 authentication_error   invalid_api_key
//	*reqerr.ContextLengthError       400 invalid_request_error  context_length_exceeded
//	reqerr.KindInvalidRequest        400 invalid_request_error  invalid_request
//	reqerr.KindUnknownModel          404 invalid_request_error  model_not_found (param model)
//	reqerr.KindOverloaded            429 rate_limit_error       overloaded
//	reqerr.KindNoWorkers             503 service_unavailable_error no_workers
//	reqerr.KindShuttingDown          503 service_unavailable_error shutting_down
//	reqerr.KindAborted               503 service_unavailable_error aborted
//	reqerr.KindPeerLost              502 server_error           peer_lost
//	reqerr.KindIntegrity             500 server_error           kv_integrity_error
//	reqerr.KindInternal, any other   500 server_error           internal_error (message hidden, logged)
//	context.Canceled (client gone)   499 (recorded only; nothing is sent)
func ErrorFor(err error) ErrorInfo {
	var pe *ParamError
	if errors.As(err, &pe) {
		return ErrorInfo{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: pe.Code, Param: pe.Param,
			Message: pe.Message, Reason: reqerr.KindInvalidRequest.String()}
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return ErrorInfo{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: "request_too_large",
			Message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", mbe.Limit), Reason: "request_too_large"}
	}
	switch {
	case errors.Is(err, errMissingKey):
		return ErrorInfo{Status: http.StatusUnauthorized, Type: typeAuth, Code: "invalid_api_key",
			Message: "You didn't provide an API key. Send it in the Authorization header: 'Authorization: Bearer YOUR_KEY'.", Reason: "invalid_api_key"}
	case errors.Is(err, errInvalidKey):
		return ErrorInfo{Status: http.StatusUnauthorized, Type: typeAuth, Code: "invalid_api_key",
			Message: "Incorrect API key provided.", Reason: "invalid_api_key"}
	case errors.Is(err, errNoRoute):
		return ErrorInfo{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: "not_found",
			Message: "Unknown request URL. Served: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.", Reason: "not_found"}
	case errors.Is(err, errMethod):
		return ErrorInfo{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: "method_not_allowed",
			Message: "Method not allowed for this URL.", Reason: "method_not_allowed"}
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if reqerr.KindOf(err) == reqerr.KindUnknown {
			return ErrorInfo{Status: StatusClientClosed, Type: typeInvalidRequest, Code: "client_closed",
				Message: "The client closed the request.", Reason: reqerr.KindAborted.String()}
		}
	}

	kind := reqerr.KindOf(err)
	info := ErrorInfo{Code: kind.String(), Reason: kind.String(), Message: detail(err)}
	switch kind {
	case reqerr.KindContextLength:
		info.Status, info.Type = http.StatusBadRequest, typeInvalidRequest
		var cl *reqerr.ContextLengthError
		if errors.As(err, &cl) {
			info.Message = cl.Error() + ". Please reduce the length of the prompt or of max_tokens."
		}
	case reqerr.KindInvalidRequest:
		info.Status, info.Type = http.StatusBadRequest, typeInvalidRequest
	case reqerr.KindUnknownModel:
		info.Status, info.Type, info.Param = http.StatusNotFound, typeInvalidRequest, "model"
	case reqerr.KindOverloaded:
		info.Status, info.Type = http.StatusTooManyRequests, typeRateLimit
	case reqerr.KindNoWorkers, reqerr.KindShuttingDown, reqerr.KindAborted:
		info.Status, info.Type = http.StatusServiceUnavailable, typeUnavailable
	case reqerr.KindPeerLost:
		info.Status, info.Type = http.StatusBadGateway, typeServer
	case reqerr.KindIntegrity:
		info.Status, info.Type = http.StatusInternalServerError, typeServer
		info.Log = true
	default:
		// Unknown errors may carry anything in their text: log it, show a
		// generic message.
		info.Status, info.Type, info.Code, info.Reason = http.StatusInternalServerError, typeServer,
			reqerr.KindInternal.String(), reqerr.KindInternal.String()
		info.Message = "The server had an error while processing your request."
		info.Log = true
	}
	if info.Message == "" {
		info.Message = defaultMessage[kind]
	}
	return info
}

// detail is the message of a reqerr error: its Detail, which reqerr
// promises is built from ids, counts and states only.
func detail(err error) string {
	var e *reqerr.Error
	if errors.As(err, &e) {
		return e.Detail
	}
	return ""
}

var defaultMessage = map[reqerr.Kind]string{
	reqerr.KindContextLength:  "The request exceeds the model's maximum context length.",
	reqerr.KindInvalidRequest: "The request is invalid.",
	reqerr.KindUnknownModel:   "The model does not exist.",
	reqerr.KindOverloaded:     "Too many requests in flight; retry later.",
	reqerr.KindNoWorkers:      "No worker is available to serve the request; retry later.",
	reqerr.KindShuttingDown:   "The server is shutting down.",
	reqerr.KindAborted:        "The request was aborted.",
	reqerr.KindPeerLost:       "A worker serving the request went away.",
	reqerr.KindIntegrity:      "The KV cache transfer for this request failed verification; no output was produced from it.",
}
