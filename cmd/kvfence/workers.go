package main

// Wiring shared by the multi-process commands (prefill, decode, router):
// the flags every worker takes, the cluster secret they must share, the
// model they load, and a worker's HTTP server with its own metrics.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

// routerPeer is the transfer identity the workers step the router's
// messages (Open, Prefill, Abort) from. Every router shares it: routers
// sign with the cluster secret, they are not told apart by the protocol.
const routerPeer transfer.PeerID = 1

// workerOptions are the flags the prefill and decode commands share, named
// as `kvfence serve` names them.
type workerOptions struct {
	model             string
	host              string
	port              int
	contextLength     int
	pageSize          int
	kvCacheMemory     int64
	threads           int
	shutdownTimeout   time.Duration
	clusterSecretFile string
	lowerContextToFit bool
	peerID            uint
	transferBackend   string
	protections       transfer.Protections
	unsafeGiven       []string

	kv     byteSize
	unsafe []*bool
}

// register adds the shared flags to fs; role is "prefill" or "decode".
func (o *workerOptions) register(fs *flag.FlagSet, role string, defaultPort int) {
	fs.StringVar(&o.model, "model", "", "GGUF model file (llama, qwen2 or qwen3); the router and every worker MUST load the same file. Empty: the cached demo model with RANDOM weights that 'kvfence serve' builds")
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on for the router's internal API (0.0.0.0 for every interface)")
	fs.IntVar(&o.port, "port", defaultPort, "port of the internal API the router calls (/internal/v1/...), also serving /healthz, /readyz and /metrics; 0 picks a free port (logged)")
	fs.IntVar(&o.contextLength, "context-length", 0, "context window in tokens (prompt + max_tokens); 0 means the model's own. The KV pool must hold it (see --lower-context-to-fit)")
	fs.IntVar(&o.pageSize, "page-size", 16, "tokens per KV page; MUST be the same on every prefill and decode worker")
	o.kv = byteSize(256 << 20)
	fs.Var(&o.kv, "kv-cache-memory", "memory for this worker's KV page pool, e.g. 512MiB or 4GiB")
	fs.IntVar(&o.threads, "threads", 0, "threads of the forward pass; 0 means the number of CPUs")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM or interrupt: how long requests in flight may run before they are aborted")
	fs.StringVar(&o.clusterSecretFile, "cluster-secret-file", "", "file holding the cluster secret (>= 16 bytes) shared by the router and every worker: it authenticates internal API calls, rooms and transfer links. Empty: $KVFENCE_CLUSTER_SECRET; without either the worker refuses to start")
	fs.BoolVar(&o.lowerContextToFit, "lower-context-to-fit", false, "when the KV pool holds fewer tokens than the context window, lower the window to the pool (and say so) instead of refusing to start")
	fs.StringVar(&o.transferBackend, "transfer-backend", "tcp", "how KV pages travel between prefill and decode workers: tcp (one connection per prefill-decode pair; rdma is not built yet)")
	fs.UintVar(&o.peerID, "peer-id", 0, "this worker's transfer identity, unique among the workers of a deployment (2..4294967295); 0 picks a random one at start")
	o.unsafe = make([]*bool, len(unsafeFlags))
	for i, u := range unsafeFlags {
		o.unsafe[i] = fs.Bool(u.name, false, u.help)
	}
}

// check validates the parsed flags.
func (o *workerOptions) check() error {
	o.kvCacheMemory = int64(o.kv)
	for i, u := range unsafeFlags {
		if *o.unsafe[i] {
			*u.field(&o.protections) = true
			o.unsafeGiven = append(o.unsafeGiven, "--"+u.name)
		}
	}
	switch {
	case o.port < 0 || o.port > 65535:
		return fmt.Errorf("--port %d out of range", o.port)
	case o.pageSize < 1:
		return errors.New("--page-size must be positive")
	case o.contextLength < 0 || o.threads < 0:
		return errors.New("--context-length and --threads must not be negative")
	case o.shutdownTimeout < 0:
		return errors.New("--shutdown-timeout must not be negative")
	case o.transferBackend != "tcp":
		return fmt.Errorf("--transfer-backend %q: only tcp is built", o.transferBackend)
	case o.peerID == uint(routerPeer) || o.peerID > 1<<32-1:
		return fmt.Errorf("--peer-id %d: want 2..4294967295 (1 is the router's)", o.peerID)
	}
	return nil
}

// peer returns the worker's transfer identity: --peer-id, else random.
func (o *workerOptions) peer() transfer.PeerID {
	if o.peerID != 0 {
		return transfer.PeerID(o.peerID)
	}
	for {
		var b [4]byte
		_, _ = rand.Read(b[:])
		if p := transfer.PeerID(binary.LittleEndian.Uint32(b[:])); p > routerPeer {
			return p
		}
	}
}

// warnUnsafe logs every protection switched off, loudly.
func warnUnsafe(log *slog.Logger, given []string, p transfer.Protections) {
	for _, f := range given {
		log.Warn("UNSAFE: an isolation protection is switched off; tenants may read each other's data. Never use this outside tests.", "flag", f)
	}
	if len(given) > 0 {
		log.Warn("UNSAFE protections in effect", "protections", p.String())
	}
}

