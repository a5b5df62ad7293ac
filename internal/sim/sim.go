package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

// Config describes one simulated run. Run is a pure function of it: the
// same Config gives the same events, outcomes and violation.
type Config struct {
	Seed         uint64
	Requests     int // default 200
	Prefills     int // prefill workers, default 2
	Decodes      int // decode workers, default 2
	DecodePages  int // pages per decode pool, default 8
	PrefillPages int // pages per prefill pool, default 16
	PageSize     int // tokens per page, default 4
	// Window is the context window (prompt + max tokens) of every worker;
	// default 24 tokens, less than either pool holds (I6).
	Window int
	// Protections are handed to every machine (zero: all on).
	Protections transfer.Protections
	Faults      Faults
	// Ignore lists invariants not to check, to show that the remaining
	// protections still stop the other failures (e.g. with placeholder
	// admission I3 cannot hold, but no foreign read must happen).
	Ignore InvSet
	// Trace, when set, receives every event and machine output as text.
	// It is for replaying one seed; runs without it format nothing.
	Trace func(TraceEvent)
}

// Faults says how hostile the environment is. The zero value has no
// faults at all; DefaultFaults is what the sweeps use.
type Faults struct {
	Drop        float64 // probability a control message is lost
	Dup         float64 // probability a control message is delivered twice
	Delay       int64   // control messages take 1..Delay ticks (reordering)
	WriteDelay  int64   // page writes land 1..WriteDelay ticks after being posted
	Late        float64 // probability a write is held up by 0..LateDelay more ticks
	LateDelay   int64
	AckDelay    int64   // the transport reports a finished write 1..AckDelay ticks later
	Abort       float64 // probability the client aborts a request ...
	AbortWithin int64   // ... at a uniformly random moment this many ticks after arrival
	Crashes     int     // up to this many worker crash-restarts per run
	Resets      int     // up to this many connection resets per run
	TooLong     float64 // probability a request asks for more than the window
}

// DefaultFaults are the faults of the CI sweeps.
func DefaultFaults() Faults {
	return Faults{
		Drop: 0.01, Dup: 0.03, Delay: 20,
		WriteDelay: 15, Late: 0.1, LateDelay: 200, AckDelay: 10,
		Abort: 0.25, AbortWithin: 150,
		Crashes: 2, Resets: 3, TooLong: 0.05,
	}
}

// Varied returns the Config of a seed in a varied sweep: the seed also
// picks the shape of the system (1-3 workers a side, 3-12 decode pages of
// 1-8 tokens, the window) and how hostile the faults are, so a sweep
// covers small and large pools, lossy and clean networks, and crash-heavy
// runs, not one setting.
func Varied(seed uint64) Config {
	r := rand.New(rand.NewPCG(seed, 0x766172696564)) // "varied"
	ps := []int{1, 2, 4, 8}[r.IntN(4)]
	dp := 3 + r.IntN(10)
	window := max(2, dp*ps*(2+r.IntN(3))/4)
	f := Faults{
		Drop: r.Float64() * 0.05, Dup: r.Float64() * 0.1, Delay: 1 + r.Int64N(40),
		WriteDelay: 1 + r.Int64N(30), Late: r.Float64() * 0.3, LateDelay: r.Int64N(400), AckDelay: 1 + r.Int64N(20),
		Abort: r.Float64() * 0.5, AbortWithin: 1 + r.Int64N(300),
		Crashes: r.IntN(4), Resets: r.IntN(6), TooLong: r.Float64() * 0.15,
	}
	return Config{Seed: seed, Prefills: 1 + r.IntN(3), Decodes: 1 + r.IntN(3),
		DecodePages: dp, PrefillPages: dp + r.IntN(10), PageSize: ps, Window: window, Faults: f}
}

// Invariant names a property the simulator checks.
type Invariant uint8

const (
	I1       Invariant = iota + 1 // no foreign read
	I2                            // no late write into a reassigned page
	I3                            // rejected means never reserved; the original error reaches the client
	I4                            // complete transfer before decoding
	I5                            // accounting; at rest nothing allocated, deferred or quarantined
	Once                          // every request ends exactly once
	Liveness                      // the run comes to rest
	numInvariants
)

var invNames = [numInvariants]string{"", "I1 no foreign read", "I2 no late write into a reassigned page",
	"I3 rejected means never reserved", "I4 complete transfer", "I5 accounting", "exactly once", "liveness"}

func (i Invariant) String() string {
	if i < numInvariants {
		return invNames[i]
	}
	return fmt.Sprintf("invariant(%d)", uint8(i))
}

