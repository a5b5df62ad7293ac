package engine

import (
	"context"

	"github.com/kvfence/kvfence/internal/transfer"
)

// Finish reasons of TokenEvent.Finish (the OpenAI words).
const (
	FinishStop   = "stop"   // an end-of-generation token or one of StopIDs
	FinishLength = "length" // MaxTokens reached
)

// WorkerInfo describes a worker to the router: enough to pair, to admit by
// token count and to balance load.
type WorkerInfo struct {
	Role  string // "prefill" or "decode"
	Model string // the served model's name
	// ContextWindow is the most tokens one request may use (prompt +
	// max_tokens), after the I6 check (never above PoolTokens).
	ContextWindow int
	PageSize      int
	PoolPages     int
	PoolTokens    int
	FreePages     int
	// Running counts requests holding pages or computing; Queued those
	// waiting for admission. MaxRunning is --max-running-requests.
	Running, Queued, MaxRunning int
	// Peer is the worker's transfer identity; TransferAddr where prefill
	// workers reach a decode worker ("" in process).
	Peer         transfer.PeerID
	TransferAddr string
	Draining     bool // Close was called: no new work is taken
}

// Sampling says how tokens are chosen. The prefill worker samples the first
// token and the decode worker the rest with the same parameters, so a
// request's tokens do not depend on where they were sampled.
type Sampling struct {
	Temperature float64 // 0 means greedy (argmax, lowest id on ties)
	TopP        float64 // nucleus mass in (0, 1]; 0 or 1 means no cut
	TopK        int     // keep the K most likely; 0 keeps all
	MinP        float64 // keep tokens at least MinP times the best; 0 keeps all
	Seed        uint64  // the router picks one when the client gave none
}

// GenerateRequest asks a decode worker to serve one room. The router mints
// the room and signs Open under the cluster secret; everything else travels
// beside the signed message and is checked against it.
type GenerateRequest struct {
	Open   *transfer.Open // signed: room, prefill peer, prompt length, max tokens
	Tenant string         // for fair admission; never logged with request data
	// Prompt holds the prompt tokens; len(Prompt) MUST equal
	// Open.PromptTokens. The decode worker reads the KV of the prompt from
	// the transfer, never recomputes it; it uses the last prompt token only
	// to give the first generated token its logprobs.
	Prompt    []int32
	MaxTokens int // MUST equal Open.MaxTokens; >= 1
	Sampling  Sampling
	// StopIDs end generation (FinishStop) like the model's end-of-generation
	// tokens do.
	StopIDs []int32
	// Logprobs asks for TokenEvent.Logprob; TopLogprobs (0..20) for
	// TokenEvent.Top.
	Logprobs    bool
	TopLogprobs int
}

// PrefillRequest asks a prefill worker to compute one room's prompt KV and
// write it into the decode worker's pages.
type PrefillRequest struct {
	Prefill *transfer.Prefill // signed: room, decode peer, prompt length, max tokens
	Tenant  string
	Prompt  []int32 // len MUST equal Prefill.PromptTokens
	// Sampling picks the first token; it MUST be the Sampling the decode
	// worker gets for the room.
	Sampling Sampling
	// DecodeAddr is the decode worker's transfer address, dialled when the
	// prefill worker has no link to Prefill.Decode yet ("" in process).
	DecodeAddr string
}

// TopLogprob is one alternative at a generated position.
type TopLogprob struct {
	ID      int32
	Logprob float32
}

// TokenEvent is one generated token.
type TokenEvent struct {
	ID      int32
	Logprob float32      // natural log; only when GenerateRequest.Logprobs
	Top     []TopLogprob // at most TopLogprobs, most likely first
	// Finish is set on the last event. When it is FinishStop the event's ID
	// is the stop token (an end-of-generation token or one of StopIDs): it
	// was generated and counts as a completion token, but it is not output
	// text.
	Finish string
}

// TokenStream is one generation in progress, as the router reads it.
//
// It is used by one goroutine. Next blocks until the next token; after the
// event with Finish set it returns io.EOF. It returns a request error (a
// *reqerr.Error or *reqerr.ContextLengthError: peer_lost, kv_integrity_error,
// aborted, shutting_down, ...) when the request failed, and ctx's error when
// ctx ends (the generation goes on: ending it is Close's job). Once Next
// returned an error, later calls return the same error.
//
// Close MUST be called exactly once. Closing before io.EOF ends the
// sequence (client gone, or a stop string the router found) and frees its
// pages through the normal paths (deferred release when a transfer may
// still be writing). Close does not block on the worker.
type TokenStream interface {
	Next(ctx context.Context) (TokenEvent, error)
	Close()
}

// Decoder is a decode worker as the router sees it. Implementations (the
// in-process *DecodeWorker, an HTTP client) MUST be safe for concurrent
// use.
type Decoder interface {
	Info() WorkerInfo
	// Generate admits r. A request that can never fit (prompt + MaxTokens
	// beyond the context window or the pool) gets *reqerr.ContextLengthError
	// before any page is reserved (I3), and a malformed one a
	// *reqerr.Error of KindInvalidRequest; a worker that is closing returns
	// KindShuttingDown, a full admission queue KindOverloaded. Otherwise the
	// request is queued (fairly across tenants) until its pages fit, and the
	// returned stream delivers its tokens or its error. ctx bounds the
	// Generate call only, not the generation.
	Generate(ctx context.Context, r *GenerateRequest) (TokenStream, error)
	// Abort ends a room early (client gone, timeout): m is signed by the
	// router. The stream, if any, then returns an aborted error. Aborting
	// an unknown or finished room does nothing.
	Abort(m *transfer.Abort)
}

// Prefiller is a prefill worker as the router sees it. Implementations MUST
// be safe for concurrent use.
type Prefiller interface {
	Info() WorkerInfo
	// Prefill runs r and returns when the transfer is done (Done sent: every
	// page landed in the decode pool) with nil, or when it failed, with a
	// reqerr error (context_length_exceeded for a prompt longer than the
	// prefill pool, peer_lost, aborted, ...). When ctx ends first the room
	// is aborted (tombstoned, Drained owed to the decode side) and ctx's
	// error returned.
	Prefill(ctx context.Context, r *PrefillRequest) error
	// Abort ends a room early; m is signed by the router.
	Abort(m *transfer.Abort)
}
