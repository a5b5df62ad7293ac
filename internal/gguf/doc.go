// Package gguf reads and writes GGUF files, the model container of
// llama.cpp and ollama.
//
// The reader accepts GGUF versions 2 and 3 (little-endian). It treats every
// file as hostile: each count is bounded by the bytes that remain before
// anything is allocated, each offset and dimension product is range-checked,
// and every failure is a returned error that names the field at fault —
// never a panic. Tensor data is not copied: Open maps the file read-only and
// each TensorInfo.Data aliases the mapping until Close.
//
// The writer produces version 3 files laid out the way llama.cpp expects
// (tensor data packed in declaration order, each tensor aligned), so the
// files it writes load in other GGUF runtimes.
//
// The package also holds the reference (scalar, deliberately simple) element
// conversions — IEEE half, bfloat16, Q8_0, Q4_0 and Q4_K blocks — against
// which faster kernels elsewhere are tested.
package gguf