// InvSet is a set of invariants.
type InvSet uint16

// Of returns the set holding invs.
func Of(invs ...Invariant) InvSet {
	var s InvSet
	for _, i := range invs {
		s |= 1 << i
	}
	return s
}

// Has reports whether i is in s.
func (s InvSet) Has(i Invariant) bool { return s&(1<<i) != 0 }

// Violation is the first invariant a run broke.
type Violation struct {
	Inv    Invariant
	Seed   uint64
	Time   int64 // simulated ticks
	Event  int   // events run before it, this one included
	Req    int   // the request it concerns, -1 if none
	Other  int   // a second request involved (the page's owner, the data's writer), -1 if none
	Detail string
}

func (v *Violation) Error() string {
	return fmt.Sprintf("seed %d: %v violated at t=%d (event %d), request %d (other %d): %s",
		v.Seed, v.Inv, v.Time, v.Event, v.Req, v.Other, v.Detail)
}

// TraceEvent is one line of a replay trace.
type TraceEvent struct {
	Time  int64
	Event int
	Req   int // -1 when the line concerns no single request
	Text  string
}

// Stats counts what happened in a run (or, added up, in a sweep).
type Stats struct {
	Runs, Events                         int
	Requests, Succeeded                  int
	Failed                               [reqerr.KindInternal + 1]int // machine-reported failures by kind
	ClientAborts, RouterTimeouts         int
	PeerLost                             int // requests ended because their decode worker crashed
	Messages, Dropped, Duplicated, Stale int // control messages sent / lost / doubled / lost with a connection
	WritesPosted, WritesLanded           int
	WritesRefused                        int // by a revoked or unknown window
	WritesLost                           int // sent on a connection that was gone when they arrived
	LateLandings                         int // landed in a page that was no longer plainly allocated
	Crashes, Resets                      int
	Deferred, Quarantined, Released      int // page-release outputs seen
	FenceFailsAtRead                     int // the decode engine's fence check refused a page
	Redecided                            int // a restarted decode worker decided a request its predecessor had
	// AbortsAtDecode and AbortsAtPrefill count router aborts by the room's
	// state when they arrived (index 0: unknown or closed; else the
	// transfer.DState / transfer.PState): aborts must hit every stage.
	AbortsAtDecode  [6]int
	AbortsAtPrefill [6]int
	Ignored         [numInvariants]int
}

// Add adds o's counters to s.
func (s *Stats) Add(o Stats) {
	s.Runs += o.Runs
	s.Events += o.Events
	s.Requests += o.Requests
	s.Succeeded += o.Succeeded
	for i := range s.Failed {
		s.Failed[i] += o.Failed[i]
	}
	s.ClientAborts += o.ClientAborts
	s.RouterTimeouts += o.RouterTimeouts
	s.PeerLost += o.PeerLost
	s.Messages += o.Messages
	s.Dropped += o.Dropped
	s.Duplicated += o.Duplicated
	s.Stale += o.Stale
	s.WritesPosted += o.WritesPosted
	s.WritesLanded += o.WritesLanded
	s.WritesRefused += o.WritesRefused
	s.WritesLost += o.WritesLost
	s.LateLandings += o.LateLandings
	s.Crashes += o.Crashes
	s.Resets += o.Resets
	s.Deferred += o.Deferred
	s.Quarantined += o.Quarantined
	s.Released += o.Released
	s.FenceFailsAtRead += o.FenceFailsAtRead
	s.Redecided += o.Redecided
	for i := range s.AbortsAtDecode {
		s.AbortsAtDecode[i] += o.AbortsAtDecode[i]
		s.AbortsAtPrefill[i] += o.AbortsAtPrefill[i]
	}
	for i := range s.Ignored {
		s.Ignored[i] += o.Ignored[i]
	}
}

// Result is what a run produced.
type Result struct {
	Stats
	Violation *Violation // nil when every checked invariant held
}

// Timing of the simulated system, in ticks.
const (
	tickEvery       = 10
	arrivalSpread   = 32   // requests arrive 0..arrivalSpread-1 ticks apart
	transferTimeout = 400  // decode: Grant -> Done
	drainTimeout    = 120  // decode: deferred release -> quarantine
	waitTimeout     = 400  // prefill: waiting for grant, prefill request or pages
	routerTimeout   = 4000 // router: the request's last resort
	maxEvents       = 2_000_000
	restTicks       = 60 // ticks at rest with rooms still open before it is a liveness failure
	routerID        = transfer.PeerID(1)
)

