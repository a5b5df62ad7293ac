// Package kernels holds the numeric inner loops of the forward pass: dot
// products of float32 activation rows with weight rows stored in their
// compact on-disk formats (F32, F16, BF16, Q8_0, Q4_0), a matrix multiply
// split over a fixed worker pool, RMSNorm, rotary position embedding,
// softmax and the SwiGLU activation.
//
// # Batch invariance
//
// Every output element is computed by one call of one function whose
// reduction order is fixed by the length of the row alone: four lane
// accumulators over i mod 4, combined as (a0+a1)+(a2+a3), blocks of
// quantized formats summed in order. How many activation rows share a call
// and how the output rows are split across threads never changes the order
// of any floating-point operation, so a row's result is bit-identical alone,
// in a batch, or in any chunking (DESIGN.md §7, invariant I7). Products are
// written float32(a*b) so that no compiler may fuse them into an FMA on one
// path and not on another.
//
// This is the portable path; vectorized kernels, when they come, are a
// separate implementation with the same contract.
package kernels
