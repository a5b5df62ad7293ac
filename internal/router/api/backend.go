package api

import "context"

// Message is one chat message after validation. Its fields are those of
// tokenizer.Message, so a backend converts with tokenizer.Message(m). The api
// package keeps its own type so that the HTTP layer does not depend on the
// tokenizer's build.
type Message struct {
	Role    string // "system", "user" or "assistant" ("developer" arrives as "system")
	Content string // text parts concatenated
}

// Request is a validated generation request. Tokenization, the chat
// template and admission happen behind the Backend.
type Request struct {
	ID     string // request id, also sent to the client as X-Request-Id; safe to log
	Tenant string // from the API key, or tenants.Default
	Model  string // one of Backend.Models()

	Chat     bool      // Messages is set (chat completions); else Prompt (completions)
	Messages []Message // at least one
	Prompt   string

	// MaxTokens is the most tokens to generate, always >= 1. When the client
	// set max_tokens or max_completion_tokens, it is that value and
	// MaxTokensAuto is false: the backend MUST reject a request whose prompt
	// plus MaxTokens exceeds its limit with *reqerr.ContextLengthError. When
	// the client did not set it, MaxTokens is the default (Config: 16 for
	// completions as OpenAI documents, DefaultChatMaxTokens for chat) and
	// MaxTokensAuto is true: the backend SHOULD lower MaxTokens to what fits
	// (limit - prompt) instead of rejecting, and reject only a prompt that
	// leaves no room for one token.
	MaxTokens     int
	MaxTokensAuto bool

	Temperature float64 // [0, 2]; 0 means greedy
	TopP        float64 // (0, 1]; 1 keeps all tokens (a client's top_p 0 arrives as Temperature 0, TopP 1)
	Seed        *int64  // nil: the backend picks a seed

	// Logprobs asks for Token.Logprob; TopLogprobs (0..20) for Token.Top.
	Logprobs    bool
	TopLogprobs int
}

// Stop sequences, streaming and usage reporting are applied by the api
// package itself, on the text the backend returns: they need no engine
// support. A stop sequence makes the handler Close the stream early, which
// the backend sees as an ordinary abort.

// Token is one generated token.
type Token struct {
	// Text is the text this token completes, valid UTF-8. It is "" while a
	// multi-byte character is incomplete; the character's text arrives with
	// the token that completes it.
	Text string
	ID   int32
	// Bytes are this token's own bytes (possibly a fragment of a UTF-8
	// character); they feed the logprobs "token" and "bytes" fields. Only
	// needed when Request.Logprobs.
	Bytes   string
	Logprob float32      // natural log; only when Request.Logprobs
	Top     []TopLogprob // at most Request.TopLogprobs, most likely first
}

// TopLogprob is one alternative at a generated position.
type TopLogprob struct {
	ID      int32
	Bytes   string
	Logprob float32
}

// Finish reasons of Result.FinishReason.
const (
	FinishStop   = "stop"   // end-of-generation token, or a stop sequence
	FinishLength = "length" // MaxTokens reached
)

// Result summarizes a generation.
type Result struct {
	FinishReason     string // FinishStop or FinishLength; "" until Next returned io.EOF
	PromptTokens     int    // final once Generate returned
	CompletionTokens int    // tokens returned by Next so far
}

// Stream is one generation in progress. It is used by one goroutine.
type Stream interface {
	// Next blocks until the next token. It returns io.EOF when generation
	// ended normally (then Result().FinishReason is set), ctx's error when
	// ctx ends, or a request error (see Backend). After Next returned an
	// error, further calls return the same error.
	Next(ctx context.Context) (Token, error)
	// Result may be called at any time before Close; see Result for which
	// fields are final when.
	Result() Result
	// Close releases the stream. The caller MUST call it exactly once,
	// whether or not Next reached io.EOF. Closing before io.EOF aborts the
	// generation: the backend stops it and releases what it holds (for a
	// PD deployment: through the normal abort path, deferred release
	// included). The handler closes the stream before it writes the end of
	// the response. Close MUST NOT block on the network for long.
	Close()
}

// ModelInfo describes a served model.
type ModelInfo struct {
	ID            string // the name clients send as "model"
	Created       int64  // unix seconds, shown by /v1/models
	OwnedBy       string
	ContextLength int // tokens; 0 = unknown (max_tokens is then bounded by Config.MaxTokensLimit only)
}

// Backend runs generations. Implementations MUST be safe for concurrent use.
//
// Context: the ctx passed to Generate and Next is the HTTP request's
// context. Its cancellation means the client is gone; what to do then (abort
// at once, or let the request reach its first token) is the backend's abort
// policy. The handler also calls Close.
//
// Errors: Generate and Next return errors classified by reqerr.KindOf, and
// the handler turns the kind into the HTTP status (see ErrorFor):
// *reqerr.ContextLengthError for a prompt that can never fit (400), and
// *reqerr.Error of kinds KindInvalidRequest (400), KindUnknownModel (404),
// KindOverloaded (429), KindNoWorkers and KindShuttingDown (503),
// KindPeerLost (502), KindIntegrity (500 kv_integrity_error). Any other error
// is a 500 whose text is logged, not shown. The handler commits the HTTP
// status only after the first token, so an admission error returned by the
// first Next (Generate may return before admission completes) still reaches
// the client with its own status (invariant I3).
type Backend interface {
	// Models lists the served models. It MUST be cheap: it is called for
	// every request.
	Models() []ModelInfo
	// Generate starts r. On success the caller owns the Stream and MUST
	// Close it. r is not modified by either side after the call.
	Generate(ctx context.Context, r *Request) (Stream, error)
}
