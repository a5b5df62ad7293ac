// Package sampling picks the next token from a row of logits — greedy,
// temperature, top-k, top-p, min-p, seeded and replayable — reports log
// probabilities, and decides when generation stops: on end-of-generation
// token ids, and on stop strings matched across token boundaries in the
// detokenized stream (Stopper).
//
// A Sampler belongs to one sequence and is not safe for concurrent use. All
// working memory is allocated when it is built; sampling a token allocates
// nothing.
package sampling
