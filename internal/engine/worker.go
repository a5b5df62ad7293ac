package engine

import (
	"fmt"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/transfer"
)

// workerWindow checks what both workers are built from and applies the I6
// capacity check: it returns the context window the worker serves (the
// configured one, else the model's; lowered to the pool when lower is set,
// refused otherwise; never above the model's own) and the note that says
// it was lowered.
func workerWindow(role string, m *model.Model, p *kvpool.Pool, auth *transfer.Auth, window int, lower bool) (int, string, error) {
	if m == nil || p == nil || auth == nil {
		return 0, "", fmt.Errorf("engine: %s worker needs a model, a pool and an auth", role)
	}
	if err := checkShape(m, p); err != nil {
		return 0, "", err
	}
	if window <= 0 {
		window = m.Config.ContextLength
	}
	window, note, err := kvpool.CheckWindow(p.Tokens(), window, lower)
	if err != nil {
		return 0, "", err
	}
	return min(window, m.Config.ContextLength), note, nil
}

func orDefault(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

// checkShape refuses a pool whose pages do not hold this model's KV.
func checkShape(m *model.Model, p *kvpool.Pool) error {
	s := p.Shape()
	c := m.Config
	if s.Layers != c.Layers || s.KVHeads != c.KVHeads || s.HeadDim != c.HeadDim {
		return fmt.Errorf("engine: pool shape %d layers x %d kv heads x %d dims does not fit model %d x %d x %d",
			s.Layers, s.KVHeads, s.HeadDim, c.Layers, c.KVHeads, c.HeadDim)
	}
	return nil
}

// PoolShape is the kvpool shape for model m with pageSize-token pages.
func PoolShape(m *model.Model, pageSize int) kvpool.Shape {
	return kvpool.Shape{Layers: m.Config.Layers, KVHeads: m.Config.KVHeads, HeadDim: m.Config.HeadDim, PageSize: pageSize}
}
