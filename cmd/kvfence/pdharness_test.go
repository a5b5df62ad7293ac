//go:build unix

package main

// The harness of the multi-process tests: the kvfence binary built once per
// test process, test models built once, worker and router processes in
// their own process groups (killed in t.Cleanup), and readers of their logs
// and metrics.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/gguf"
	"github.com/kvfence/kvfence/internal/modelbuild"
	"github.com/kvfence/kvfence/internal/tokenizer"
)

// pdSecret is the cluster secret of the test deployments.
const pdSecret = "pd-test-cluster-secret-0123456789"

var pdDir struct {
	once sync.Once
	dir  string
	err  error
}

// pdTempDir is a directory that lives as long as the test process (removed
// by TestMain): the binary and the models are built once into it.
func pdTempDir(t *testing.T) string {
	pdDir.once.Do(func() { pdDir.dir, pdDir.err = os.MkdirTemp("", "kvfence-pd-test") })
	if pdDir.err != nil {
		t.Fatal(pdDir.err)
	}
	return pdDir.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pdDir.dir != "" {
		os.RemoveAll(pdDir.dir)
	}
	os.Exit(code)
}

var pdBin struct {
	once sync.Once
	path string
	err  error
}

// kvfenceBinary builds the kvfence binary (without -race: the processes
// are the system under test, the race detector runs on the test itself).
func kvfenceBinary(t *testing.T) string {
	dir := pdTempDir(t)
	pdBin.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
			if _, serr := os.Stat(goTool); serr != nil {
				goTool = "/usr/local/go/bin/go"
			}
		}
		path := filepath.Join(dir, "kvfence")
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool, "build", "-o", path, ".")
		out, err := cmd.CombinedOutput()
		if err != nil {
			pdBin.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		pdBin.path = path
	})
	if pdBin.err != nil {
		t.Fatal(pdBin.err)
	}
	return pdBin.path
}

// Test models: tiny answers fast; slow makes a long prompt's prefill last
// long enough (about a second) to kill its worker in the middle.
var pdModels = map[string]modelbuild.Options{
	"tiny": {Arch: "qwen3", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, FF: 128, Ctx: 256,
		Type: gguf.TypeQ8_0, Seed: 21, Name: "pd-tiny"},
	"slow": {Arch: "qwen3", Layers: 4, Dim: 256, Heads: 4, KVHeads: 2, HeadDim: 64, FF: 768, Ctx: 2048,
		Type: gguf.TypeQ8_0, Seed: 22, Name: "pd-slow"},
}

var pdModelFiles sync.Map // name -> *modelFile

type modelFile struct {
	once sync.Once
	path string
	err  error
}

func pdModel(t *testing.T, name string) string {
	dir := pdTempDir(t)
	v, _ := pdModelFiles.LoadOrStore(name, &modelFile{})
	mf := v.(*modelFile)
	mf.once.Do(func() {
		o := pdModels[name]
		o.Tokenizer = tokenizer.Tiny()
		mf.path = filepath.Join(dir, name+".gguf")
		mf.err = modelbuild.Write(o, mf.path)
	})
	if mf.err != nil {
		t.Fatal(mf.err)
	}
	return mf.path
}

// proc is one kvfence process of a test, in its own process group.
type proc struct {
	name   string
	cmd    *exec.Cmd
	urlc   chan string
	exited chan struct{}
	err    error // cmd.Wait's, valid once exited is closed

	mu  sync.Mutex // guards log and url
	log bytes.Buffer
	url string
}

var urlLine = regexp.MustCompile(`msg="?serving.*? url=(http://\S+)`)

// startProc starts `kvfence args...` with the cluster secret in its
// environment (unless env overrides it). The process is killed (its whole
// group) when the test ends; a failed test shows its log.
func startProc(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, urlc: make(chan string, 1), exited: make(chan struct{})}
	p.cmd = exec.Command(kvfenceBinary(t), args...)
	p.cmd.Env = append(append(os.Environ(), "KVFENCE_CLUSTER_SECRET="+pdSecret), env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(p.cmd.SysProcAttr)
	p.cmd.Stdout = io.Discard
	p.cmd.Stderr = &lineWriter{line: p.addLine}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- log of %s (%v):\n%s", p.name, p.err, p.logText())
		}
	})
	return p
}

