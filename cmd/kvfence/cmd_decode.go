package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/metrics"
	"github.com/kvfence/kvfence/internal/transfer/tcp"
	"github.com/kvfence/kvfence/internal/workerapi"
)

// decodeOptions are the flags of `kvfence decode`.
type decodeOptions struct {
	workerOptions
	transferHost string
	transferPort int
	advertise    string
	maxRunning   int
}

func parseDecodeFlags(args []string) (*decodeOptions, error) {
	o := &decodeOptions{}
	fs := flag.NewFlagSet("kvfence decode", flag.ContinueOnError)
	o.register(fs, "decode", 8200)
	fs.IntVar(&o.transferPort, "transfer-port", -1, "TCP port prefill workers connect to for KV transfers (one connection per prefill worker); -1 means --port+1, or a free port when --port is 0")
	fs.StringVar(&o.transferHost, "transfer-host", "", "address the transfer listener binds; empty means --host")
	fs.StringVar(&o.advertise, "transfer-advertise", "", "host:port prefill workers dial to reach the transfer listener (the router tells them); empty means the listener's address, with this machine's host name for a wildcard --host")
	fs.IntVar(&o.maxRunning, "max-running-requests", 64, "most sequences this worker runs at once (more wait in a queue, fairly across tenants)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvfence decode [flags]\n\n"+
			"Runs a decode worker: it owns a KV page pool, grants pages to prefill workers, verifies\n"+
			"every transfer (fences, checksums, page counts) and generates tokens with continuous\n"+
			"batching. The router reaches it on --host:--port (authenticated with the cluster secret);\n"+
			"prefill workers connect to --transfer-port. /healthz, /readyz and /metrics are served on\n"+
			"--port. SIGTERM or interrupt shuts down gracefully.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	switch {
	case o.maxRunning < 1:
		return nil, fmt.Errorf("--max-running-requests must be positive")
	case o.transferPort > 65535 || o.transferPort < -1:
		return nil, fmt.Errorf("--transfer-port %d out of range", o.transferPort)
	case o.transferPort == -1 && o.port == 0:
		o.transferPort = 0
	case o.transferPort == -1:
		o.transferPort = o.port + 1
	}
	if o.transferHost == "" {
		o.transferHost = o.host
	}
	return o, nil
}

func runDecode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseDecodeFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("role", "decode")
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

	// The transfer listener is opened first: the worker tells the router
	// its address (WorkerInfo.TransferAddr).
	nl, err := net.Listen("tcp", net.JoinHostPort(o.transferHost, strconv.Itoa(o.transferPort)))
	if err != nil {
		return fmt.Errorf("transfer listener: %w", err)
	}
	addr := o.advertise
	if addr == "" {
		addr = advertised(o.transferHost, nl.Addr())
	}
	m, pool, err := loadWorkerModel(&o.workerOptions, log)
	if err != nil {
		nl.Close()
		return err
	}
	defer m.Close()
	self := o.peer()
	var kb [8]byte
	_, _ = rand.Read(kb[:])
	dec, err := engine.NewDecodeWorker(engine.DecodeConfig{
		Model: m, Pool: pool, Auth: auth, Self: self, Router: routerPeer,
		ContextWindow: o.contextLength, LowerWindow: o.lowerContextToFit,
		MaxRunning: o.maxRunning, Threads: o.threads, Protections: o.protections,
		TransferAddr: addr, KeyBase: binary.LittleEndian.Uint64(kb[:]), Log: log,
	})
	if err != nil {
		nl.Close()
		return err
	}
	recv := dec.Receiver()
	// Each prefill worker that connects gets one link, which the worker
	// sends its grants through; rooms of a prefill worker that has not
	// connected yet wait in the worker until it has.
	tln, err := tcp.NewListener(tcp.Config{Self: self, Secret: secret, Sink: dec, Receiver: &recv, Logger: log,
		OnLink: func(l *tcp.Link) { dec.AddLink(l) }}, nl)
	if err != nil {
		_ = dec.Close(context.Background())
		return fmt.Errorf("transfer listener: %w", err)
	}
	logPool(log, dec.Note(), pool, dec.ContextWindow())
	log.Info("decode worker started", "peer", uint32(self), "transfer_listen", nl.Addr().String(), "transfer_addr", addr,
		"max_running_requests", o.maxRunning)

	reg := newRegistry(metrics.NewCollector(func() metrics.WorkerStats {
		s := dec.Stats()
		return metrics.WorkerStats{
			Role: "decode", Pool: s.Pool, PageSize: pool.PageSize(), ContextWindow: s.ContextWindow,
			DeferredDrained: s.DeferredDrained, DeferredTimeout: s.DeferredTimeout,
			IntegrityFailures: s.IntegrityFailures, Rejected: rejectedByKind(s.Rejected[:]),
		}
	}), decodeGauges(dec))
	api, err := workerapi.NewHandler(workerapi.HandlerConfig{Secret: secret, Decoder: dec, Logger: log})
	if err != nil {
		_ = dec.Close(context.Background())
		_ = tln.Close()
		return err
	}
	ready := func() error {
		if dec.Info().Draining {
			return fmt.Errorf("draining")
		}
		return nil
	}
	return serveUntil(ctx, ln, workerMux(api, ready, reg), o.shutdownTimeout, log, func(ctx context.Context) error {
		err := dec.Close(ctx)
		// After the worker: its aborted transfers have drained (or the
		// deadline passed); closing the links ends the peers' epochs.
		_ = tln.Close()
		return err
	})
}

// decodeGauges exports the decode worker's request gauges beside the pool
// metrics of the shared collector.
func decodeGauges(dec *engine.DecodeWorker) prometheus.Collector {
	return gaugeFuncs{
		{prometheus.NewDesc("kvfence_decode_running_requests", "Requests holding pages on this decode worker.", nil, nil),
			prometheus.GaugeValue, func() float64 { return float64(dec.Stats().Running) }},
		{prometheus.NewDesc("kvfence_decode_queued_requests", "Requests waiting for admission on this decode worker.", nil, nil),
			prometheus.GaugeValue, func() float64 { return float64(dec.Stats().Queued) }},
		{prometheus.NewDesc("kvfence_generated_tokens_total", "Tokens generated by this decode worker.", nil, nil),
			prometheus.CounterValue, func() float64 { return float64(dec.Stats().GeneratedTokens) }},
		{prometheus.NewDesc("kvfence_decode_steps_total", "Forward calls of the decode loop (each carries every running sequence).", nil, nil),
			prometheus.CounterValue, func() float64 { return float64(dec.Stats().Steps) }},
		{prometheus.NewDesc("kvfence_decode_max_batch_sequences", "The most sequences one decode step has carried since the start.", nil, nil),
			prometheus.GaugeValue, func() float64 { return float64(dec.Stats().MaxBatch) }},
	}
}

// gaugeFuncs is a collector of unlabelled values read at scrape time.
type gaugeFuncs []struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	get  func() float64
}

func (g gaugeFuncs) Describe(ch chan<- *prometheus.Desc) {
	for _, x := range g {
		ch <- x.desc
	}
}

func (g gaugeFuncs) Collect(ch chan<- prometheus.Metric) {
	for _, x := range g {
		ch <- prometheus.MustNewConstMetric(x.desc, x.typ, x.get())
	}
}
