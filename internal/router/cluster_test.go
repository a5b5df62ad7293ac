package router

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/tokenizer"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/inproc"
)

const (
	testCtx      = 256 // the tiny model's context length
	testPageSize = 16
	routerPeer   = transfer.PeerID(1)
)

var (
	modelOnce sync.Once
	modelPath string
	modelErr  error
)

// tinyModelPath writes the tiny test model once per test binary.
func tinyModelPath(t testing.TB) string {
	t.Helper()
	modelOnce.Do(func() {
		modelPath = filepath.Join(testDir, "tiny.gguf")
		modelErr = modelbuild.Write(modelbuild.Options{
			Arch: "qwen3", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 96, Ctx: testCtx,
			Type: gguf.TypeQ8_0, Seed: 11, Tokenizer: tokenizer.Tiny(), Name: "tiny",
		}, modelPath)
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return modelPath
}

// cluster is real engine workers joined by inproc pairs (every prefill
// worker to every decode worker), and a Router over them.
type cluster struct {
	t     testing.TB
	m     *model.Model
	auth  *transfer.Auth
	dec   []*engine.DecodeWorker
	pre   []*engine.PrefillWorker
	pairs []*inproc.Pair
	r     *Router
}

type clusterOpts struct {
	decoders, prefillers int
	policy               AbortPolicy
	decodePages          int  // default 64 (1024 tokens)
	noLinks              bool // leave the workers unconnected
}

func newCluster(t testing.TB, o clusterOpts) *cluster {
	t.Helper()
	goroutines := runtime.NumGoroutine()
	if o.decoders == 0 {
		o.decoders, o.prefillers = 1, 1
	}
	if o.decodePages == 0 {
		o.decodePages = 64
	}
	m, err := model.Load(tinyModelPath(t))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := transfer.NewAuth([]byte("router-test-cluster-secret"))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, m: m, auth: auth}
	shape := engine.PoolShape(m, testPageSize)
	for i := range o.decoders {
		pool, err := kvpool.New(kvpool.Config{Shape: shape, Pages: o.decodePages})
		if err != nil {
			t.Fatal(err)
		}
		w, err := engine.NewDecodeWorker(engine.DecodeConfig{
			Model: m, Pool: pool, Auth: auth, Self: transfer.PeerID(100 + i), Router: routerPeer,
			MaxRunning: 8, Threads: 1, KeyBase: uint64(i) << 40,
		})
		if err != nil {
			t.Fatal(err)
		}
		c.dec = append(c.dec, w)
	}
	for i := range o.prefillers {
		pool, err := kvpool.New(kvpool.Config{Shape: shape, Pages: 32})
		if err != nil {
			t.Fatal(err)
		}
		w, err := engine.NewPrefillWorker(engine.PrefillConfig{
			Model: m, Pool: pool, Auth: auth, Self: transfer.PeerID(200 + i), Router: routerPeer,
			ChunkSize: 64, Threads: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		c.pre = append(c.pre, w)
	}
	for _, p := range c.pre {
		for _, d := range c.dec {
			if o.noLinks {
				break
			}
			pair := inproc.New(inproc.Config{Auth: auth},
				inproc.Side{ID: p.Info().Peer, Sink: p}, inproc.Side{ID: d.Info().Peer, Sink: d}, d.Receiver())
			p.AddLink(pair.Prefill())
			d.AddLink(pair.Decode())
			c.pairs = append(c.pairs, pair)
		}
	}
	cfg := Config{Tokenizer: m.Tok, Auth: auth, AbortPolicy: o.policy}
	for _, d := range c.dec {
		cfg.Decoders = append(cfg.Decoders, d)
	}
	for _, p := range c.pre {
		cfg.Prefillers = append(cfg.Prefillers, p)
	}
	c.r, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.r.Shutdown(ctx); err != nil {
			t.Errorf("router shutdown: %v", err)
		}
		// Unconnected workers hold aborted rooms that can never drain:
		// their Close is cut short by design.
		wctx := ctx
		if o.noLinks {
			wctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
		}
		for _, d := range c.dec {
			if err := d.Close(wctx); err != nil && !o.noLinks {
				t.Errorf("decode close: %v", err)
			}
		}
		for _, p := range c.pre {
			if err := p.Close(wctx); err != nil && !o.noLinks {
				t.Errorf("prefill close: %v", err)
			}
		}
		for _, p := range c.pairs {
			p.Prefill().Close()
		}
		m.Close()
		waitGoroutines(t, goroutines)
	})
	return c
}

// waitGoroutines fails the test if goroutines started by it outlive it.
func waitGoroutines(t testing.TB, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Errorf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pools returns every worker's page counts.
func (c *cluster) pools() (dec, pre []kvpool.Counts) {
	for _, d := range c.dec {
		dec = append(dec, d.Stats().Pool.Counts)
	}
	for _, p := range c.pre {
		pre = append(pre, p.Stats().Pool.Counts)
	}
	return dec, pre
}

// waitIdle waits until every pool is back to all pages free (I5 at rest),
// failing the test after a bound.
func (c *cluster) waitIdle() {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	// First the router's streams and their goroutines (a first-token wait
	// may still be running), then the pools.
	for d, p := c.r.InFlight(); d+p > 0; d, p = c.r.InFlight() {
		if time.Now().After(deadline) {
			c.t.Fatalf("router still has %d decode and %d prefill calls in flight", d, p)
		}
		time.Sleep(2 * time.Millisecond)
	}
	for {
		dec, pre := c.pools()
		idle := true
		for _, cs := range append(dec, pre...) {
			if cs.Free != cs.Total {
				idle = false
			}
		}
		// The workers publish their stats just after the pools change:
		// wait for the published view too, so that callers read final
		// counters.
		for _, d := range c.dec {
			if st := d.Stats(); st.Running+st.Queued+st.Active > 0 {
				idle = false
			}
		}
		if idle {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("pools not idle: decode %+v, prefill %+v", dec, pre)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// greedy is the reference every served output must equal (I7): the model
// run alone, no engine, no pool.
func greedy(t testing.TB, m *model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	out, err := m.Greedy(prompt, n, m.Tok.IsEOG)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var testDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-router-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
