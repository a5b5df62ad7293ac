package model

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvfence/kvfence/internal/gguf"
)

// TestGreedyIsTheBatchedGeneration: Greedy's tokens are the tokens of the
// same prompts generated together with seven others in chunks of 7 over
// shuffled one-token pages, and stop ends generation after its token.
func TestGreedyIsTheBatchedGeneration(t *testing.T) {
	m, _ := loadBuilt(t, tinyOptions("qwen3", gguf.TypeF32, false))
	rng := rand.New(rand.NewPCG(9, 9))
	var prompts [][]int32
	for _, n := range []int{1, 4, 13, 27, 6, 2, 19, 8} {
		prompts = append(prompts, randTokens(rng, n, m.Config.Vocab))
	}
	const steps = 8
	batched := generate(t, m, prompts, steps, 7, 2, 1, true)
	for i, p := range prompts {
		got, err := m.Greedy(p, steps, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, batched[i].out) {
			t.Errorf("prompt %d: Greedy %v, batched %v", i, got, batched[i].out)
		}
		third := got[2]
		short, err := m.Greedy(p, steps, func(id int32) bool { return id == third })
		if err != nil {
			t.Fatal(err)
		}
		if want := got[:slices.Index(got, third)+1]; !slices.Equal(short, want) {
			t.Errorf("prompt %d: with stop at %d: %v, want %v", i, third, short, want)
		}
	}
}
