// Package tokenizer turns text into token ids and back for the model
// families kvfence runs: byte-level BPE ("gpt2", with the Llama 3 and
// Qwen2 pre-tokenizers) and SentencePiece-style BPE ("llama", with scores,
// byte fallback and the space prefix). It also renders the chat templates of
// those families and decodes token streams without ever emitting a broken
// UTF-8 sequence.
//
// A Config is the tokenizer as stored in GGUF metadata (tokenizer.ggml.*)
// or in a Hugging Face tokenizer.json; New compiles it into an immutable
// Tokenizer that is safe for concurrent use. Token ids and text are tenant
// data: they never appear in errors returned by this package.
package tokenizer
