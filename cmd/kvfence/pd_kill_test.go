//go:build unix

package main

import (
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestPDPrefillKilled kills a prefill worker (SIGKILL) while it computes
// and transfers prompts: its requests fail with a 5xx error, the decode
// worker holds no page once the link's epoch changes, and new requests go
// to the surviving prefill worker.
func TestPDPrefillKilled(t *testing.T) {
	ctx := testContext(t, 150*time.Second)
	c := startPD(t, pdConfig{model: "slow", prefills: 2,
		worker:    []string{"--kv-cache-memory", "48MiB"},
		prefilArg: []string{"--chunked-prefill-size", "32"},
		decodeArg: []string{"--max-running-requests", "16"}})
	cl := c.client("unused")
	long := strings.Repeat("the quick brown fox jumps over the lazy dog ", 40) // ~ 1400 tokens

	const after = "a short prompt after the crash"
	wantLong := generateGreedy(t, ctx, "slow", long, 4, false)
	wantAfter := generateGreedy(t, ctx, "slow", after, 4, false)

	// Four long prompts: the router spreads them over both prefill workers.
	const inFlight = 4
	type result struct {
		c   completion
		err error
	}
	results := make([]result, inFlight)
	var wg sync.WaitGroup
	for i := range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i].c, results[i].err = complete(ctx, cl, long, 4, nil, false)
		}()
	}
	// Kill prefill 0 once it is computing a prompt (its pages are being
	// written into the decode pool chunk by chunk).
	victim := c.prefills[0]
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	for metric(t, ctx, victim.waitURL(t), "kvfence_prefill_running_requests") == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("prefill 0 never started a prompt")
		case <-allDone:
			t.Fatalf("every request ended before prefill 0 was seen computing: %+v", results)
		case <-time.After(5 * time.Millisecond):
		}
	}
	_ = syscall.Kill(-victim.cmd.Process.Pid, syscall.SIGKILL)
	<-victim.exited
	wg.Wait()
	// The router notices (its workers' health checks) and pairs no new
	// request with the dead worker.
	waitMetric(t, ctx, c.base, 10*time.Second, 1, "kvfence_router_workers_available", "role", "prefill")

	failed := 0
	for i, r := range results {
		if r.err == nil {
			// I7 with failures around: the survivors' output is the
			// output of the request alone.
			if r.c.text != wantLong {
				t.Errorf("request %d: %q, generate alone: %q", i, r.c.text, wantLong)
			}
			continue
		}
		failed++
		e := apiError(t, r.err)
		t.Logf("request %d: %d %s: %s", i, e.StatusCode, e.Code, e.Message)
		if e.StatusCode < 500 || e.Code == "" {
			t.Errorf("request %d failed with %d %q (%s), want a 5xx", i, e.StatusCode, e.Code, e.Message)
		}
	}
	if failed == 0 {
		t.Errorf("no request failed although prefill 0 was killed while computing one")
	}

	// The decode worker's link to the dead worker lost its connection: a
	// new epoch, after which none of its rooms holds a page.
	waitPoolAtRest(t, ctx, c.decode.waitURL(t), 30*time.Second)

	// New requests go to the surviving prefill worker and succeed.
	var wg2 sync.WaitGroup
	errs := make([]error, 4)
	outs := make([]completion, 4)
	for i := range errs {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			outs[i], errs[i] = complete(ctx, cl, after, 4, nil, i%2 == 0)
		}()
	}
	wg2.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d after the crash: %v", i, err)
		} else if outs[i].text != wantAfter {
			t.Errorf("request %d after the crash: %q, generate alone: %q", i, outs[i].text, wantAfter)
		}
	}
	if n := metric(t, ctx, c.prefills[1].waitURL(t), "kvfence_prefill_tokens_total"); n == 0 {
		t.Errorf("the surviving prefill worker computed nothing")
	}
	waitPoolAtRest(t, ctx, c.decode.waitURL(t), 10*time.Second)
}