func decodeID(j int) transfer.PeerID  { return transfer.PeerID(100 + j) }
func prefillID(i int) transfer.PeerID { return transfer.PeerID(200 + i) }

// outcome of a request as the router (the client) sees it.
type outcome uint8

const (
	outNone outcome = iota
	outSuccess
	outError   // a machine failed it (kind says how)
	outAborted // the client left
	outTimeout // the router gave up
	outPeer    // the decode worker crashed
)

type request struct {
	room      transfer.RoomID
	prompt    int
	maxTokens int
	p, d      int32
	tooLong   bool
	arrived   bool
	out       outcome
	kind      reqerr.Kind

	// The decode machine's decisions, for the exactly-once check.
	decided    uint8 // 0, decStarted, decFailed
	decidedInc uint32
	dAborted   bool // an Abort reached the decode machine (of incarnation decidedInc)

	// Decode engine.
	decInc    uint32
	decActive bool
	decStop   bool // an abort or a failed read: Finish at the next step
	decSteps  int
	decPages  []int32

	// Prefill engine.
	pfInc    uint32
	pfActive bool
	pfPrompt int
	pfDone   int
	pfPages  []int32
}

const (
	decStarted = 1
	decFailed  = 2
)

type prefillWorker struct {
	id     transfer.PeerID
	inc    uint32
	m      *transfer.PrefillMachine
	pool   *kvpool.Pool
	shadow shadow
}

type decodeWorker struct {
	id     transfer.PeerID
	inc    uint32
	m      *transfer.DecodeMachine
	pool   *kvpool.Pool
	win    *transfer.WindowTable
	ghost  []ghost // per page: the last write that landed in it
	shadow shadow
}

// ghost is the truth about a decode page's contents: which request's data
// the last landed write carried, for which ordinal and fence epoch.
type ghost struct {
	req   int32 // -1: never written since the pool was created
	ord   uint32
	epoch uint64
}

// shadow is the page accounting rebuilt from the machines' outputs alone
// (OpenWindow/RunPrefill allocate, PagesDeferred, PagesQuarantined,
// PagesReleased); I5 compares it with the pool.
type shadow struct {
	state  []kvpool.State
	counts [4]int
}

func (s *shadow) init(n int) {
	s.state = make([]kvpool.State, n)
	s.counts = [4]int{n, 0, 0, 0}
}

// link is the connection between prefill p and decode d. Both machines tag
// what they send with the epoch they know; a message or write whose tag is
// not the current epoch when it arrives is lost with its connection.
type link struct {
	epoch          uint64
	pView, dView   uint64 // the epoch each side has learned
	pReady, dReady int64  // when the PeerEpoch announcing epoch reaches each side
}

// Sim is one run in progress.
type Sim struct {
	cfg    Config
	f      Faults
	pcg    rand.PCG
	rng    *rand.Rand
	auth   *transfer.Auth
	now    int64
	q      queue
	seq    uint64
	events int
	reqs   []request
	byRoom map[transfer.RoomID]int32
	pf     []prefillWorker
	dc     []decodeWorker
	links  []link
	ended  int
	viol   *Violation
	stats  Stats
	final  bool // the final connection reset that frees quarantine was done
	rest   int  // ticks spent at rest with rooms still open
	tr     bool
}

// secret is the simulated cluster secret (the MACs are real).
const secret = "kvfence-simulator-cluster-secret"

func (c *Config) defaults() {
	if c.Requests <= 0 {
		c.Requests = 200
	}
	if c.Prefills <= 0 {
		c.Prefills = 2
	}
	if c.Decodes <= 0 {
		c.Decodes = 2
	}
	if c.DecodePages <= 0 {
		c.DecodePages = 8
	}
	if c.PrefillPages <= 0 {
		c.PrefillPages = 16
	}
	if c.PageSize <= 0 {
		c.PageSize = 4
	}
	if c.Window <= 0 {
		c.Window = 24
	}
}

// Run runs one simulation to rest (or to its first violation).
func Run(cfg Config) Result {
	var s Sim
	if err := s.init(cfg); err != nil {
		return Result{Violation: &Violation{Seed: cfg.Seed, Req: -1, Other: -1, Detail: "setup: " + err.Error()}}
	}
	s.run()
	return Result{Stats: s.stats, Violation: s.viol}
}

