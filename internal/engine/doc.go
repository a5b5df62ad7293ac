// Package engine runs the prefill and decode workers. Each is a driver
// around its transfer machine (package transfer): one goroutine owns the
// machine, the model workspace and the worker's side of the KV pool, and
// acts on every machine output in order (transfer's Output contract).
//
// # Inputs and time
//
// Everything reaches the driver through its inbox: router calls (Generate,
// Prefill, Abort, a stream's Close), and what the links deliver (messages,
// write reports, peer epochs). Link sinks never block (package
// transfer/link), so the inbox is a mutex-guarded slice the driver swaps
// out; its size is bounded by the admission limits (MaxQueue, MaxRunning,
// MaxRooms) and by the protocol's few messages per room. Time enters as
// Tick from a time.Ticker (TickInterval); the machines count ticks, and
// tests that need controlled time run the workers inside testing/synctest,
// whose fake clock drives the ticker.
//
// # Decode worker
//
// Generate checks the request against its signed Open and refuses one that
// can never fit (prompt + max_tokens beyond the context window, which I6
// keeps at or below the pool) with *reqerr.ContextLengthError before any
// page is reserved (I3); the machine still sees the Open and tells the
// prefill side with a Reject. Other requests wait in a fair queue:
// round-robin over tenants, each tenant's requests in order, and the
// tenant whose turn it is waits for its pages rather than being overtaken,
// so neither a flood nor a large request starves anyone.
//
// A request is admitted when a running slot (MaxRunning) and every page it
// can ever need are free: the pages for generated tokens are allocated by
// the engine (under the request's room) and the prompt pages by the machine
// in the same driver turn, so an admitted request never fails or waits for
// lack of pages. When the transfer verifies (StartDecode), the sequence
// joins the decode batch with the prefill side's first token; every step
// is one model.Forward call for all sequences whose client has room in its
// stream buffer, each sequence's page fences verified first
// (kvpool.VerifyFences: a mismatch fails the request with
// kv_integrity_error and the page is never read). A sequence leaves the
// batch on a stop id or end-of-generation token, at max_tokens, when its
// stream is closed, or on a Fail; its growth pages are freed and the
// machine's Finish frees the prompt pages.
//
// A request asking for logprobs recomputes its last prompt position in its
// first step (a two-token chunk; batch invariance makes the rewritten KV
// identical), which gives the first token its logprobs and advances its
// seeded sampler exactly as the prefill side's draw did; without logprobs
// the sampler is advanced by one draw directly. Either way the decode side
// samples tokens 1.. from the same stream one process would.
//
// # Prefill worker
//
// Prefill keeps a request aside until the decode side's Grant for its room
// arrives, and only then steps the signed Prefill message into the machine
// (the prompt stays beside it): local pages are taken only for rooms the
// decode side has admitted. Computing ahead of the grant would let a
// prefill pool full of unadmitted rooms and decode slots full of rooms
// waiting for prefill pages wait for each other (TestNoCrossPoolDeadlock).
// A request that can never fit is stepped at once, so the decode side hears
// the rejection before it reserves anything; a Reject, Abort or peer epoch
// for a waiting request ends it, and so does WaitTimeout. RunPrefill starts chunked prefill into the worker's own pages:
// each forward call carries at most ChunkSize prompt tokens, taken from the
// computing rooms in turn; Computed follows every chunk, so finished pages
// are posted to the link at once (PostWrite), and the last chunk's logits
// give the first token (Sampled). Write reports from the link come back as
// Landed. Prefill returns when the machine sends Done, or with the room's
// Fail error.
//
// # Shutdown
//
// Close(ctx) stops taking work; requests still waiting for admission fail
// with shutting_down; admitted ones run to their end, or are aborted
// through the normal paths (deferred release included) when ctx ends;
// the decode driver then waits, within ctx, for aborted transfers to
// drain, and the prefill driver for every posted write to be reported.
// The links are the caller's to close, after the workers.
//
// Workers implement Decoder and Prefiller (the router's view) and
// link.Sink (the transports'); HTTP adapters implement Decoder and
// Prefiller across processes.
package engine
