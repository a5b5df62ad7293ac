package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfence/kvfence/internal/kvpool"
)

func TestCollectorSumsByRole(t *testing.T) {
	dec := func(free, alloc int) Source {
		return func() WorkerStats {
			return WorkerStats{
				Role: "decode", PageSize: 16, ContextWindow: 256,
				Pool: kvpool.Stats{
					Counts:          kvpool.Counts{Total: 32, Free: free, Allocated: alloc, Deferred: 32 - free - alloc - 1, Quarantined: 1},
					FenceMismatches: 2, ChecksumFailures: 1, QuarantinedPages: 3,
				},
				DeferredDrained: 4, DeferredTimeout: 1, IntegrityFailures: 1,
				Rejected: map[string]uint64{"context_length_exceeded": 2},
			}
		}
	}
	pre := func() WorkerStats {
		return WorkerStats{Role: "prefill", PageSize: 16, ContextWindow: 128,
			Pool: kvpool.Stats{Counts: kvpool.Counts{Total: 8, Free: 8}}}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(dec(30, 0), dec(20, 10), pre))
	got := gather(t, reg)
	want := map[string]float64{
		`kvfence_kv_pool_pages{role="decode",state="allocated"}`:                            10,
		`kvfence_kv_pool_pages{role="decode",state="deferred"}`:                             2,
		`kvfence_kv_pool_pages{role="decode",state="free"}`:                                 50,
		`kvfence_kv_pool_pages{role="decode",state="quarantined"}`:                          2,
		`kvfence_kv_pool_pages{role="prefill",state="free"}`:                                8,
		`kvfence_kv_pool_pages{role="prefill",state="allocated"}`:                           0,
		`kvfence_kv_pool_tokens{role="decode"}`:                                             1024,
		`kvfence_kv_pool_tokens{role="prefill"}`:                                            128,
		`kvfence_context_window_tokens{role="decode"}`:                                      256,
		`kvfence_context_window_tokens{role="prefill"}`:                                     128,
		`kvfence_decode_deferred_kv_release_total{outcome="drained"}`:                       8,
		`kvfence_decode_deferred_kv_release_total{outcome="timeout"}`:                       2,
		`kvfence_admissions_rejected_total{reason="context_length_exceeded",role="decode"}`: 4,
		`kvfence_kv_fence_mismatches_total{role="decode"}`:                                  4,
		`kvfence_kv_checksum_failures_total{role="decode"}`:                                 2,
		`kvfence_kv_quarantined_pages_total{role="decode"}`:                                 6,
		`kvfence_kv_integrity_failures_total{role="decode"}`:                                2,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// gather returns every sample of reg as "name{label="value",...}" -> value,
// labels sorted by name as the client library sorts them.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var b strings.Builder
			b.WriteString(mf.GetName())
			if len(m.GetLabel()) > 0 {
				b.WriteString("{")
				for i, l := range m.GetLabel() {
					if i > 0 {
						b.WriteString(",")
					}
					fmt.Fprintf(&b, "%s=%q", l.GetName(), l.GetValue())
				}
				b.WriteString("}")
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[b.String()] = v
		}
	}
	return out
}