func (s *Sim) init(cfg Config) error {
	cfg.defaults()
	if cfg.Window > cfg.DecodePages*cfg.PageSize || cfg.Window > cfg.PrefillPages*cfg.PageSize {
		return errors.New("window larger than a pool (I6)")
	}
	s.cfg = cfg
	s.f = cfg.Faults
	s.pcg.Seed(cfg.Seed, 0x6b7666656e6365) // "kvfence"
	s.rng = rand.New(&s.pcg)
	s.tr = cfg.Trace != nil
	auth, err := transfer.NewAuth([]byte(secret))
	if err != nil {
		return err
	}
	s.auth = auth
	s.byRoom = make(map[transfer.RoomID]int32, cfg.Requests)
	s.reqs = make([]request, cfg.Requests)
	s.pf = make([]prefillWorker, cfg.Prefills)
	s.dc = make([]decodeWorker, cfg.Decodes)
	s.links = make([]link, cfg.Prefills*cfg.Decodes)
	for i := range s.links {
		s.links[i] = link{epoch: 1, pView: 1, dView: 1}
	}
	for i := range s.pf {
		s.pf[i].id = prefillID(i)
		if err := s.startPrefill(i); err != nil {
			return err
		}
	}
	for j := range s.dc {
		s.dc[j].id = decodeID(j)
		if err := s.startDecode(j); err != nil {
			return err
		}
	}
	// Requests, arrivals, client aborts.
	at := int64(0)
	for q := range s.reqs {
		r := &s.reqs[q]
		for k := range r.room {
			r.room[k] = byte(s.rng.Uint32())
		}
		s.byRoom[r.room] = int32(q)
		r.p, r.d = int32(s.rng.IntN(cfg.Prefills)), int32(s.rng.IntN(cfg.Decodes))
		w, ps := cfg.Window, cfg.PageSize
		if s.rng.Float64() < s.f.TooLong {
			// Prompt + max tokens over the window; sometimes the prompt
			// alone needs more pages than the window.
			r.prompt = max(1, w-ps-2+s.rng.IntN(ps+6))
			r.maxTokens = max(1, w-r.prompt+1+s.rng.IntN(4))
			r.tooLong = true
		} else {
			r.prompt = 1 + s.rng.IntN(min(4*ps, w-1))
			r.maxTokens = 1 + s.rng.IntN(w-r.prompt)
		}
		at += int64(s.rng.IntN(arrivalSpread))
		s.push(event{at: at, kind: evArrive, req: int32(q)})
		if s.rng.Float64() < s.f.Abort {
			s.push(event{at: at + s.rng.Int64N(s.f.AbortWithin+1), kind: evAbort, req: int32(q)})
		}
		s.push(event{at: at + routerTimeout, kind: evTimeout, req: int32(q)})
	}
	// Crashes and resets at random moments while requests are flowing.
	if s.f.Crashes > 0 {
		for range s.rng.IntN(s.f.Crashes + 1) {
			toP := s.rng.IntN(2) == 0
			e := event{at: s.rng.Int64N(at + 1), kind: evCrash, toP: toP, req: -1}
			if toP {
				e.p = int32(s.rng.IntN(cfg.Prefills))
			} else {
				e.d = int32(s.rng.IntN(cfg.Decodes))
			}
			s.push(e)
		}
	}
	if s.f.Resets > 0 {
		for range s.rng.IntN(s.f.Resets + 1) {
			s.push(event{at: s.rng.Int64N(at + 1), kind: evReset, req: -1,
				p: int32(s.rng.IntN(cfg.Prefills)), d: int32(s.rng.IntN(cfg.Decodes))})
		}
	}
	s.push(event{at: tickEvery, kind: evTick, req: -1})
	return nil
}

func (s *Sim) startPrefill(i int) error {
	w := &s.pf[i]
	pool, err := kvpool.New(kvpool.Config{Shape: s.shape(), Pages: s.cfg.PrefillPages})
	if err != nil {
		return err
	}
	m, err := transfer.NewPrefillMachine(transfer.PrefillConfig{
		Self: w.id, Pool: pool, Auth: s.auth, Protections: s.cfg.Protections,
		ContextWindow: s.cfg.Window, WaitTimeout: waitTimeout, Tombstones: 2 * s.cfg.Requests,
	})
	if err != nil {
		return err
	}
	m.Tick(s.now)
	w.inc++
	w.m, w.pool = m, pool
	w.shadow.init(s.cfg.PrefillPages)
	return nil
}

