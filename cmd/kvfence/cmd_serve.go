package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/metrics"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router"
	"github.com/kvfence/kvfence/internal/router/api"
	"github.com/kvfence/kvfence/internal/router/tenants"
	"github.com/kvfence/kvfence/internal/tokenizer"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/inproc"
)

// serveOptions are the flags of `kvfence serve`.
type serveOptions struct {
	model              string
	host               string
	port               int
	contextLength      int
	pageSize           int
	kvCacheMemory      int64
	maxRunning         int
	chunkedPrefill     int
	threads            int
	apiKeys            string
	servedName         string
	abortPolicy        router.AbortPolicy
	shutdownTimeout    time.Duration
	clusterSecretFile  string
	lowerContextToFit  bool
	maxConcurrent      int
	protections        transfer.Protections
	unsafeFlagsChanged []string // the --unsafe-... flags given, for the warning
}

// byteSize is a flag holding a memory size: "512MiB", "2GiB", "1G",
// "1048576".
type byteSize int64

func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || v*float64(mult) > 1<<50 {
		return 0, fmt.Errorf("bad size %q (want e.g. 512MiB, 2GiB or a byte count)", s)
	}
	return int64(v * float64(mult)), nil
}

// unsafeFlags are the --unsafe-... flags, one per transfer.Protections
// field: each switches one isolation protection off, for tests that show
// the failure it prevents is real.
var unsafeFlags = []struct {
	name, help string
	field      func(p *transfer.Protections) *bool
}{
	{"unsafe-no-fence-check", "UNSAFE, testing only: do not compare page fences with the expected (room, epoch) on transfer or on reads", func(p *transfer.Protections) *bool { return &p.NoFenceCheck }},
	{"unsafe-no-window-revocation", "UNSAFE, testing only: never revoke a transfer window, so writes posted before an abort can land after the pages were reused", func(p *transfer.Protections) *bool { return &p.NoWindowRevocation }},
	{"unsafe-no-deferred-release", "UNSAFE, testing only: free an aborted request's pages at once instead of waiting for the prefill side to drain", func(p *transfer.Protections) *bool { return &p.NoDeferredRelease }},
	{"unsafe-no-tombstones", "UNSAFE, testing only: the prefill side forgets aborted rooms, so a late grant still gets written", func(p *transfer.Protections) *bool { return &p.NoTombstones }},
	{"unsafe-no-checksum", "UNSAFE, testing only: do not verify page checksums after a transfer", func(p *transfer.Protections) *bool { return &p.NoChecksum }},
	{"unsafe-no-page-count-agreement", "UNSAFE, testing only: do not compare the granted page count and prompt length with what was written", func(p *transfer.Protections) *bool { return &p.NoPageCountAgreement }},
	{"unsafe-no-admission-before-reservation", "UNSAFE, testing only: reserve pages for a request that must be rejected and let a placeholder flow through (\"rejected but alive\")", func(p *transfer.Protections) *bool { return &p.NoAdmissionBeforeReservation }},
}

