package engine

import "github.com/kvfence/kvfence/internal/sampling"

// samplingParams is the sampling package's form of s. Both workers build
// their samplers from it, so the prefill side's first draw and the decode
// side's later draws come from one seeded stream, as in one process.
func samplingParams(s Sampling, logprobs bool, top int) sampling.Params {
	return sampling.Params{
		Temperature: float32(s.Temperature), TopK: s.TopK, TopP: float32(s.TopP), MinP: float32(s.MinP),
		Seed: s.Seed, LogProbs: logprobs, TopLogProbs: top,
	}
}