func (s *Sim) startDecode(j int) error {
	w := &s.dc[j]
	pool, err := kvpool.New(kvpool.Config{Shape: s.shape(), Pages: s.cfg.DecodePages})
	if err != nil {
		return err
	}
	w.inc++
	win := transfer.NewWindowTable(0)
	m, err := transfer.NewDecodeMachine(transfer.DecodeConfig{
		Self: w.id, Pool: pool, Windows: win, Auth: s.auth, Protections: s.cfg.Protections,
		ContextWindow: s.cfg.Window, TransferTimeout: transferTimeout, DrainTimeout: drainTimeout,
		ClosedRooms: 2 * s.cfg.Requests, KeyBase: uint64(w.inc) << 40,
	})
	if err != nil {
		return err
	}
	m.Tick(s.now)
	w.m, w.pool, w.win = m, pool, win
	w.ghost = make([]ghost, s.cfg.DecodePages)
	for k := range w.ghost {
		w.ghost[k].req = -1
	}
	w.shadow.init(s.cfg.DecodePages)
	return nil
}

// shape is a tiny model: one layer, one KV head of dimension 4.
func (s *Sim) shape() kvpool.Shape {
	return kvpool.Shape{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: s.cfg.PageSize}
}

func (s *Sim) link(p, d int32) *link { return &s.links[int(p)*len(s.dc)+int(d)] }

func (s *Sim) push(e event) {
	s.seq++
	e.seq = s.seq
	s.q.push(e)
}

// run processes events until the system is at rest or an invariant breaks.
func (s *Sim) run() {
	for s.q.len() > 0 && s.viol == nil {
		e := s.q.pop()
		s.now = e.at
		s.events++
		if s.events > maxEvents {
			s.violate(Liveness, -1, -1, "more than %d events", maxEvents)
			break
		}
		s.step(&e)
		if s.viol == nil {
			s.checkAccounting()
		}
	}
	if s.viol == nil {
		s.checkRest()
	}
	s.stats.Runs = 1
	s.stats.Events = s.events
	s.stats.Requests = len(s.reqs)
}

func (s *Sim) step(e *event) {
	switch e.kind {
	case evArrive:
		s.arrive(e.req)
	case evDeliver:
		s.deliver(e)
	case evLand:
		s.land(e)
	case evLanded:
		w := &s.pf[e.p]
		if w.inc != e.inc {
			return // that incarnation is gone, and its in-flight table with it
		}
		if s.tr {
			s.tracef(int(e.req), "landed-report p%d seq=%d", e.p, e.n)
		}
		s.prefillOut(e.p, w.m.Landed(s.reqs[e.req].room, e.n))
	case evCompute:
		s.compute(e)
	case evDecode:
		s.decodeStep(e)
	case evAbort, evTimeout:
		s.routerAbort(e)
	case evTick:
		s.tick()
	case evPeerEpoch:
		s.peerEpoch(e)
	case evCrash:
		s.crash(e)
	case evReset:
		s.reset(e.p, e.d)
	}
}

// ---- router ----

func (s *Sim) arrive(q int32) {
	r := &s.reqs[q]
	r.arrived = true
	if s.tr {
		s.tracef(int(q), "arrive prompt=%d max=%d too-long=%v prefill=p%d decode=d%d room=%v", r.prompt, r.maxTokens, r.tooLong, r.p, r.d, r.room)
	}
	o := &transfer.Open{Envelope: transfer.Envelope{Room: r.room}, Prefill: s.pf[r.p].id,
		PromptTokens: uint32(r.prompt), MaxTokens: uint32(r.maxTokens)}
	s.auth.Sign(o)
	s.sendRouter(false, r.d, q, o)
	pm := &transfer.Prefill{Envelope: transfer.Envelope{Room: r.room}, Decode: s.dc[r.d].id,
		PromptTokens: uint32(r.prompt), MaxTokens: uint32(r.maxTokens)}
	s.auth.Sign(pm)
	s.sendRouter(true, r.p, q, pm)
}

func (s *Sim) routerAbort(e *event) {
	r := &s.reqs[e.req]
	if r.out != outNone {
		return
	}
	if e.kind == evAbort {
		s.end(e.req, outAborted, reqerr.KindAborted)
	} else {
		s.end(e.req, outTimeout, reqerr.KindAborted)
	}
	if s.tr {
		s.tracef(int(e.req), "router %v: Abort to p%d and d%d", e.kind, r.p, r.d)
	}
	a := &transfer.Abort{Envelope: transfer.Envelope{Room: r.room}, Reason: reqerr.KindAborted, Decode: s.dc[r.d].id}
	s.auth.Sign(a)
	s.sendRouter(false, r.d, e.req, a)
	s.sendRouter(true, r.p, e.req, a)
}

