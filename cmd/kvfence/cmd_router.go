package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/router"
	"github.com/kvfence/kvfence/internal/router/api"
	"github.com/kvfence/kvfence/internal/router/tenants"
	"github.com/kvfence/kvfence/internal/tokenizer"
	"github.com/kvfence/kvfence/internal/workerapi"
)

// routerOptions are the flags of `kvfence router`.
type routerOptions struct {
	model             string
	host              string
	port              int
	prefill, decode   urlList
	apiKeys           string
	servedName        string
	abortPolicy       router.AbortPolicy
	shutdownTimeout   time.Duration
	clusterSecretFile string
	maxConcurrent     int
}

// urlList is a repeatable flag of worker URLs.
type urlList []string

func (u *urlList) String() string { return strings.Join(*u, ",") }

func (u *urlList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimRight(strings.TrimSpace(p), "/")
		if p == "" {
			continue
		}
		if !strings.HasPrefix(p, "http://") && !strings.HasPrefix(p, "https://") {
			p = "http://" + p
		}
		*u = append(*u, p)
	}
	return nil
}

func parseRouterFlags(args []string) (*routerOptions, error) {
	o := &routerOptions{}
	fs := flag.NewFlagSet("kvfence router", flag.ContinueOnError)
	fs.StringVar(&o.model, "model", "", "the GGUF model file the workers serve; the router reads only its tokenizer (it tokenizes to admit by token count). Empty: the cached demo model, as the workers use without --model")
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on for the OpenAI API (0.0.0.0 for every interface)")
	fs.IntVar(&o.port, "port", 8080, "port of the OpenAI API; 0 picks a free port (logged)")
	fs.Var(&o.prefill, "prefill", "`URL` of a prefill worker's internal API, e.g. http://10.0.0.5:8100 (repeat the flag, or separate with commas, for several)")
	fs.Var(&o.decode, "decode", "`URL` of a decode worker's internal API, e.g. http://10.0.0.6:8200 (repeatable)")
	fs.StringVar(&o.apiKeys, "api-keys", "", "file of API keys, one 'KEY TENANT [MAX_CONCURRENT]' per line; empty: no authentication, every request is tenant 'default' (logged as a warning)")
	fs.StringVar(&o.servedName, "served-model-name", "", "the model name clients send as \"model\"; empty means the model file's general.name")
	policy := fs.String("abort-policy", "first-token", "what a client that disconnects does to its request: first-token (let it reach its first token, then abort: disconnects never interrupt a KV transfer) or immediate")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM or interrupt: how long requests in flight may run before they are aborted")
	fs.StringVar(&o.clusterSecretFile, "cluster-secret-file", "", "file holding the cluster secret (>= 16 bytes) shared with every worker: it signs rooms and authenticates the internal API. Empty: $KVFENCE_CLUSTER_SECRET; without either the router refuses to start")
	fs.IntVar(&o.maxConcurrent, "max-concurrent-per-tenant", 0, "requests in flight per tenant whose key line gives no limit (and for 'default' without --api-keys); 0 means unlimited")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvfence router --prefill URL [--prefill URL ...] --decode URL [--decode URL ...] [flags]\n\n"+
			"Runs the front door of a disaggregated deployment: the OpenAI API (POST /v1/chat/completions,\n"+
			"POST /v1/completions, GET /v1/models, /healthz, /readyz, /metrics), API keys and tenants,\n"+
			"admission by token count, pairing of prefill and decode workers by load, and the abort\n"+
			"policy. Workers are started with `kvfence prefill` and `kvfence decode` and the same cluster\n"+
			"secret. SIGTERM or interrupt shuts down gracefully.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	p, err := router.ParseAbortPolicy(*policy)
	if err != nil {
		return nil, err
	}
	o.abortPolicy = p
	switch {
	case len(o.prefill) == 0 || len(o.decode) == 0:
		return nil, errors.New("give at least one --prefill URL and one --decode URL")
	case o.port < 0 || o.port > 65535:
		return nil, fmt.Errorf("--port %d out of range", o.port)
	case o.shutdownTimeout < 0:
		return nil, errors.New("--shutdown-timeout must not be negative")
	case o.maxConcurrent < 0:
		return nil, errors.New("--max-concurrent-per-tenant must not be negative")
	}
	return o, nil
}

// routerTokenizer reads only the tokenizer of a GGUF file.
func routerTokenizer(path string) (*tokenizer.Tokenizer, string, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	c, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	name, _ := f.String("general.name")
	tok, err := tokenizer.New(c)
	return tok, name, err
}

