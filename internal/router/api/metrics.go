package api

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Endpoint label values (a fixed set: the path of an unknown route is never
// a label).
const (
	epChat        = "chat_completions"
	epCompletions = "completions"
	epModels      = "models"
	epHealth      = "healthz"
	epReady       = "readyz"
	epMetrics     = "metrics"
	epOther       = "other"
)

// metrics of the HTTP layer. Labels hold endpoint names, status codes and
// reason names only: never tenant names, keys, models asked for, or text.
type metrics struct {
	requests     *prometheus.CounterVec // endpoint, code
	rejected     *prometheus.CounterVec // reason
	inFlight     prometheus.Gauge
	ttft         prometheus.Histogram
	itl          prometheus.Histogram
	e2e          prometheus.Histogram
	genTokens    prometheus.Counter
	promptTokens prometheus.Counter
}

// Latency buckets in seconds. TTFT and end-to-end span a prefill of a few
// milliseconds to minutes-long generations; inter-token latency is a decode
// step, milliseconds to a second.
var (
	ttftBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	itlBuckets  = []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56}
	e2eBuckets  = []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvfence_http_requests_total",
			Help: "HTTP requests by endpoint and status code (499: the client went away).",
		}, []string{"endpoint", "code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvfence_http_rejected_requests_total",
			Help: "Requests that ended with an error, by reason (a reqerr kind name or an HTTP-layer reason).",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvfence_http_requests_in_flight",
			Help: "Generation requests being served.",
		}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvfence_time_to_first_token_seconds",
			Help:    "Time from receiving a request to its first generated token.",
			Buckets: ttftBuckets,
		}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvfence_inter_token_latency_seconds",
			Help:    "Time between consecutive generated tokens of a request, as the router sees them.",
			Buckets: itlBuckets,
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvfence_e2e_request_latency_seconds",
			Help:    "Time from receiving a generation request to its last byte, for requests that completed.",
			Buckets: e2eBuckets,
		}),
		genTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvfence_generation_tokens_total",
			Help: "Tokens generated and sent to clients.",
		}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvfence_prompt_tokens_total",
			Help: "Prompt tokens of requests that produced output.",
		}),
	}
	reg.MustRegister(m.requests, m.rejected, m.inFlight, m.ttft, m.itl, m.e2e, m.genTokens, m.promptTokens)
	return m
}