// end records a request's outcome as its client sees it: the first one.
func (s *Sim) end(q int32, o outcome, k reqerr.Kind) {
	r := &s.reqs[q]
	if r.out != outNone {
		return
	}
	r.out, r.kind = o, k
	s.ended++
	switch o {
	case outSuccess:
		s.stats.Succeeded++
	case outError:
		if int(k) < len(s.stats.Failed) {
			s.stats.Failed[k]++
		}
	case outAborted:
		s.stats.ClientAborts++
	case outTimeout:
		s.stats.RouterTimeouts++
	case outPeer:
		s.stats.PeerLost++
	}
	if r.tooLong && s.check(I3) {
		// I3: a request admission must reject reaches its client as the
		// original error (or ended for a reason of its own).
		if o == outSuccess || (o == outError && k != reqerr.KindContextLength) {
			s.violate(I3, int(q), -1, "too-long request (prompt %d + max %d > window %d) ended with %v, not %v",
				r.prompt, r.maxTokens, s.cfg.Window, kindOrSuccess(o, k), reqerr.KindContextLength)
		}
	}
}

func kindOrSuccess(o outcome, k reqerr.Kind) string {
	if o == outSuccess {
		return "success"
	}
	return k.String()
}

// ---- network ----

func (s *Sim) delay() int64 { return 1 + s.rng.Int64N(s.f.Delay+1) }

// sendRouter sends a router message to a worker. The router's connections
// are to a worker incarnation: a message in flight when it crashes is lost.
func (s *Sim) sendRouter(toP bool, idx int32, q int32, m transfer.Message) {
	e := event{kind: evDeliver, toP: toP, rtr: true, req: q, msg: m}
	if toP {
		e.p, e.inc = idx, s.pf[idx].inc
	} else {
		e.d, e.inc = idx, s.dc[idx].inc
	}
	s.sendFaulty(e, 0)
}

// sendFaulty schedules a control message with delay, loss and duplication,
// never before notBefore.
func (s *Sim) sendFaulty(e event, notBefore int64) {
	s.stats.Messages++
	if s.f.Drop > 0 && s.rng.Float64() < s.f.Drop {
		s.stats.Dropped++
		if s.tr {
			s.tracef(int(e.req), "net: %v lost", e.msg)
		}
		return
	}
	copies := 1
	if s.f.Dup > 0 && s.rng.Float64() < s.f.Dup {
		copies = 2
		s.stats.Duplicated++
	}
	for range copies {
		e.at = max(s.now+s.delay(), notBefore)
		s.push(e)
	}
}

// sendPeer sends a worker's message to its peer over their connection,
// tagged with the epoch the sender knows.
func (s *Sim) sendPeer(fromP bool, p, d int32, q int32, m transfer.Message) {
	lk := s.link(p, d)
	e := event{kind: evDeliver, toP: !fromP, p: p, d: d, req: q, msg: m}
	var ready int64
	if fromP {
		e.ep, ready = lk.pView, lk.dReady
	} else {
		e.ep, ready = lk.dView, lk.pReady
	}
	// A message on a new connection arrives after the receiver learned of it.
	s.sendFaulty(e, ready+1)
}

func (s *Sim) deliver(e *event) {
	if e.rtr {
		if (e.toP && s.pf[e.p].inc != e.inc) || (!e.toP && s.dc[e.d].inc != e.inc) {
			s.stats.Stale++
			if s.tr {
				s.tracef(int(e.req), "net: %v lost with a crashed worker", e.msg)
			}
			return
		}
	} else if e.ep != s.link(e.p, e.d).epoch {
		s.stats.Stale++
		if s.tr {
			s.tracef(int(e.req), "net: %v lost with connection epoch %d", e.msg, e.ep)
		}
		return
	}
	if e.toP {
		from := routerID
		if !e.rtr {
			from = s.dc[e.d].id
		} else if e.msg.Type() == transfer.TypeAbort {
			st, _ := s.pf[e.p].m.State(e.msg.Env().Room)
			s.stats.AbortsAtPrefill[min(int(st), 5)]++
		}
		if s.tr {
			s.tracef(int(e.req), "p%d <- %v", e.p, e.msg)
		}
		s.prefillOut(e.p, s.pf[e.p].m.Step(from, e.msg))
		return
	}
	from := routerID
	if !e.rtr {
		from = s.pf[e.p].id
	}
	if e.msg.Type() == transfer.TypeAbort && e.req >= 0 {
		st, _ := s.dc[e.d].m.State(e.msg.Env().Room)
		s.stats.AbortsAtDecode[min(int(st), 5)]++
		r := &s.reqs[e.req]
		s.decisionBy(r, e.d)
		r.dAborted = true
	}
	if s.tr {
		s.tracef(int(e.req), "d%d <- %v", e.d, e.msg)
	}
	s.decodeOut(e.d, s.dc[e.d].m.Step(from, e.msg))
}