func (p *proc) addLine(line string) {
	p.mu.Lock()
	p.log.WriteString(line)
	p.log.WriteByte('\n')
	first := p.url == ""
	m := urlLine.FindStringSubmatch(line)
	if m != nil && first {
		p.url = strings.TrimSuffix(m[1], "/v1")
	}
	p.mu.Unlock()
	if m != nil && first {
		p.urlc <- strings.TrimSuffix(m[1], "/v1")
	}
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// waitURL waits for the log line with the URL the process serves.
func (p *proc) waitURL(t *testing.T) string {
	t.Helper()
	select {
	case u := <-p.urlc:
		p.urlc <- u // later callers get it too
		return u
	case <-p.exited:
		t.Fatalf("%s exited before serving: %v\n%s", p.name, p.err, p.logText())
	case <-time.After(90 * time.Second):
		t.Fatalf("%s did not start serving within 90s:\n%s", p.name, p.logText())
	}
	return ""
}

// kill ends the process group at once and waits for the process.
func (p *proc) kill() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.exited
}

// terminate sends SIGTERM and returns the exit code, failing the test if
// the process does not exit within d.
func (p *proc) terminate(t *testing.T, d time.Duration) int {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("%s did not exit within %v of SIGTERM:\n%s", p.name, d, p.logText())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("%s: %v", p.name, p.err)
	}
	return 0
}

// lineWriter calls line for every complete line written.
type lineWriter struct {
	buf  []byte
	line func(string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(b), nil
}

// pdCluster is a deployment of one router, one decode worker and some
// prefill workers on loopback.
type pdCluster struct {
	router   *proc
	decode   *proc
	prefills []*proc
	base     string // the router's URL, without /v1
	model    string // the pdModels name
}

type pdConfig struct {
	model     string   // a pdModels name
	prefills  int      // prefill workers
	worker    []string // extra flags of every worker
	decodeArg []string // extra flags of the decode worker
	prefilArg []string // extra flags of the prefill workers
	routerArg []string // extra flags of the router
}

func startPD(t *testing.T, c pdConfig) *pdCluster {
	t.Helper()
	path := pdModel(t, c.model)
	common := append([]string{"--model", path, "--host", "127.0.0.1", "--port", "0", "--threads", "1"}, c.worker...)
	pc := &pdCluster{model: c.model}
	pc.decode = startProc(t, "decode", nil, append(append([]string{"decode"}, common...), c.decodeArg...)...)
	for i := range c.prefills {
		pc.prefills = append(pc.prefills, startProc(t, fmt.Sprintf("prefill%d", i), nil, append(append([]string{"prefill"}, common...), c.prefilArg...)...))
	}
	rargs := []string{"router", "--model", path, "--host", "127.0.0.1", "--port", "0", "--decode", pc.decode.waitURL(t)}
	for _, p := range pc.prefills {
		rargs = append(rargs, "--prefill", p.waitURL(t))
	}
	pc.router = startProc(t, "router", nil, append(rargs, c.routerArg...)...)
	pc.base = pc.router.waitURL(t)
	return pc
}

// metric sums the samples of name whose labels include every k="v" of
// labels, from url's /metrics.
func metric(t *testing.T, ctx context.Context, url, name string, labels ...string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("metrics of %s: %v", url, err)
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if !strings.Contains(line, labels[i]+`="`+labels[i+1]+`"`) {
				continue lines
			}
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		t.Fatalf("no metric %s%v at %s", name, labels, url)
	}
	return sum
}

// poolPages returns the decode pool's pages by state.
func poolPages(t *testing.T, ctx context.Context, url string) map[string]float64 {
	t.Helper()
	m := map[string]float64{}
	for _, s := range []string{"free", "allocated", "deferred", "quarantined"} {
		m[s] = metric(t, ctx, url, "kvfence_kv_pool_pages", "role", "decode", "state", s)
	}
	return m
}

// waitPoolAtRest waits up to d until the decode pool holds no page
// (allocated, deferred and quarantined all 0) and fails the test with the
// last reading otherwise.
func waitPoolAtRest(t *testing.T, ctx context.Context, url string, d time.Duration) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		m := poolPages(t, ctx, url)
		if m["allocated"] == 0 && m["deferred"] == 0 && m["quarantined"] == 0 && m["free"] > 0 {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("decode pool not at rest after %v: %v", d, m)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMetric waits up to d until the metric equals want.
func waitMetric(t *testing.T, ctx context.Context, url string, d time.Duration, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		v := metric(t, ctx, url, name, labels...)
		if v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v is %v after %v, want %v", name, labels, v, d, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
