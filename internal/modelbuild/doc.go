// Package modelbuild writes GGUF model files with deterministic
// pseudo-random weights and a real tokenizer, so tests and benchmarks never
// download a model.
//
// Weights come from a small PRNG of this package (splitmix64 feeding an
// Irwin–Hall approximation of the normal distribution), computed with exact
// integer arithmetic and one correctly rounded multiply per value: the bytes
// depend only on Options, never on the Go version or the platform. They are
// scaled so activations stay O(1) through any depth (each matrix is
// N(0, 1/fan-in), bounded at ±3.5σ) and logits are far from flat (the
// output projection gives logits a standard deviation of about 5).
package modelbuild