// land is the decode worker's NIC receiving a page write: it consults the
// window table and nothing else.
func (s *Sim) land(e *event) {
	w := e.msg.(*transfer.Write)
	if e.ep != s.link(e.p, e.d).epoch {
		s.stats.WritesLost++
		if s.tr {
			s.tracef(int(e.req), "nic d%d: %v lost with connection epoch %d", e.d, w, e.ep)
		}
	} else {
		dw := &s.dc[e.d]
		if err := dw.win.Land(dw.pool, w); err != nil {
			s.stats.WritesRefused++
			if s.tr {
				s.tracef(int(e.req), "nic d%d: %v refused: %v", e.d, w, err)
			}
		} else {
			s.landed(e, dw, w)
		}
	}
	// The transport reports every posted write exactly once.
	s.push(event{at: s.now + 1 + s.rng.Int64N(s.f.AckDelay+1), kind: evLanded, p: e.p, req: e.req, inc: e.inc, n: e.n})
}

func (s *Sim) landed(e *event, dw *decodeWorker, w *transfer.Write) {
	s.stats.WritesLanded++
	h, err := kvpool.ParseHeader(w.Header[:])
	if err != nil {
		s.violate(I4, int(e.req), -1, "posted write with an unparsable header: %v", err)
		return
	}
	pg := w.Page
	st, exp := dw.pool.State(pg), dw.pool.Expected(pg)
	if st != kvpool.Allocated {
		s.stats.LateLandings++
	}
	if s.tr {
		s.tracef(int(e.req), "nic d%d: %v landed (page %v, expected fence %v)", e.d, w, st, exp)
	}
	// I2: a write lands only in a page still held under its own fence.
	if s.check(I2) && (st == kvpool.Free || exp.Room != w.Room || exp.Epoch != h.Fence.Epoch) {
		owner := -1
		if st != kvpool.Free {
			owner = s.reqIndex(exp.Room)
		}
		s.violate(I2, int(e.req), owner, "write for fence %v landed in page %d, which is %v with expected fence %v",
			h.Fence, pg, st, exp)
		return
	}
	dw.ghost[pg] = ghost{req: e.req, ord: h.Ordinal, epoch: h.Fence.Epoch}
}

// ---- connections and crashes ----

func (s *Sim) peerEpoch(e *event) {
	lk := s.link(e.p, e.d)
	m := &transfer.PeerEpoch{}
	if e.toP {
		w := &s.pf[e.p]
		if w.inc != e.inc {
			return // a newer incarnation started on a newer connection
		}
		lk.pView = max(lk.pView, e.ep)
		m.Peer, m.Epoch = s.dc[e.d].id, e.ep
		s.auth.Sign(m)
		if s.tr {
			s.tracef(-1, "p%d <- %v", e.p, m)
		}
		s.prefillOut(e.p, w.m.Step(m.Peer, m))
		return
	}
	w := &s.dc[e.d]
	if w.inc != e.inc {
		return
	}
	lk.dView = max(lk.dView, e.ep)
	m.Peer, m.Epoch = s.pf[e.p].id, e.ep
	s.auth.Sign(m)
	if s.tr {
		s.tracef(-1, "d%d <- %v", e.d, m)
	}
	s.decodeOut(e.d, w.m.Step(m.Peer, m))
}

// newEpoch closes connection (p, d) and opens a new one. A side that
// restarted (fresh) knows the new epoch at once; the others learn it with
// PeerEpoch after a delay, and messages on the new connection reach them
// only after that.
func (s *Sim) newEpoch(p, d int32, freshP, freshD bool) {
	lk := s.link(p, d)
	lk.epoch++
	if freshP {
		lk.pView, lk.pReady = lk.epoch, s.now
	} else {
		at := s.now + s.delay()
		lk.pReady = at
		s.push(event{at: at, kind: evPeerEpoch, toP: true, p: p, d: d, req: -1, inc: s.pf[p].inc, ep: lk.epoch})
	}
	if freshD {
		lk.dView, lk.dReady = lk.epoch, s.now
	} else {
		at := s.now + s.delay()
		lk.dReady = at
		s.push(event{at: at, kind: evPeerEpoch, p: p, d: d, req: -1, inc: s.dc[d].inc, ep: lk.epoch})
	}
}

