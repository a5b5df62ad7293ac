package sim

import (
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

var (
	seedFlag   = flag.Uint64("seed", 0, "TestSeed: replay this seed with a full trace")
	unsafeFlag = flag.String("sim.unsafe", "", "TestSeed: comma-separated protections to switch off "+
		"(fence-check, window-revocation, deferred-release, tombstones, checksum, page-count-agreement, admission-before-reservation)")
	longFlag   = flag.Int("sim.long", 0, "TestSweep: run this many seeds instead of 10000 (also env KVFENCE_SIM_SEEDS)")
	variedFlag = flag.Bool("sim.varied", false, "TestSeed: the seed is from TestSweepVaried (Varied(seed))")
	fromFlag   = flag.Uint64("sim.from", 1, "TestSweep: first seed (long runs continue where CI stops: -sim.from=10001)")
)

func parseUnsafe(s string) (transfer.Protections, error) {
	var p transfer.Protections
	for _, name := range strings.Split(s, ",") {
		switch strings.TrimSpace(name) {
		case "":
		case "fence-check":
			p.NoFenceCheck = true
		case "window-revocation":
			p.NoWindowRevocation = true
		case "deferred-release":
			p.NoDeferredRelease = true
		case "tombstones":
			p.NoTombstones = true
		case "checksum":
			p.NoChecksum = true
		case "page-count-agreement":
			p.NoPageCountAgreement = true
		case "admission-before-reservation":
			p.NoAdmissionBeforeReservation = true
		default:
			return p, fmt.Errorf("unknown protection %q", name)
		}
	}
	return p, nil
}

// replayHint is the command that replays a failing seed.
func replayHint(seed uint64, p transfer.Protections) string {
	cmd := fmt.Sprintf("go test ./internal/sim -run TestSeed -seed %d -v", seed)
	if !p.Safe() {
		cmd += " -sim.unsafe=" + strings.ReplaceAll(strings.TrimPrefix(p.String(), "unsafe: no "), ", no ", ",")
	}
	return cmd
}

// TestSeed replays one seed with every event traced:
//
//	go test ./internal/sim -run TestSeed -seed N -v [-sim.unsafe=window-revocation,deferred-release]
func TestSeed(t *testing.T) {
	if *seedFlag == 0 {
		t.Skip("replays a seed: -seed N")
	}
	p, err := parseUnsafe(*unsafeFlag)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Seed: *seedFlag, Faults: DefaultFaults()}
	if *variedFlag {
		cfg = Varied(*seedFlag)
	}
	cfg.Protections = p
	cfg.Trace = func(e TraceEvent) { t.Logf("t=%-6d #%-6d req %-4d %s", e.Time, e.Event, e.Req, e.Text) }
	res := Run(cfg)
	t.Logf("stats: %+v", res.Stats)
	if res.Violation != nil {
		t.Error(res.Violation)
	}
}

// sweep runs seeds [from, from+n) with protections p on every core and
// returns the summed stats and the violations found (at most max).
func sweep(from uint64, n int, p transfer.Protections, ignore InvSet, maxViolations int) (Stats, []*Violation) {
	return parallelSweep(from, n, func(seed uint64) Config {
		return Config{Seed: seed, Faults: DefaultFaults(), Protections: p, Ignore: ignore}
	}, maxViolations)
}

func reportViolations(t *testing.T, vs []*Violation, p transfer.Protections, ignore InvSet) {
	t.Helper()
	for _, v := range vs {
		t.Errorf("%v\nreplay: %s\n%s", v, replayHint(v.Seed, p),
			Explain(Config{Seed: v.Seed, Faults: DefaultFaults(), Protections: p, Ignore: ignore}, v, 60))
	}
}

// checkCoverage fails when a sweep did not exercise the faults it exists
// for: a clean sweep that never aborted mid-transfer proves nothing.
func checkCoverage(t *testing.T, st Stats) {
	t.Helper()
	for _, c := range []struct {
		name string
		n    int
	}{
		{"successful requests", st.Succeeded},
		{"context_length_exceeded rejections", st.Failed[reqerr.KindContextLength]},
		{"client aborts", st.ClientAborts},
		{"dropped messages", st.Dropped},
		{"duplicated messages", st.Duplicated},
		{"messages lost with a connection", st.Stale},
		{"writes refused by a revoked window", st.WritesRefused},
		{"writes lost with a connection", st.WritesLost},
		{"crashes", st.Crashes},
		{"connection resets", st.Resets},
		{"deferred releases", st.Deferred},
		{"quarantines", st.Quarantined},
	} {
		if c.n == 0 {
			t.Errorf("the sweep saw no %s: the faults are not being exercised", c.name)
		}
	}
	for _, c := range []struct {
		name string
		n    int
	}{
		{"the decode side has not heard of", st.AbortsAtDecode[0]},
		{"queued on the decode side", st.AbortsAtDecode[transfer.DQueued]},
		{"granted", st.AbortsAtDecode[transfer.DGranted]},
		{"decoding", st.AbortsAtDecode[transfer.DActive]},
		{"the prefill side has not heard of", st.AbortsAtPrefill[0]},
		{"prefilling before the grant", st.AbortsAtPrefill[transfer.PWaitGrant]},
		{"writing pages", st.AbortsAtPrefill[transfer.PRunning]},
	} {
		if c.n == 0 {
			t.Errorf("no client abort reached a room %s: aborts do not cover every stage", c.name)
		}
	}
	if st.Succeeded < st.Requests/5 {
		t.Errorf("only %d of %d requests succeeded: the simulated system is too hostile to test the happy path", st.Succeeded, st.Requests)
	}
}

