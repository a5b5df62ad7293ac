package workerapi

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/model"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/tokenizer"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
	"github.com/kvfence/kvfence/internal/transfer/tcp"
)

// byteTokenizer is a byte-level vocabulary (GPT-2's byte-to-rune mapping)
// with one control token that ends generation.
func byteTokenizer() tokenizer.Config {
	var toks []string
	var types []int32
	extra := 0
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae) {
			r = rune(256 + extra)
			extra++
		}
		toks = append(toks, string(r))
		types = append(types, tokenizer.TypeNormal)
	}
	toks = append(toks, "<|endoftext|>")
	types = append(types, tokenizer.TypeControl)
	eos := int32(len(toks) - 1)
	return tokenizer.Config{Model: "gpt2", Pre: "qwen2", Tokens: toks, Types: types,
		BOS: -1, EOS: eos, EOT: eos, PAD: -1, UNK: -1}
}

var (
	tinyOnce sync.Once
	tinyPath string
	tinyErr  error
	tinyDir  string
)

func tinyModel(t *testing.T) *model.Model {
	t.Helper()
	tinyOnce.Do(func() {
		tinyDir, tinyErr = mkTemp()
		if tinyErr != nil {
			return
		}
		tinyPath = filepath.Join(tinyDir, "tiny.gguf")
		tinyErr = modelbuild.Write(modelbuild.Options{
			Arch: "qwen3", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 96, Ctx: 256,
			Type: gguf.TypeF32, Seed: 5, Tokenizer: byteTokenizer(), Name: "tiny-qwen3",
		}, tinyPath)
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	m, err := model.Load(tinyPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

const (
	engPrefill transfer.PeerID = 1
	engDecode  transfer.PeerID = 2
)

// cluster is a decode and a prefill worker, each behind its HTTP handler,
// joined by a TCP transfer link: the three-process deployment in one test.
type cluster struct {
	auth  *transfer.Auth
	dpool *kvpool.Pool
	dw    *engine.DecodeWorker
	pw    *engine.PrefillWorker
	dec   *Client
	pre   *Client
	taddr string
	ln    *tcp.Listener
	links func() []*tcp.Link // the prefill worker's dialled links
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	m := tinyModel(t)
	auth := mustAuth()
	c := &cluster{auth: auth}
	mk := func(pages int) *kvpool.Pool {
		p, err := kvpool.New(kvpool.Config{Shape: engine.PoolShape(m, 16), Pages: pages})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	c.dpool = mk(64)
	nl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.taddr = nl.Addr().String()
	c.dw, err = engine.NewDecodeWorker(engine.DecodeConfig{Model: m, Pool: c.dpool, Auth: auth, Self: engDecode,
		LowerWindow: true, Threads: 1, TickInterval: time.Millisecond, TransferAddr: c.taddr, KeyBase: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	recv := c.dw.Receiver()
	c.ln, err = tcp.NewListener(tcp.Config{Self: engDecode, Secret: testSecret, Sink: c.dw, Receiver: &recv,
		OnLink: func(l *tcp.Link) { c.dw.AddLink(l) }}, nl)
	if err != nil {
		t.Fatal(err)
	}
	var links []*tcp.Link
	var linksMu sync.Mutex
	c.pw, err = engine.NewPrefillWorker(engine.PrefillConfig{Model: m, Pool: mk(32), Auth: auth, Self: engPrefill,
		LowerWindow: true, ChunkSize: 8, Threads: 1, TickInterval: time.Millisecond,
		Dial: func(ctx context.Context, peer transfer.PeerID, addr string) (link.Link, error) {
			l, err := tcp.Dial(tcp.Config{Self: engPrefill, Secret: testSecret, Sink: c.pw}, peer, addr)
			if err != nil {
				return nil, err
			}
			linksMu.Lock()
			links = append(links, l)
			linksMu.Unlock()
			if err := l.WaitConnected(ctx); err != nil {
				l.Close()
				return nil, err
			}
			return l, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(cfg HandlerConfig) *Client {
		cfg.Secret = testSecret
		h, err := NewHandler(cfg)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		cl, err := NewClient(ClientConfig{URL: srv.URL, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	c.dec = serve(HandlerConfig{Decoder: c.dw})
	c.pre = serve(HandlerConfig{Prefiller: c.pw})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.dw.Close(ctx)
		c.pw.Close(ctx)
		linksMu.Lock()
		for _, l := range links {
			l.Close()
		}
		linksMu.Unlock()
		c.ln.Close()
	})
	c.links = func() []*tcp.Link {
		linksMu.Lock()
		defer linksMu.Unlock()
		return slices.Clone(links)
	}
	return c
}

// run is the router's part for one request: mint a room, sign Open and
// Prefill, call both workers, collect the tokens.
func (c *cluster) run(ctx context.Context, dec engine.Decoder, pre engine.Prefiller, prompt []int32, maxTokens int, addr string) ([]int32, error) {
	var room transfer.RoomID
	rand.Read(room[:])
	open := &transfer.Open{Envelope: transfer.Envelope{Room: room}, Prefill: engPrefill, PromptTokens: uint32(len(prompt)), MaxTokens: uint32(maxTokens)}
	c.auth.Sign(open)
	pm := &transfer.Prefill{Envelope: transfer.Envelope{Room: room}, Decode: engDecode, PromptTokens: uint32(len(prompt)), MaxTokens: uint32(maxTokens)}
	c.auth.Sign(pm)
	s, err := dec.Generate(ctx, &engine.GenerateRequest{Open: open, Tenant: "t", Prompt: prompt, MaxTokens: maxTokens})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	perr := make(chan error, 1)
	go func() {
		perr <- pre.Prefill(ctx, &engine.PrefillRequest{Prefill: pm, Tenant: "t", Prompt: prompt, DecodeAddr: addr})
	}()
	var out []int32
	for {
		ev, err := s.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			<-perr
			return out, err
		}
		out = append(out, ev.ID)
	}
	return out, <-perr
}

// TestEngineOverHTTPAndTCP runs greedy requests through the HTTP adapters
// and the TCP link and checks they produce exactly what the same workers
// produce when called directly, that a too-long prompt comes back as
// *reqerr.ContextLengthError with its numbers, and that no page stays
// allocated afterwards.
func TestEngineOverHTTPAndTCP(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	info := c.dec.Info()
	if info.TransferAddr != c.taddr || info.Role != "decode" || info.ContextWindow != 256 {
		t.Fatalf("decode info %+v", info)
	}
	prompts := [][]int32{{10, 20, 30}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, {200}}
	// The first request makes the prefill worker dial the decode worker's
	// transfer address (PrefillRequest.DecodeAddr).
	for i, p := range prompts {
		viaHTTP, err := c.run(ctx, c.dec, c.pre, p, 6, c.taddr)
		if err != nil {
			t.Fatalf("prompt %d over HTTP: %v", i, err)
		}
		direct, err := c.run(ctx, c.dw, c.pw, p, 6, c.taddr)
		if err != nil {
			t.Fatalf("prompt %d direct: %v", i, err)
		}
		if len(viaHTTP) == 0 || !slices.Equal(viaHTTP, direct) {
			t.Fatalf("prompt %d: HTTP gave %v, direct %v", i, viaHTTP, direct)
		}
	}
	// Too long: the decode worker refuses before reserving anything.
	_, err := c.run(ctx, c.dec, c.pre, make([]int32, 250), 10, c.taddr)
	var cl *reqerr.ContextLengthError
	if !errors.As(err, &cl) || cl.Prompt != 250 || cl.MaxTokens != 10 || cl.Limit != 256 {
		t.Fatalf("too long: %#v", err)
	}
	// The link drops and the prefill worker redials: the next request is
	// served over the new connection.
	ls := c.links()
	if len(ls) != 1 {
		t.Fatalf("prefill worker dialled %d links, want 1", len(ls))
	}
	c.ln.Link(engPrefill).Disconnect()
	for ls[0].Epoch() < 3 {
		if ctx.Err() != nil {
			t.Fatal("no reconnect")
		}
		time.Sleep(time.Millisecond)
	}
	if err := ls[0].WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := c.run(ctx, c.dec, c.pre, prompts[1], 6, c.taddr)
	if err != nil {
		t.Fatalf("after reconnect: %v", err)
	}
	if before, _ := c.run(ctx, c.dw, c.pw, prompts[1], 6, c.taddr); !slices.Equal(after, before) {
		t.Fatalf("after reconnect %v, direct %v", after, before)
	}

	// A router that closes its stream mid-generation (client gone): the
	// pages come back whether the close or the last token ends it (the
	// fake worker's test shows the close reaches the worker's stream).
	var room transfer.RoomID
	rand.Read(room[:])
	prompt := []int32{7, 8, 9}
	open := &transfer.Open{Envelope: transfer.Envelope{Room: room}, Prefill: engPrefill, PromptTokens: 3, MaxTokens: 200}
	c.auth.Sign(open)
	pm := &transfer.Prefill{Envelope: transfer.Envelope{Room: room}, Decode: engDecode, PromptTokens: 3, MaxTokens: 200}
	c.auth.Sign(pm)
	s, err := c.dec.Generate(ctx, &engine.GenerateRequest{Open: open, Tenant: "t", Prompt: prompt, MaxTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.pre.Prefill(ctx, &engine.PrefillRequest{Prefill: pm, Tenant: "t", Prompt: prompt, DecodeAddr: c.taddr}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if c.dpool.Counts().Allocated == 0 {
		t.Fatal("a running sequence holds no pages")
	}
	s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.dpool.Counts().Free != c.dpool.Counts().Total {
		if time.Now().After(deadline) {
			t.Fatalf("pages still held: %+v", c.dpool.Counts())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