func (s *Sim) reset(p, d int32) {
	s.stats.Resets++
	if s.tr {
		s.tracef(-1, "reset connection p%d-d%d (epoch %d -> %d)", p, d, s.link(p, d).epoch, s.link(p, d).epoch+1)
	}
	s.newEpoch(p, d, false, false)
}

func (s *Sim) crash(e *event) {
	s.stats.Crashes++
	if e.toP {
		if s.tr {
			s.tracef(-1, "crash p%d", e.p)
		}
		if err := s.startPrefill(int(e.p)); err != nil {
			s.violate(Liveness, -1, -1, "restart p%d: %v", e.p, err)
			return
		}
		for d := range s.dc {
			s.newEpoch(e.p, int32(d), true, false)
		}
		return
	}
	if s.tr {
		s.tracef(-1, "crash d%d", e.d)
	}
	if err := s.startDecode(int(e.d)); err != nil {
		s.violate(Liveness, -1, -1, "restart d%d: %v", e.d, err)
		return
	}
	for p := range s.pf {
		s.newEpoch(int32(p), e.d, false, true)
	}
	// The router notices its decode worker is gone.
	for q := range s.reqs {
		if r := &s.reqs[q]; r.arrived && r.d == e.d && r.out == outNone && r.decided == 0 {
			s.end(int32(q), outPeer, reqerr.KindPeerLost)
		}
	}
	for q := range s.reqs {
		if r := &s.reqs[q]; r.d == e.d && r.decActive {
			r.decActive = false // that engine died with its worker
			if r.out == outNone {
				s.end(int32(q), outPeer, reqerr.KindPeerLost)
			}
		}
	}
}

func (s *Sim) tick() {
	for i := range s.pf {
		s.prefillOut(int32(i), s.pf[i].m.Tick(s.now))
	}
	for j := range s.dc {
		s.decodeOut(int32(j), s.dc[j].m.Tick(s.now))
	}
	if s.viol != nil {
		return
	}
	if s.ended == len(s.reqs) && s.q.len() == 0 {
		// Everything has ended and nothing is in flight.
		if s.idle() {
			return // at rest: stop ticking, the queue runs dry
		}
		if !s.final {
			// Quarantine lasts until the writer's connection is new:
			// reconnect everything once, as an operator would.
			s.final = true
			for p := range s.pf {
				for d := range s.dc {
					s.newEpoch(int32(p), int32(d), false, false)
				}
			}
		} else if s.rest++; s.rest > restTicks {
			s.violate(Liveness, -1, -1, "rooms still open at rest: %s", s.openRooms())
			return
		}
	}
	s.push(event{at: s.now + tickEvery, kind: evTick, req: -1})
}

func (s *Sim) idle() bool {
	for i := range s.pf {
		if s.pf[i].m.Rooms() > 0 || s.pf[i].m.InFlight() > 0 {
			return false
		}
	}
	for j := range s.dc {
		if s.dc[j].m.Rooms() > 0 {
			return false
		}
	}
	return true
}

func (s *Sim) openRooms() string {
	out := ""
	for q := range s.reqs {
		r := &s.reqs[q]
		if st, ok := s.dc[r.d].m.State(r.room); ok {
			out += fmt.Sprintf(" req %d on d%d %v;", q, r.d, st)
		}
		if st, ok := s.pf[r.p].m.State(r.room); ok {
			out += fmt.Sprintf(" req %d on p%d %v;", q, r.p, st)
		}
	}
	for i := range s.pf {
		if n := s.pf[i].m.InFlight(); n > 0 {
			out += fmt.Sprintf(" p%d has %d writes in flight;", i, n)
		}
	}
	return out
}

func (s *Sim) reqIndex(room transfer.RoomID) int {
	if q, ok := s.byRoom[room]; ok {
		return int(q)
	}
	return -1
}

func (s *Sim) check(i Invariant) bool {
	if s.cfg.Ignore.Has(i) {
		s.stats.Ignored[i]++
		return false
	}
	return true
}

func (s *Sim) violate(i Invariant, req, other int, format string, args ...any) {
	if s.viol != nil {
		return
	}
	s.viol = &Violation{Inv: i, Seed: s.cfg.Seed, Time: s.now, Event: s.events, Req: req, Other: other,
		Detail: fmt.Sprintf(format, args...)}
	if s.tr {
		s.tracef(req, "VIOLATION %v", s.viol)
	}
}

func (s *Sim) tracef(req int, format string, args ...any) {
	s.cfg.Trace(TraceEvent{Time: s.now, Event: s.events, Req: req, Text: fmt.Sprintf(format, args...)})
}
