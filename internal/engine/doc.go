// Package engine runs the prefill and decode workers: each is a driver
// around its transfer machine (package transfer) with one goroutine owning
// the machine, the model's forward pass and the worker's KV pool.
//
// The decode worker admits requests fairly across tenants, reserves the
// pages a request can ever need (prompt + max_tokens) before it grants
// anything, so an admitted request never fails for lack of pages, and runs
// continuous batching: sequences join when their transfer is verified and
// leave at every step, and each step is one model.Forward call for the
// whole batch. Before every step each sequence's page fences are verified.
//
// The prefill worker runs chunked prefill into its own pool, reports
// progress to its machine after each chunk, samples the first token and
// hands page writes to the link (package transfer/link).
//
// The router talks to workers through Decoder and Prefiller; HTTP adapters
// implement the same interfaces across processes.
package engine