// TestSweepSmall is the sweep of TestSweep at 100 seeds, small enough for
// the race detector (which also switches on kvpool's invariant checks).
func TestSweepSmall(t *testing.T) {
	st, vs := sweep(1, 100, transfer.Protections{}, 0, 3)
	reportViolations(t, vs, transfer.Protections{}, 0)
	checkCoverage(t, st)
	_, vs = parallelSweep(1, 50, Varied, 3)
	for _, v := range vs {
		t.Errorf("varied: %v\nreplay: go test ./internal/sim -run TestSeed -sim.varied -seed %d -v\n%s", v, v.Seed, Explain(Varied(v.Seed), v, 60))
	}
	t.Logf("%d seeds, %d requests, %d events: %d succeeded, failed by kind %v, %d client aborts (at decode states %v, prefill states %v)",
		st.Runs, st.Requests, st.Events, st.Succeeded, st.Failed, st.ClientAborts, st.AbortsAtDecode, st.AbortsAtPrefill)
}

func TestDeterministic(t *testing.T) {
	digest := func(seed uint64, p transfer.Protections) (uint64, Result) {
		h := fnv.New64a()
		res := Run(Config{Seed: seed, Faults: DefaultFaults(), Protections: p,
			Trace: func(e TraceEvent) { fmt.Fprintf(h, "%d %d %d %s\n", e.Time, e.Event, e.Req, e.Text) }})
		return h.Sum64(), res
	}
	for _, c := range []struct {
		seed uint64
		p    transfer.Protections
	}{
		{3, transfer.Protections{}},
		{2, transfer.Protections{NoWindowRevocation: true, NoDeferredRelease: true}},
	} {
		d1, r1 := digest(c.seed, c.p)
		d2, r2 := digest(c.seed, c.p)
		if d1 != d2 || r1.Stats != r2.Stats {
			t.Errorf("seed %d (%v): two runs differ", c.seed, c.p)
		}
		// Tracing must not change the run.
		r3 := Run(Config{Seed: c.seed, Faults: DefaultFaults(), Protections: c.p})
		if r3.Stats != r1.Stats || fmt.Sprint(r3.Violation) != fmt.Sprint(r1.Violation) {
			t.Errorf("seed %d (%v): tracing changed the run", c.seed, c.p)
		}
	}
}

// The failure modes of DESIGN.md §1: with the protections removed, the
// simulator must find the violation within a few seeds, forever.
var buggy = []struct {
	name   string
	p      transfer.Protections
	ignore InvSet
	want   InvSet // the invariants the failure breaks
}{
	{"late write: immediate release without revocation",
		transfer.Protections{NoWindowRevocation: true, NoDeferredRelease: true}, 0, Of(I2)},
	{"late write: drained ack without tombstone",
		transfer.Protections{NoWindowRevocation: true, NoTombstones: true}, 0, Of(I2)},
	{"rejected but alive",
		transfer.Protections{NoAdmissionBeforeReservation: true, NoPageCountAgreement: true, NoFenceCheck: true, NoChecksum: true},
		0, Of(I3)},
	// Placeholder admission breaks I3 at once; beyond it, the decode side
	// reads pages holding other requests' prompts.
	{"rejected but alive: the foreign read",
		transfer.Protections{NoAdmissionBeforeReservation: true, NoPageCountAgreement: true, NoFenceCheck: true, NoChecksum: true},
		Of(I3), Of(I1, I4)},
	// Without page-count agreement the decode side checks only the pages
	// Done lists, so the checksum check alone does not notice the pages
	// the placeholder never wrote.
	{"rejected but alive: the checksum alone does not stop the read",
		transfer.Protections{NoAdmissionBeforeReservation: true, NoPageCountAgreement: true, NoFenceCheck: true},
		Of(I3), Of(I1, I4)},
	// Without the fence check the late write is not just refused later:
	// another request decodes it.
	{"late write read by its page's next owner",
		transfer.Protections{NoWindowRevocation: true, NoDeferredRelease: true, NoFenceCheck: true, NoChecksum: true},
		Of(I2), Of(I1)},
}

const buggySeeds = 200 // each finds its violation within the first few

func TestBuggyConfigurationsFindTheirViolation(t *testing.T) {
	for _, c := range buggy {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= buggySeeds; seed++ {
				cfg := Config{Seed: seed, Faults: DefaultFaults(), Protections: c.p, Ignore: c.ignore}
				res := Run(cfg)
				if v := res.Violation; v != nil {
					if !c.want.Has(v.Inv) {
						t.Fatalf("found a violation of another invariant than expected: %v\n%s", v, Explain(cfg, v, 40))
					}
					t.Logf("found after %d seeds: %v\nreplay: %s\n%s", seed, v, replayHint(seed, c.p), Explain(cfg, v, 25))
					return
				}
			}
			t.Fatalf("%v: no violation in %d seeds; the simulator no longer finds this failure", c.p, buggySeeds)
		})
	}
}

