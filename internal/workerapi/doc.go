// Package workerapi carries the router-to-worker seam (engine.Decoder and
// engine.Prefiller) over HTTP between processes: NewHandler serves a worker,
// Client calls one and implements both interfaces.
//
// # Endpoints
//
//	POST /internal/v1/generate  GenerateRequest JSON -> NDJSON, one event per line
//	POST /internal/v1/prefill   PrefillRequest JSON  -> {"ok":true} or an error body
//	POST /internal/v1/abort     {"abort": frame}     -> {"ok":true}
//	GET  /internal/v1/info      -> WorkerInfo JSON
//
// The signed protocol messages (Open, Prefill, Abort) travel as their
// transfer wire frames (base64 in JSON), so their MACs survive the trip and
// the worker decodes them with transfer.Decode.
//
// A generate response streams lines of {"token":{...}}; the last token has
// "finish" set; a failure, before or during the stream, is a line (or, before
// the stream, a non-200 body) of {"error":{...}} carrying the reqerr kind and
// its numbers, from which the client rebuilds the original error (a
// *reqerr.ContextLengthError stays one, with its numbers).
//
// # Authentication
//
// Every request carries X-Kvfence-Auth: the hex HMAC-SHA256 under the
// cluster secret of method "|" path "|" body. The handler reads the body
// (bounded), checks the header in constant time and answers 401 before it
// decodes anything. Responses are not signed: the seam trusts the network
// path back, as the router trusts its workers.
//
// # Lifetimes
//
// A generate request lives as long as its stream: when the router's
// TokenStream is closed the client cancels the HTTP request, the handler sees
// its context end and closes the worker's stream (the engine's abort
// semantics). A prefill request's context is the Prefill call's: ending it
// aborts the room on the worker.
package workerapi
