package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/metrics"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
	"github.com/kvfence/kvfence/internal/transfer/tcp"
	"github.com/kvfence/kvfence/internal/workerapi"
)

// prefillOptions are the flags of `kvfence prefill`.
type prefillOptions struct {
	workerOptions
	chunkedPrefill int
	maxRunning     int
}

func parsePrefillFlags(args []string) (*prefillOptions, error) {
	o := &prefillOptions{}
	fs := flag.NewFlagSet("kvfence prefill", flag.ContinueOnError)
	o.register(fs, "prefill", 8100)
	fs.IntVar(&o.chunkedPrefill, "chunked-prefill-size", 512, "most prompt tokens computed in one forward call (chunks of several prompts share a call)")
	fs.IntVar(&o.maxRunning, "max-running-requests", 16, "most prompts this worker computes at once")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvfence prefill [flags]\n\n"+
			"Runs a prefill worker: it computes prompts chunk by chunk in its own KV pool (which must\n"+
			"hold a whole prompt) and writes the KV pages into the decode worker's pool over a TCP\n"+
			"transfer link it dials (the router tells it the decode worker's transfer address). The\n"+
			"router reaches it on --host:--port (authenticated with the cluster secret); /healthz,\n"+
			"/readyz and /metrics are served there too. SIGTERM or interrupt shuts down gracefully.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.chunkedPrefill < 1 || o.maxRunning < 1 {
		return nil, errors.New("--chunked-prefill-size and --max-running-requests must be positive")
	}
	return o, nil
}

func runPrefill(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parsePrefillFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("role", "prefill")
	secret, auth, err := requiredClusterSecret(o.clusterSecretFile)
	if err != nil {
		return err
	}
	warnUnsafe(log, o.unsafeGiven, o.protections)
	ln, err := listen(o.host, o.port)
	if err != nil {
		return err
	}
	defer ln.Close()

	m, pool, err := loadWorkerModel(&o.workerOptions, log)
	if err != nil {
		return err
	}
	defer m.Close()
	self := o.peer()
	d := &dialer{self: self, secret: secret, log: log}
	pre, err := engine.NewPrefillWorker(engine.PrefillConfig{
		Model: m, Pool: pool, Auth: auth, Self: self, Router: routerPeer,
		ContextWindow: o.contextLength, LowerWindow: o.lowerContextToFit,
		ChunkSize: o.chunkedPrefill, MaxRunning: o.maxRunning, Threads: o.threads,
		Protections: o.protections, Dial: d.dial, Log: log,
	})
	if err != nil {
		return err
	}
	d.setSink(pre)
	logPool(log, pre.Note(), pool, pre.ContextWindow())
	log.Info("prefill worker started", "peer", uint32(self), "chunked_prefill_size", o.chunkedPrefill,
		"max_running_requests", o.maxRunning)

	reg := newRegistry(metrics.NewCollector(func() metrics.WorkerStats {
		s := pre.Stats()
		return metrics.WorkerStats{Role: "prefill", Pool: s.Pool, PageSize: pool.PageSize(), ContextWindow: s.ContextWindow}
	}), gaugeFuncs{
		{prometheus.NewDesc("kvfence_prefill_running_requests", "Prompts this prefill worker is computing.", nil, nil),
			prometheus.GaugeValue, func() float64 { return float64(pre.Stats().Running) }},
		{prometheus.NewDesc("kvfence_prefill_tokens_total", "Prompt tokens this prefill worker computed.", nil, nil),
			prometheus.CounterValue, func() float64 { return float64(pre.Stats().PromptTokens) }},
		{prometheus.NewDesc("kvfence_prefill_writes_lost_total", "Page writes reported lost or refused by the transport.", nil, nil),
			prometheus.CounterValue, func() float64 { return float64(pre.Stats().WritesLost) }},
	})
	api, err := workerapi.NewHandler(workerapi.HandlerConfig{Secret: secret, Prefiller: pre, Logger: log})
	if err != nil {
		_ = pre.Close(context.Background())
		return err
	}
	ready := func() error {
		if pre.Info().Draining {
			return errors.New("draining")
		}
		return nil
	}
	return serveUntil(ctx, ln, workerMux(api, ready, reg), o.shutdownTimeout, log, func(ctx context.Context) error {
		err := pre.Close(ctx)
		d.close()
		return err
	})
}

// dialer opens the prefill worker's transfer links, one per decode worker,
// on first use (engine.PrefillConfig.Dial).
type dialer struct {
	self   transfer.PeerID
	secret []byte
	log    *slog.Logger

	mu struct {
		sync.Mutex
		sink  link.Sink
		links []*tcp.Link // every link dialled, closed at shutdown
	}
}

func (d *dialer) setSink(s link.Sink) {
	d.mu.Lock()
	d.mu.sink = s
	d.mu.Unlock()
}

// dial returns a link to peer at addr once its first connection is up: a
// grant the decode worker sends before then would find no connection.
func (d *dialer) dial(ctx context.Context, peer transfer.PeerID, addr string) (link.Link, error) {
	if addr == "" {
		return nil, errors.New("no transfer address for the decode worker")
	}
	d.mu.Lock()
	sink := d.mu.sink
	d.mu.Unlock()
	l, err := tcp.Dial(tcp.Config{Self: d.self, Secret: d.secret, Sink: sink, Logger: d.log}, peer, addr)
	if err != nil {
		return nil, err
	}
	// Wait for the connection: the room's messages would find none.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.WaitConnected(ctx); err != nil {
		_ = l.Close()
		d.log.Warn("decode worker unreachable", "peer", uint32(peer), "addr", addr, "err", err)
		return nil, err
	}
	d.log.Info("transfer link up", "peer", uint32(peer), "addr", addr)
	d.mu.Lock()
	d.mu.links = append(d.mu.links, l)
	d.mu.Unlock()
	return l, nil
}

func (d *dialer) close() {
	d.mu.Lock()
	links := d.mu.links
	d.mu.links = nil
	d.mu.Unlock()
	for _, l := range links {
		_ = l.Close()
	}
}
