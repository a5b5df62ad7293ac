// Package reqerr is the vocabulary of operating errors a request can end
// with. Every layer shares it: the decode worker's admission creates a
// *ContextLengthError, the transfer protocol carries it inside a Reject frame
// (as a Kind plus numbers, never tenant data), and the router turns it into
// an OpenAI-shaped HTTP error with the right status. Keeping the vocabulary
// in one place is what lets a rejection reach the client as the original
// error (invariant I3) instead of a generic failure.
package reqerr

import (
	"errors"
	"fmt"
)

// Kind names a class of request failure. Its numeric value travels on the
// wire, so values are stable: append, never renumber.
type Kind uint8

const (
	KindUnknown        Kind = 0 // an error outside this vocabulary
	KindContextLength  Kind = 1 // prompt + max_tokens exceed the context window or the pool
	KindInvalidRequest Kind = 2 // a parameter is out of range or unsupported
	KindUnknownModel   Kind = 3 // no such model is served
	KindOverloaded     Kind = 4 // a limit (tenant concurrency, queue) is full; retry later
	KindNoWorkers      Kind = 5 // no prefill/decode pair is available
	KindIntegrity      Kind = 6 // a KV transfer failed verification (fence, checksum, count)
	KindAborted        Kind = 7 // the request was aborted (client gone, shutdown, timeout)
	KindPeerLost       Kind = 8 // a worker the request depended on went away
	KindShuttingDown   Kind = 9 // the worker is shutting down and takes no new work
	KindInternal       Kind = 10
	kindCount               = 11
)

var kindNames = [kindCount]string{
	"unknown", "context_length_exceeded", "invalid_request", "model_not_found",
	"overloaded", "no_workers", "kv_integrity_error", "aborted", "peer_lost",
	"shutting_down", "internal_error",
}

// String returns the kind's stable name, also used as the OpenAI error code
// and as a metrics label value.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Valid reports whether k is a known kind (decoders reject others).
func (k Kind) Valid() bool { return int(k) < kindCount }

// Error is a request failure of a known kind. Detail is operator-facing
// text built only from ids, counts and states, never from tenant data.
type Error struct {
	Kind   Kind
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Kind.String()
	}
	return e.Kind.String() + ": " + e.Detail
}

// New returns an *Error of kind k with a formatted detail.
func New(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Detail: fmt.Sprintf(format, args...)}
}

// ContextLengthError reports a request that can never fit: its prompt plus
// the tokens it asks for exceed Limit (the context window, or the pool when
// the pool is the smaller). It is returned at admission, before any page is
// reserved, and reaches the client as HTTP 400 context_length_exceeded.
type ContextLengthError struct {
	Prompt    int // prompt tokens
	MaxTokens int // tokens asked for
	Limit     int // tokens the request may use in total
}

func (e *ContextLengthError) Error() string {
	return fmt.Sprintf("this model's maximum context length is %d tokens; the request has %d prompt tokens "+
		"and asks for %d more (%d in total)", e.Limit, e.Prompt, e.MaxTokens, e.Prompt+e.MaxTokens)
}

// KindOf classifies err: the Kind of the first *Error or *ContextLengthError
// in its chain, else KindUnknown.
func KindOf(err error) Kind {
	var cl *ContextLengthError
	if errors.As(err, &cl) {
		return KindContextLength
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindUnknown
}
