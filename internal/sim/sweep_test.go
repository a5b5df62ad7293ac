//go:build !race

package sim

import (
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/transfer"
)

// TestSweep is the CI seed sweep: 10,000 seeds of 200 requests with every
// protection on and every fault, zero violations. Too slow for the race
// detector; scripts/test.sh runs it without (go test -run Sweep). The long
// mode runs more: -sim.long=N or KVFENCE_SIM_SEEDS=N.
func TestSweep(t *testing.T) {
	n := 10000
	if l := longSeeds(); l > 0 {
		n = l
	} else if testing.Short() {
		n = 1000
	}
	start := time.Now()
	st, vs := sweep(*fromFlag, n, transfer.Protections{}, 0, 3)
	el := time.Since(start)
	reportViolations(t, vs, transfer.Protections{}, 0)
	checkCoverage(t, st)
	t.Logf("%d seeds x %d requests in %v: %.0f seeds/s, %.0f events/s (%d events); %d succeeded, failed by kind %v, %d client aborts, %d router timeouts, %d peer lost",
		st.Runs, st.Requests/max(st.Runs, 1), el.Round(time.Millisecond), float64(st.Runs)/el.Seconds(),
		float64(st.Events)/el.Seconds(), st.Events, st.Succeeded, st.Failed, st.ClientAborts, st.RouterTimeouts, st.PeerLost)
}

// TestSweepVaried sweeps seeds whose system shape and fault rates vary
// (Varied): 3,000 seeds with every protection on, zero violations.
func TestSweepVaried(t *testing.T) {
	n := 3000
	if l := longSeeds(); l > 0 {
		n = l
	} else if testing.Short() {
		n = 300
	}
	start := time.Now()
	st, vs := parallelSweep(*fromFlag, n, Varied, 3)
	el := time.Since(start)
	for _, v := range vs {
		t.Errorf("%v\nreplay: go test ./internal/sim -run TestSeed -sim.varied -seed %d -v\n%s", v, v.Seed, Explain(Varied(v.Seed), v, 60))
	}
	t.Logf("%d varied seeds in %v: %.0f seeds/s, %d events; %d of %d requests succeeded",
		st.Runs, el.Round(time.Millisecond), float64(st.Runs)/el.Seconds(), st.Events, st.Succeeded, st.Requests)
}
