// Package router is the back end of the OpenAI API (package api): it turns a
// validated api.Request into a generation on one prefill worker and one decode
// worker and streams the tokens back.
//
// For every request the Router
//
//  1. tokenizes: chat messages through the model's chat template
//     (tokenizer.ApplyChatTemplate, encoded with special tokens parsed and no
//     BOS added, since the template writes its own), a completions prompt with
//     BOS/EOS as the tokenizer's AddBOS/AddEOS say and special tokens parsed
//     (as llama.cpp and Hugging Face servers do);
//  2. admits by token count before anything reaches a worker: prompt +
//     max_tokens must fit the context window of the chosen pair (the smaller
//     of the two workers' windows), else *reqerr.ContextLengthError (HTTP
//     400). A request that did not set max_tokens gets what fits instead;
//  3. pairs the least loaded healthy prefill worker with the least loaded
//     healthy decode worker (reqerr.KindNoWorkers when there is none);
//  4. mints a room (128 random bits from crypto/rand) and signs the Open and
//     Prefill messages with the cluster secret (transfer.Auth), so that no
//     worker acts on a room the router did not create;
//  5. starts the decode side, then the prefill side, and adapts the decode
//     worker's token stream to api.Stream: detokenization with the tokenizer's
//     stream decoder, logprobs, usage counts and finish reasons.
//
// # Contexts and the abort policy
//
// Workers never see the HTTP request's context: every generation runs under a
// context of its own that the Router cancels itself, after telling both
// workers to abort. When the client goes away (the handler closes the stream
// before its end), AbortPolicy decides: AbortFirstToken (the default) lets a
// request that has not produced its first token yet run until it does and
// aborts it then, so that an ordinary disconnect does not abort a transfer in
// flight (DESIGN.md §4); a request past its first token is aborted at once.
// AbortImmediate always aborts at once.
//
// A prefill that fails in a way the decode side cannot learn through the
// transfer protocol (the prefill worker was unreachable, or refused the
// request before its machine saw it) aborts the decode side, so that the decode
// worker never waits for a transfer that will not come; the client gets the
// prefill side's error.
//
// # Lifecycle
//
// New starts nothing. Each stream owns one goroutine, which runs the
// blocking prefill call; a stream closed before its first token under
// AbortFirstToken also owns the goroutine that waits for that token. The
// handler's goroutine reads the decode worker's events itself, so a token
// costs no hand-off. StopAccepting refuses new requests (KindShuttingDown,
// and Ready says so); Shutdown does that, waits for the streams in flight
// and their goroutines until its context ends, then ends the first-token
// waits (aborting those rooms) and waits for the goroutines to exit.
package router