// Each protection alone stops its failure, where one protection can.
var alone = []struct {
	name   string
	p      transfer.Protections
	ignore InvSet
}{
	// Late writes: revocation alone; deferred release with tombstones
	// alone; and tombstones are covered by revocation.
	{"revocation alone stops late writes", transfer.Protections{NoDeferredRelease: true, NoTombstones: true}, 0},
	{"deferred release and tombstones alone stop late writes", transfer.Protections{NoWindowRevocation: true}, 0},
	{"revocation covers missing tombstones", transfer.Protections{NoTombstones: true}, 0},
	// A late write still lands (I2 cannot hold), but the fence check
	// keeps anyone from reading it.
	{"fence check alone stops reading a late write",
		transfer.Protections{NoWindowRevocation: true, NoDeferredRelease: true}, Of(I2)},
	// Rejected but alive: admission alone stops everything; the fence
	// check alone and page-count agreement alone stop the foreign read
	// (the client cannot get its original error without admission: I3).
	{"admission alone stops rejected-but-alive",
		transfer.Protections{NoPageCountAgreement: true, NoFenceCheck: true, NoChecksum: true}, 0},
	{"fence check alone stops the rejected-but-alive read",
		transfer.Protections{NoAdmissionBeforeReservation: true, NoPageCountAgreement: true, NoChecksum: true}, Of(I3)},
	{"page-count agreement alone stops the rejected-but-alive read",
		transfer.Protections{NoAdmissionBeforeReservation: true, NoFenceCheck: true, NoChecksum: true}, Of(I3)},
}

func TestEachProtectionAlone(t *testing.T) {
	n := 200
	if testing.Short() || raceEnabled {
		n = 12
	}
	for _, c := range alone {
		t.Run(c.name, func(t *testing.T) {
			st, vs := sweep(1, n, c.p, c.ignore, 1)
			reportViolations(t, vs, c.p, c.ignore)
			if st.Succeeded == 0 {
				t.Errorf("no request succeeded: the configuration proves nothing")
			}
		})
	}
}

func longSeeds() int {
	if *longFlag > 0 {
		return *longFlag
	}
	if v, err := strconv.Atoi(os.Getenv("KVFENCE_SIM_SEEDS")); err == nil && v > 0 {
		return v
	}
	return 0
}

func BenchmarkRun(b *testing.B) {
	b.ReportAllocs()
	events := 0
	for i := range b.N {
		res := Run(Config{Seed: uint64(i + 1), Faults: DefaultFaults()})
		if res.Violation != nil {
			b.Fatal(res.Violation)
		}
		events += res.Events
	}
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

func TestQueueOrder(t *testing.T) {
	var q queue
	var s Sim
	s.q = q
	times := []int64{5, 1, 9, 1, 3, 9, 0, 7, 5, 2, 8, 1}
	for i, at := range times {
		s.push(event{at: at, req: int32(i)})
	}
	var prev event
	for i := 0; s.q.len() > 0; i++ {
		e := s.q.pop()
		if i > 0 && (e.at < prev.at || (e.at == prev.at && e.req < prev.req)) {
			t.Fatalf("popped (t=%d, #%d) after (t=%d, #%d): not in (time, schedule) order", e.at, e.req, prev.at, prev.req)
		}
		prev = e
	}
}

// TestDefenceInDepth switches off one protection at a time, all others on:
// no failure of DESIGN.md §1 needs only one missing protection, except
// placeholder admission, which by itself denies the client its original
// error (I3) but leads to no foreign read.
func TestDefenceInDepth(t *testing.T) {
	n := 60
	if testing.Short() || raceEnabled {
		n = 8
	}
	for _, c := range []struct {
		p      transfer.Protections
		ignore InvSet
	}{
		{transfer.Protections{NoFenceCheck: true}, 0},
		{transfer.Protections{NoChecksum: true}, 0},
		{transfer.Protections{NoPageCountAgreement: true}, 0},
		{transfer.Protections{NoWindowRevocation: true}, 0},
		{transfer.Protections{NoDeferredRelease: true}, 0},
		{transfer.Protections{NoTombstones: true}, 0},
		{transfer.Protections{NoAdmissionBeforeReservation: true}, Of(I3)},
	} {
		t.Run(c.p.String(), func(t *testing.T) {
			_, vs := sweep(1, n, c.p, c.ignore, 1)
			reportViolations(t, vs, c.p, c.ignore)
			_, vs = parallelSweep(1, n, func(seed uint64) Config {
				cfg := Varied(seed)
				cfg.Protections, cfg.Ignore = c.p, c.ignore
				return cfg
			}, 1)
			for _, v := range vs {
				t.Errorf("varied: %v", v)
			}
		})
	}
}
