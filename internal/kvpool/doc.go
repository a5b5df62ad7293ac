// Package kvpool is the decode and prefill workers' KV cache: a pool of
// fixed-size pages carved once from a memory budget, with the bookkeeping
// that says whose page is whose.
//
// # Memory
//
// The pool is one slab allocated in New; nothing is allocated afterwards.
// A page is one contiguous byte range of Shape.PageBytes() bytes:
//
//	offset 0   64-byte header (see Header)
//	offset 64  layer 0 K, layer 0 V, layer 1 K, layer 1 V, ... layer L-1 V
//
// each K or V block holding PageSize*KVHeads*HeadDim float32 (little-endian,
// the host order on every supported platform), slot-major as
// model.KVStore documents. A remote page write copies the whole range, header
// included, so the writer's stamp travels with the data it describes.
//
// # Ownership
//
// Every page is in exactly one state: free, allocated, deferred (an aborted
// request's page held until the prefill side confirms no write for it is in
// flight) or quarantined (held until the connection it may be written
// through is re-established). free+allocated+deferred+quarantined = total
// at every moment (invariant I5); invariant builds check it after every
// transition and panic on a transition from the wrong state (double free).
//
// Each allocation increments the page's epoch and records the expected
// fence (room, epoch). The header of a page carries the fence it was last
// written under; readers compare the two before using the page
// (VerifyFences) and fail closed. Allocation does not stamp the header: a
// page granted for a transfer but never written keeps its previous owner's
// (or a poisoned) header and so fails verification instead of passing as
// empty. Pages a worker fills itself (decode growth, the prefill worker's
// own pages) are stamped with Stamp.
//
// A checksum (CRC-32, IEEE polynomial: hardware-backed, and the fastest of
// the standard library's candidates in BenchmarkChecksum, ahead of CRC32C)
// covers the header, with its checksum field zeroed, and the page data. A
// header without the checksum flag fails VerifyChecksum: a missing checksum
// is a failure, not a skip.
//
// # Concurrency
//
// Pool methods are safe for concurrent use. Bookkeeping is under one mutex;
// page memory (LayerKV, PageBytes) is not locked: who may touch a page's
// bytes is decided by its state and by the transfer protocol's windows, not
// by the pool.
package kvpool
