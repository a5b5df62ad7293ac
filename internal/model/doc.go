// Package model holds a Llama-family decoder-only transformer's weights and
// its batched forward pass over page tables: one call runs any mix of prefill
// chunks and single decode steps, writes their new K/V into pages and reads
// past K/V only through each sequence's page table (see KVStore).
//
// Load reads a GGUF file (architectures llama, qwen2, qwen3; weights F32,
// F16, BF16, Q8_0, Q4_0) and keeps the weight matrices in the read-only file
// mapping in their file format, so resident memory is about the file size.
//
// Forward is batch-invariant: a token's logits are bit-identical whatever
// else shares the batch, however its sequence was chunked, whatever the page
// size and the number of threads (DESIGN.md §7, invariant I7). Every kernel
// computes each output element with a reduction order fixed by the shapes
// alone (package kernels), attention visits positions in order, and nothing
// is reduced across the rows of a batch. Tests hold the fast path to a
// float64 reference written independently of it and check the invariance
// with exact equality.
//
// All scratch memory lives in a Workspace, sized once; a steady-state
// Forward allocates nothing.
package model