func parseServeFlags(args []string) (*serveOptions, error) {
	o := &serveOptions{}
	fs := flag.NewFlagSet("kvfence serve", flag.ContinueOnError)
	fs.StringVar(&o.model, "model", "", "GGUF model file (llama, qwen2 or qwen3). Empty: build and cache a small qwen3 demo model with RANDOM weights and the real Qwen3 tokenizer (answers are gibberish; for trying the API)")
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on for the OpenAI API (0.0.0.0 for every interface)")
	fs.IntVar(&o.port, "port", 8080, "port of the OpenAI API")
	fs.IntVar(&o.contextLength, "context-length", 0, "context window in tokens (prompt + max_tokens); 0 means the model's own. The KV pool must hold it (see --lower-context-to-fit)")
	fs.IntVar(&o.pageSize, "page-size", 16, "tokens per KV page")
	kv := byteSize(256 << 20)
	fs.Var(&kv, "kv-cache-memory", "memory for the KV page pool of EACH worker (prefill and decode), e.g. 512MiB or 4GiB")
	fs.IntVar(&o.maxRunning, "max-running-requests", 64, "most sequences the decode worker runs at once (more wait in a queue, fairly across tenants)")
	fs.IntVar(&o.chunkedPrefill, "chunked-prefill-size", 512, "most prompt tokens the prefill worker computes in one forward call")
	fs.IntVar(&o.threads, "threads", 0, "threads of each worker's forward pass; 0 means the number of CPUs")
	fs.StringVar(&o.apiKeys, "api-keys", "", "file of API keys, one 'KEY TENANT [MAX_CONCURRENT]' per line; empty: no authentication, every request is tenant 'default' (logged as a warning)")
	fs.StringVar(&o.servedName, "served-model-name", "", "the model name clients send as \"model\"; empty means the model's general.name")
	policy := fs.String("abort-policy", "first-token", "what a client that disconnects does to its request: first-token (let it reach its first token, then abort: disconnects never interrupt a KV transfer) or immediate")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM or interrupt: how long in-flight requests may run before they are aborted")
	fs.StringVar(&o.clusterSecretFile, "cluster-secret-file", "", "file holding the cluster secret (>= 16 bytes) that authenticates rooms and transfer messages; empty: $KVFENCE_CLUSTER_SECRET, else a random secret for this process")
	fs.BoolVar(&o.lowerContextToFit, "lower-context-to-fit", false, "when the KV pool holds fewer tokens than the context window, lower the window to the pool (and say so) instead of refusing to start")
	fs.IntVar(&o.maxConcurrent, "max-concurrent-per-tenant", 0, "requests in flight per tenant whose key line gives no limit (and for 'default' without --api-keys); 0 means unlimited")
	unsafe := make([]*bool, len(unsafeFlags))
	for i, u := range unsafeFlags {
		unsafe[i] = fs.Bool(u.name, false, u.help)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvfence serve [flags]\n\n"+
			"Runs the router, one prefill worker and one decode worker in one process (the KV transfer\n"+
			"between them goes through the in-process transport) and serves the OpenAI API:\n"+
			"POST /v1/chat/completions, POST /v1/completions, GET /v1/models, /healthz, /readyz, /metrics.\n"+
			"SIGTERM or interrupt shuts down gracefully.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	o.kvCacheMemory = int64(kv)
	p, err := router.ParseAbortPolicy(*policy)
	if err != nil {
		return nil, err
	}
	o.abortPolicy = p
	for i, u := range unsafeFlags {
		if *unsafe[i] {
			*u.field(&o.protections) = true
			o.unsafeFlagsChanged = append(o.unsafeFlagsChanged, "--"+u.name)
		}
	}
	switch {
	case o.port < 0 || o.port > 65535:
		return nil, fmt.Errorf("--port %d out of range", o.port)
	case o.pageSize < 1:
		return nil, fmt.Errorf("--page-size must be positive")
	case o.contextLength < 0 || o.maxRunning < 1 || o.chunkedPrefill < 1 || o.threads < 0:
		return nil, fmt.Errorf("--context-length, --max-running-requests, --chunked-prefill-size and --threads must not be negative (and the middle two positive)")
	case o.shutdownTimeout < 0:
		return nil, fmt.Errorf("--shutdown-timeout must not be negative")
	}
	return o, nil
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	addr := net.JoinHostPort(o.host, strconv.Itoa(o.port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return serve(ctx, o, ln, log)
}

// demoModel is the model `kvfence serve` runs without --model: small enough
// to build in seconds and answer fast on a laptop, with the real Qwen3
// tokenizer so that the chat template and the text are real, and random
// weights so that no download is needed.
func demoModel() (modelbuild.Options, error) {
	tc, err := tokenizer.BundledQwen3()
	if err != nil {
		return modelbuild.Options{}, err
	}
	return modelbuild.Options{
		Arch: "qwen3", Layers: 4, Dim: 256, Heads: 4, KVHeads: 2, HeadDim: 64, FF: 768, Ctx: 4096,
		Type: gguf.TypeQ8_0, Seed: 1, Tokenizer: tc, Name: "kvfence-demo-qwen3-random",
	}, nil
}

func cacheDir() (string, error) {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "kvfence"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory ($XDG_CACHE_HOME and $HOME unset): give --model: %w", err)
	}
	return filepath.Join(home, ".cache", "kvfence"), nil
}

// clusterSecret reads the secret from the file, else from
// $KVFENCE_CLUSTER_SECRET, else makes a random one: in one process nobody
// else needs to know it.
func clusterSecret(file string, log *slog.Logger) ([]byte, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		return []byte(strings.TrimSpace(string(b))), nil
	}
	if s := os.Getenv("KVFENCE_CLUSTER_SECRET"); s != "" {
		return []byte(s), nil
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	log.Info("using a random cluster secret for this process (no --cluster-secret-file or $KVFENCE_CLUSTER_SECRET)")
	return b, nil
}

// serve runs everything on ln until ctx ends, then shuts down gracefully and
// returns nil. It closes ln.
func serve(ctx context.Context, o *serveOptions, ln net.Listener, log *slog.Logger) (err error) {
	defer ln.Close()
	for _, f := range o.unsafeFlagsChanged {
		log.Warn("UNSAFE: an isolation protection is switched off; tenants may read each other's data. Never use this outside tests.", "flag", f)
	}
	if len(o.unsafeFlagsChanged) > 0 {
		log.Warn("UNSAFE protections in effect", "protections", o.protections.String())
	}

	path := o.model
	if path == "" {
		opts, err := demoModel()
		if err != nil {
			return err
		}
		dir, err := cacheDir()
		if err != nil {
			return err
		}
		log.Info("no --model: building (once) and caching a small demo model", "dir", dir)
		path, err = modelbuild.Cached(opts, dir)
		if err != nil {
			return fmt.Errorf("building the demo model: %w", err)
		}
		log.Warn("the demo model's weights are RANDOM: it speaks the real Qwen3 tokenizer's vocabulary but its answers are gibberish. Run a real model with --model FILE.gguf (llama, qwen2 or qwen3 GGUF, e.g. from Hugging Face)", "model", path)
	}

	secret, err := clusterSecret(o.clusterSecretFile, log)
	if err != nil {
		return err
	}
	auth, err := transfer.NewAuth(secret)
	if err != nil {
		return fmt.Errorf("cluster secret: %w", err)
	}

	var keys *tenants.Keys
	if o.apiKeys != "" {
		keys, err = tenants.LoadKeys(o.apiKeys)
		if err != nil {
			return err
		}
		log.Info("API keys loaded", "keys", keys.Len(), "tenants", keys.Tenants())
	} else {
		log.Warn("no --api-keys: the API is open to anyone who can reach it; every request is tenant \"default\"")
	}

	w, err := startWorkers(o, path, auth, log)
	if err != nil {
		return err
	}
	defer func() {
		// After the router: drain the transfers, then stop the workers.
		cctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout+time.Second)
		defer cancel()
		w.close(cctx, log)
	}()

	rt, err := router.New(router.Config{
		Tokenizer:   w.tok,
		Auth:        auth,
		Decoders:    w.decoders,
		Prefillers:  w.prefillers,
		ModelName:   o.servedName,
		AbortPolicy: o.abortPolicy,
		Log:         log,
	})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(w.collector())
	h := api.NewHandler(api.Config{DefaultMaxConcurrent: o.maxConcurrent, Ready: rt.Ready}, rt, keys, reg, log)
	log.Info("router started", "model", rt.Models()[0].ID, "abort_policy", o.abortPolicy.String())
	// w.close (deferred) then drains the transfers and stops the workers.
	return serveAPI(ctx, ln, h, rt, o.shutdownTimeout, time.Second, log)
}

// serveAPI serves the OpenAI API on ln until ctx ends, then shuts down
// gracefully: no new requests, requests in flight get timeout to finish
// (then their connections are cut, which aborts their generations), and the
// router gets routerTimeout to see its generations end. The last startup
// line it logs is the URL.
func serveAPI(ctx context.Context, ln net.Listener, h http.Handler, rt *router.Router, timeout, routerTimeout time.Duration, log *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving the OpenAI API", "url", "http://"+ln.Addr().String()+"/v1")
	select {
	case err := <-served:
		// The listener failed: nothing to drain gracefully beyond the router.
		_ = rt.Shutdown(context.Background())
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: no new requests; waiting for requests in flight", "timeout", timeout.String())
	rt.StopAccepting()
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// In-flight requests outlived the timeout: cut their connections;
		// their streams close and the router aborts their generations.
		log.Warn("shutdown timeout: aborting requests still in flight")
		_ = srv.Close()
	}
	<-served
	rctx, rcancel := context.WithTimeout(context.Background(), routerTimeout)
	defer rcancel()
	if err := rt.Shutdown(rctx); err != nil {
		log.Warn("router: generations aborted at shutdown", "err", err)
	}
	log.Info("shut down")
	return nil
}

// Transfer identities inside the serve process.
const (
	peerRouter  transfer.PeerID = 1
	peerPrefill transfer.PeerID = 2
	peerDecode  transfer.PeerID = 3
)

// workers are the in-process prefill and decode workers of serve, joined by
// an inproc pair.
type workers struct {
	model *model.Model
	tok   *tokenizer.Tokenizer
	dec   *engine.DecodeWorker
	pre   *engine.PrefillWorker
	pair  *inproc.Pair

	decoders   []engine.Decoder
	prefillers []engine.Prefiller
}

// startWorkers loads the model, carves both pools, starts both workers
// (each refuses to start when its pool cannot hold the context window, I6)
// and connects them.
func startWorkers(o *serveOptions, path string, auth *transfer.Auth, log *slog.Logger) (_ *workers, err error) {
	m, err := model.Load(path)
	if err != nil {
		return nil, err
	}
	w := &workers{model: m, tok: m.Tok}
	defer func() {
		if err != nil {
			w.close(context.Background(), log)
		}
	}()
	c := m.Config
	log.Info("model loaded", "file", path, "arch", c.Arch, "name", c.Name, "layers", c.Layers, "dim", c.Dim,
		"heads", c.Heads, "kv_heads", c.KVHeads, "vocab", c.Vocab, "context_length", c.ContextLength)
	shape := engine.PoolShape(m, o.pageSize)
	newPool := func() (*kvpool.Pool, error) {
		return kvpool.New(kvpool.Config{Shape: shape, Budget: o.kvCacheMemory})
	}
	dpool, err := newPool()
	if err != nil {
		return nil, fmt.Errorf("decode pool: %w", err)
	}
	ppool, err := newPool()
	if err != nil {
		return nil, fmt.Errorf("prefill pool: %w", err)
	}
	var kb [8]byte
	_, _ = rand.Read(kb[:])
	w.dec, err = engine.NewDecodeWorker(engine.DecodeConfig{
		Model: m, Pool: dpool, Auth: auth, Self: peerDecode, Router: peerRouter,
		ContextWindow: o.contextLength, LowerWindow: o.lowerContextToFit,
		MaxRunning: o.maxRunning, Threads: o.threads, Protections: o.protections,
		KeyBase: binary.LittleEndian.Uint64(kb[:]), Log: log.With("role", "decode"),
	})
	if err != nil {
		return nil, fmt.Errorf("decode worker: %w%s", err, poolHint(err))
	}
	w.pre, err = engine.NewPrefillWorker(engine.PrefillConfig{
		Model: m, Pool: ppool, Auth: auth, Self: peerPrefill, Router: peerRouter,
		ContextWindow: o.contextLength, LowerWindow: o.lowerContextToFit,
		ChunkSize: o.chunkedPrefill, Threads: o.threads, Protections: o.protections,
		Log: log.With("role", "prefill"),
	})
	if err != nil {
		return nil, fmt.Errorf("prefill worker: %w%s", err, poolHint(err))
	}
	for _, n := range []struct {
		role string
		note string
		in   engine.WorkerInfo
	}{{"prefill", w.pre.Note(), w.pre.Info()}, {"decode", w.dec.Note(), w.dec.Info()}} {
		if n.note != "" {
			log.Warn(n.note, "role", n.role)
		}
		log.Info("KV pool", "role", n.role, "pages", n.in.PoolPages, "page_size", n.in.PageSize,
			"pool_tokens", n.in.PoolTokens, "context_window", n.in.ContextWindow,
			"page_bytes", shape.PageBytes(), "memory_bytes", int64(n.in.PoolPages)*int64(shape.PageBytes()))
	}
	w.pair = inproc.New(inproc.Config{Auth: auth},
		inproc.Side{ID: peerPrefill, Sink: w.pre}, inproc.Side{ID: peerDecode, Sink: w.dec}, w.dec.Receiver())
	w.pre.AddLink(w.pair.Prefill())
	w.dec.AddLink(w.pair.Decode())
	w.decoders = []engine.Decoder{w.dec}
	w.prefillers = []engine.Prefiller{w.pre}
	return w, nil
}

// poolHint names the flags that resolve an I6 refusal.
func poolHint(err error) string {
	if errors.Is(err, kvpool.ErrPoolTooSmall) {
		return " (flags: --kv-cache-memory, --context-length, or --lower-context-to-fit to lower the window to the pool)"
	}
	return ""
}

// close stops the workers (bounded by ctx: aborted transfers drain or the
// deadline passes), then the link and the model.
func (w *workers) close(ctx context.Context, log *slog.Logger) {
	if w.dec != nil {
		if err := w.dec.Close(ctx); err != nil {
			log.Warn("decode worker: shutdown cut short", "err", err)
		}
	}
	if w.pre != nil {
		if err := w.pre.Close(ctx); err != nil {
			log.Warn("prefill worker: shutdown cut short", "err", err)
		}
	}
	if w.pair != nil {
		_ = w.pair.Prefill().Close()
	}
	_ = w.model.Close()
}

// collector exports both workers' pool and protocol statistics.
func (w *workers) collector() prometheus.Collector {
	rejected := func(counts []uint64) map[string]uint64 {
		m := map[string]uint64{}
		for k, n := range counts {
			if n > 0 {
				m[reqerr.Kind(k).String()] = n
			}
		}
		return m
	}
	return metrics.NewCollector(
		func() metrics.WorkerStats {
			s := w.dec.Stats()
			return metrics.WorkerStats{
				Role: "decode", Pool: s.Pool, PageSize: w.dec.Info().PageSize, ContextWindow: s.ContextWindow,
				DeferredDrained: s.DeferredDrained, DeferredTimeout: s.DeferredTimeout,
				IntegrityFailures: s.IntegrityFailures, Rejected: rejected(s.Rejected[:]),
			}
		},
		func() metrics.WorkerStats {
			s := w.pre.Stats()
			return metrics.WorkerStats{
				Role: "prefill", Pool: s.Pool, PageSize: w.pre.Info().PageSize, ContextWindow: s.ContextWindow,
			}
		},
	)
}