// errNoSecret is returned when a multi-process command has no cluster
// secret: unlike serve, its peers must know the same one.
var errNoSecret = errors.New("no cluster secret: give --cluster-secret-file FILE or set $KVFENCE_CLUSTER_SECRET, " +
	"with the same secret (at least 16 bytes) for the router and every worker")

// requiredClusterSecret reads the cluster secret from file, else from
// $KVFENCE_CLUSTER_SECRET, and checks it can sign.
func requiredClusterSecret(file string) ([]byte, *transfer.Auth, error) {
	var secret []byte
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, nil, fmt.Errorf("cluster secret: %w", err)
		}
		secret = []byte(strings.TrimSpace(string(b)))
	case os.Getenv("KVFENCE_CLUSTER_SECRET") != "":
		secret = []byte(os.Getenv("KVFENCE_CLUSTER_SECRET"))
	default:
		return nil, nil, errNoSecret
	}
	auth, err := transfer.NewAuth(secret)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster secret: %w", err)
	}
	return secret, auth, nil
}

// modelPath returns path, or builds (once) and caches the demo model that
// serve runs without --model, so that a PD deployment started without
// --model anywhere agrees on one model.
func modelPath(path string, log *slog.Logger) (string, error) {
	if path != "" {
		return path, nil
	}
	opts, err := demoModel()
	if err != nil {
		return "", err
	}
	dir, err := cacheDir()
	if err != nil {
		return "", err
	}
	log.Info("no --model: using the cached demo model (built once)", "dir", dir)
	p, err := modelbuild.Cached(opts, dir)
	if err != nil {
		return "", fmt.Errorf("building the demo model: %w", err)
	}
	log.Warn("the demo model's weights are RANDOM: its answers are gibberish. Run a real model with --model FILE.gguf on the router and every worker", "model", p)
	return p, nil
}

// loadWorkerModel loads the model and makes a pool for it.
func loadWorkerModel(o *workerOptions, log *slog.Logger) (*model.Model, *kvpool.Pool, error) {
	path, err := modelPath(o.model, log)
	if err != nil {
		return nil, nil, err
	}
	m, err := model.Load(path)
	if err != nil {
		return nil, nil, err
	}
	c := m.Config
	log.Info("model loaded", "file", path, "arch", c.Arch, "name", c.Name, "layers", c.Layers, "dim", c.Dim,
		"heads", c.Heads, "kv_heads", c.KVHeads, "vocab", c.Vocab, "context_length", c.ContextLength)
	shape := kvpool.Shape{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: o.pageSize}
	pool, err := kvpool.New(kvpool.Config{Shape: shape, Budget: o.kvCacheMemory})
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, pool, nil
}

// logPool logs the pool next to the context window (I6).
func logPool(log *slog.Logger, note string, pool *kvpool.Pool, window int) {
	if note != "" {
		log.Warn(note)
	}
	pb := pool.Shape().PageBytes()
	log.Info("KV pool", "pages", pool.Total(), "page_size", pool.PageSize(),
		"pool_tokens", pool.Tokens(), "context_window", window,
		"page_bytes", pb, "memory_bytes", int64(pool.Total())*int64(pb))
}

// rejectedByKind turns per-kind counters into the metrics' reason map.
func rejectedByKind(counts []uint64) map[string]uint64 {
	m := map[string]uint64{}
	for k, n := range counts {
		if n > 0 {
			m[reqerr.Kind(k).String()] = n
		}
	}
	return m
}

// newRegistry is a worker's or router's own Prometheus registry with the
// Go and process collectors.
func newRegistry(cs ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(cs...)
	return reg
}

// workerMux serves the internal API (api) beside /healthz, /readyz (ready
// reports nil when the worker takes work) and /metrics.
func workerMux(api http.Handler, ready func() error, reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/internal/", api)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// listen opens the HTTP listener on host:port.
func listen(host string, port int) (net.Listener, error) {
	return net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
}

// advertised turns a listener's address into one peers can dial: a
// wildcard host becomes this machine's host name.
func advertised(host string, addr net.Addr) string {
	_, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// serveUntil serves h on ln until ctx ends, then runs the graceful
// shutdown: stop (which stops the worker taking work and lets requests in
// flight finish or aborts them, bounded by its context) runs beside the
// HTTP server's Shutdown, which waits for the handlers of those requests;
// past timeout the remaining connections are cut. It returns the
// listener's error if serving failed, else nil.
func serveUntil(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration, log *slog.Logger, stop func(context.Context) error) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving", "url", "http://"+ln.Addr().String())
	var serveErr error
	select {
	case serveErr = <-served:
	case <-ctx.Done():
		log.Info("shutting down: no new requests; waiting for requests in flight", "timeout", timeout.String())
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- stop(sctx) }()
	// The HTTP server gets a little longer than the worker, so that the
	// streams the worker aborts at the deadline still tell the router why.
	hctx, hcancel := context.WithTimeout(context.Background(), timeout+2*time.Second)
	defer hcancel()
	if serveErr == nil {
		if err := srv.Shutdown(hctx); err != nil {
			log.Warn("shutdown timeout: cutting connections still open")
		}
	}
	_ = srv.Close()
	if err := <-stopped; err != nil {
		log.Warn("shutdown cut short: requests were aborted", "err", err)
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}