func runRouter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseRouterFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("role", "router")
	secret, auth, err := requiredClusterSecret(o.clusterSecretFile)
	if err != nil {
		return err
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
	path, err := modelPath(o.model, log)
	if err != nil {
		return err
	}
	tok, fileModel, err := routerTokenizer(path)
	if err != nil {
		return err
	}
	ln, err := listen(o.host, o.port)
	if err != nil {
		return err
	}
	defer ln.Close()

	decs := make([]engine.Decoder, len(o.decode))
	for i, u := range o.decode {
		c, err := workerapi.NewClient(workerapi.ClientConfig{URL: u, Secret: secret, Logger: log})
		if err != nil {
			return fmt.Errorf("--decode: %w", err)
		}
		decs[i] = c
	}
	pres := make([]engine.Prefiller, len(o.prefill))
	for i, u := range o.prefill {
		c, err := workerapi.NewClient(workerapi.ClientConfig{URL: u, Secret: secret, Logger: log})
		if err != nil {
			return fmt.Errorf("--prefill: %w", err)
		}
		pres[i] = c
	}
	logWorkers(log, o, decs, pres, fileModel)

	name := o.servedName
	if name == "" {
		name = fileModel
	}
	rt, err := router.New(router.Config{
		Tokenizer: tok, Auth: auth, Decoders: decs, Prefillers: pres,
		ModelName: name, AbortPolicy: o.abortPolicy, Log: log,
	})
	if err != nil {
		return err
	}
	reg := newRegistry(workersAvailable(decs, pres))
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	go watchWorkers(wctx, log, o, decs, pres, 100*time.Millisecond)
	h := api.NewHandler(api.Config{DefaultMaxConcurrent: o.maxConcurrent, Ready: rt.Ready}, rt, keys, reg, log)
	log.Info("router started", "model", rt.Models()[0].ID, "context_window", rt.Models()[0].ContextLength,
		"prefill_workers", len(pres), "decode_workers", len(decs), "abort_policy", o.abortPolicy.String())

	return serveAPI(ctx, ln, h, rt, o.shutdownTimeout, 5*time.Second, log)
}

// logWorkers logs what each worker reports (a worker that is down is
// logged and used once it answers), and warns about a worker serving
// another model than the router's file.
func logWorkers(log *slog.Logger, o *routerOptions, decs []engine.Decoder, pres []engine.Prefiller, model string) {
	show := func(u string, in engine.WorkerInfo) {
		if in.ContextWindow == 0 {
			log.Warn("worker not reachable yet; it is used once it answers", "url", u)
			return
		}
		if in.Model != model {
			log.Warn("worker serves another model than --model: its tokens would not match", "url", u, "worker_model", in.Model, "model", model)
		}
		log.Info("worker", "url", u, "role", in.Role, "model", in.Model, "context_window", in.ContextWindow,
			"pool_pages", in.PoolPages, "pool_tokens", in.PoolTokens, "page_size", in.PageSize, "transfer_addr", in.TransferAddr)
	}
	for i, d := range decs {
		show(o.decode[i], d.Info())
	}
	for i, p := range pres {
		show(o.prefill[i], p.Info())
	}
}

// usableWorker is what the router's pairing requires of a worker.
func usableWorker(in engine.WorkerInfo) bool { return in.ContextWindow > 0 && !in.Draining }

// watchWorkers asks every worker for its info every period, so that the
// router's view of a worker that died or came back is never much older
// than that (the clients refresh their cached info when asked), and logs
// each change of a worker's availability.
func watchWorkers(ctx context.Context, log *slog.Logger, o *routerOptions, decs []engine.Decoder, pres []engine.Prefiller, period time.Duration) {
	type w struct {
		url, role string
		info      func() engine.WorkerInfo
		up        bool
	}
	var ws []*w
	for i, d := range decs {
		ws = append(ws, &w{url: o.decode[i], role: "decode", info: d.Info, up: usableWorker(d.Info())})
	}
	for i, p := range pres {
		ws = append(ws, &w{url: o.prefill[i], role: "prefill", info: p.Info, up: usableWorker(p.Info())})
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, x := range ws {
			up := usableWorker(x.info())
			switch {
			case up && !x.up:
				log.Info("worker available", "url", x.url, "worker_role", x.role)
			case !up && x.up:
				log.Warn("worker unavailable (unreachable or draining): no new requests go to it", "url", x.url, "worker_role", x.role)
			}
			x.up = up
		}
	}
}

// workersAvailable exports how many workers of each role take new work.
func workersAvailable(decs []engine.Decoder, pres []engine.Prefiller) prometheus.Collector {
	count := func(infos func() []engine.WorkerInfo) func() float64 {
		return func() float64 {
			n := 0
			for _, in := range infos() {
				if usableWorker(in) {
					n++
				}
			}
			return float64(n)
		}
	}
	decInfos := func() []engine.WorkerInfo {
		out := make([]engine.WorkerInfo, len(decs))
		for i, d := range decs {
			out[i] = d.Info()
		}
		return out
	}
	preInfos := func() []engine.WorkerInfo {
		out := make([]engine.WorkerInfo, len(pres))
		for i, p := range pres {
			out[i] = p.Info()
		}
		return out
	}
	desc := func(role string) *prometheus.Desc {
		return prometheus.NewDesc("kvfence_router_workers_available", "Workers the router pairs new requests with (reachable, not draining), by role.",
			nil, prometheus.Labels{"role": role})
	}
	return gaugeFuncs{
		{desc("decode"), prometheus.GaugeValue, count(decInfos)},
		{desc("prefill"), prometheus.GaugeValue, count(preInfos)},
	}
}
