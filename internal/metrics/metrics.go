package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfence/kvfence/internal/kvpool"
)

// WorkerStats is one worker's statistics at one moment, as a Source reports
// them. Counters (the *Total fields and Pool's counters) only grow.
type WorkerStats struct {
	Role string // "prefill" or "decode": the role label
	Pool kvpool.Stats
	// PageSize is tokens per page; PoolTokens = Pool.Total*PageSize.
	PageSize int
	// ContextWindow is the most tokens one request may use, after the I6
	// check against the pool.
	ContextWindow int
	// DeferredDrained and DeferredTimeout count deferred releases by
	// outcome (decode workers): ended by the prefill side's Drained, or by
	// the drain timeout (the pages went to quarantine).
	DeferredDrained, DeferredTimeout uint64
	// IntegrityFailures counts transfers that failed verification.
	IntegrityFailures uint64
	// Rejected counts admissions rejected, by reason (a reqerr kind name).
	Rejected map[string]uint64
}

// Source reports a worker's statistics. It is called at every scrape and
// MUST be safe for concurrent use.
type Source func() WorkerStats

// Collector is a prometheus.Collector over the statistics of a set of
// workers. Workers of the same role are summed: a metric's labels never name a
// worker.
type Collector struct {
	sources []Source

	pages, tokens, window, deferred, fence, checksum, quarantined, integrity, rejected *prometheus.Desc
}

// NewCollector returns a Collector over sources. Register it on the
// registry that serves /metrics.
func NewCollector(sources ...Source) *Collector {
	return &Collector{
		sources: sources,
		pages: prometheus.NewDesc("kvfence_kv_pool_pages",
			"KV pool pages by state (free + allocated + deferred + quarantined = the pool, invariant I5).",
			[]string{"role", "state"}, nil),
		tokens: prometheus.NewDesc("kvfence_kv_pool_tokens",
			"Tokens the KV pool holds (pages x page size); never below the context window (invariant I6).",
			[]string{"role"}, nil),
		window: prometheus.NewDesc("kvfence_context_window_tokens",
			"The most tokens one request may use (prompt + max_tokens).",
			[]string{"role"}, nil),
		deferred: prometheus.NewDesc("kvfence_decode_deferred_kv_release_total",
			"Deferred releases of an aborted request's pages, by outcome: drained (the prefill side confirmed no write in flight) or timeout (pages quarantined until the connection epoch changes).",
			[]string{"outcome"}, nil),
		fence: prometheus.NewDesc("kvfence_kv_fence_mismatches_total",
			"Pages whose header fence did not match the expected (room, epoch): a read refused.",
			[]string{"role"}, nil),
		checksum: prometheus.NewDesc("kvfence_kv_checksum_failures_total",
			"Pages whose checksum was missing or wrong.",
			[]string{"role"}, nil),
		quarantined: prometheus.NewDesc("kvfence_kv_quarantined_pages_total",
			"Pages ever moved to quarantine.",
			[]string{"role"}, nil),
		integrity: prometheus.NewDesc("kvfence_kv_integrity_failures_total",
			"KV transfers that failed verification (fence, checksum or count).",
			[]string{"role"}, nil),
		rejected: prometheus.NewDesc("kvfence_admissions_rejected_total",
			"Requests rejected at a worker's admission, before any page was reserved, by reason.",
			[]string{"role", "reason"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pages, c.tokens, c.window, c.deferred, c.fence, c.checksum, c.quarantined, c.integrity, c.rejected} {
		ch <- d
	}
}

// sum is the statistics of one role.
type sum struct {
	free, allocated, deferredPages, quarantinedPages, tokens int
	window                                                   int // the smallest of the role's windows
	drained, timeout, fence, checksum, quarantined, integ    uint64
	rejected                                                 map[string]uint64
}

// Collect implements prometheus.Collector: it reads every source now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	byRole := map[string]*sum{}
	var roles []string
	var drained, timeout uint64
	for _, src := range c.sources {
		st := src()
		s := byRole[st.Role]
		if s == nil {
			s = &sum{rejected: map[string]uint64{}}
			byRole[st.Role] = s
			roles = append(roles, st.Role)
		}
		s.free += st.Pool.Free
		s.allocated += st.Pool.Allocated
		s.deferredPages += st.Pool.Deferred
		s.quarantinedPages += st.Pool.Quarantined
		s.tokens += st.Pool.Total * st.PageSize
		if s.window == 0 || st.ContextWindow < s.window {
			s.window = st.ContextWindow
		}
		s.fence += st.Pool.FenceMismatches
		s.checksum += st.Pool.ChecksumFailures
		s.quarantined += st.Pool.QuarantinedPages
		s.integ += st.IntegrityFailures
		for reason, n := range st.Rejected {
			s.rejected[reason] += n
		}
		drained += st.DeferredDrained
		timeout += st.DeferredTimeout
	}
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	sort.Strings(roles)
	for _, role := range roles {
		s := byRole[role]
		gauge(c.pages, s.free, role, "free")
		gauge(c.pages, s.allocated, role, "allocated")
		gauge(c.pages, s.deferredPages, role, "deferred")
		gauge(c.pages, s.quarantinedPages, role, "quarantined")
		gauge(c.tokens, s.tokens, role)
		gauge(c.window, s.window, role)
		counter(c.fence, s.fence, role)
		counter(c.checksum, s.checksum, role)
		counter(c.quarantined, s.quarantined, role)
		counter(c.integrity, s.integ, role)
		for reason, n := range s.rejected {
			counter(c.rejected, n, role, reason)
		}
	}
	counter(c.deferred, drained, "drained")
	counter(c.deferred, timeout, "timeout")
}
