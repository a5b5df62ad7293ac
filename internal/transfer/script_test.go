package transfer

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt scripts")

// TestScripts runs the golden scenario scripts in testdata against the real
// machines, the real pools and a real window table. Each script is a list
// of commands; after each, the lines every machine and the harness
// printed. Regenerate with `go test ./internal/transfer -run TestScripts -rewrite`.
//
// Commands (arguments are key=value):
//
//	setup decode-pages= prefill-pages= page-size= window= unsafe=a,b drain-timeout= transfer-timeout= wait-timeout=
//	open room= prompt= max=          router sends Open to decode and Prefill to prefill (queued)
//	abort room= [to=both|decode|prefill]   router sends Abort (queued)
//	deliver [type=] [room=] [to=] [n=]     deliver matching queued messages (all, until quiet, by default)
//	net                               list queued messages
//	dup type= room= [to=]             deliver again the last delivered matching message (replay)
//	drop type= room=                  lose the first matching queued message
//	forge type= room= [to=]           deliver a copy of a matching (delivered or queued) message with a broken MAC
//	compute room= tokens=             the prefill engine computed the prompt up to tokens
//	sample room= first=               the prefill engine sampled the first token
//	land [room=] [seq=]               posted writes land through the window table, then Landed
//	corrupt page= [what=data|flag]    flip a bit of a decode page (data) or clear its checksum flag
//	alloc room= pages=                another request takes decode pages and fills them with its data
//	free room=                        ... and gives them back
//	stale room= pages=                decode pages 0..pages-1 hold KV a finished request left behind
//	tick [side=] now=                 Tick
//	peer-epoch side= epoch=           the connection to the other side is new
//	grant-unsent room=                the decode driver's transport refused the room's Grant (never transmitted)
//	finish room=                      the decode engine finishes a started sequence
//	read room=                        the decode engine reads a started sequence: fences, and whose data each page holds
//	pools                             page accounting of both pools
//	stats                             machine counters that are non-zero
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type block struct {
	prelude []string
	cmd     string
	want    []string
}

func parseScript(t *testing.T, data string) (blocks []block, trailer []string) {
	lines := strings.Split(strings.TrimRight(data, "\n"), "\n")
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if l == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		b := block{prelude: pre, cmd: l}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("line %d: command %q not followed by ----", i+1, l)
		}
		i += 2
		for ; i < len(lines) && lines[i] != ""; i++ {
			b.want = append(b.want, lines[i])
		}
		blocks = append(blocks, b)
	}
	return blocks, pre
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, trailer := parseScript(t, string(data))
	h := &harness{t: t}
	var out strings.Builder
	for bi, b := range blocks {
		if bi > 0 {
			out.WriteString("\n")
		}
		got := h.run(b.cmd)
		if len(got) == 0 {
			got = []string{"ok"}
		}
		for _, l := range b.prelude {
			out.WriteString(l + "\n")
		}
		out.WriteString(b.cmd + "\n----\n" + strings.Join(got, "\n") + "\n")
		if !*rewrite && !slices.Equal(got, b.want) {
			t.Errorf("%s: %s\n got:\n\t%s\nwant:\n\t%s", path, b.cmd, strings.Join(got, "\n\t"), strings.Join(b.want, "\n\t"))
		}
	}
	for _, l := range trailer {
		out.WriteString(l + "\n")
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const (
	peerPrefill PeerID = 1
	peerDecode  PeerID = 2
	peerRouter  PeerID = 9
)

type envelope struct {
	from, to PeerID
	msg      Message
}

type posted struct {
	seq uint64
	to  PeerID
	w   *Write
}

type harness struct {
	t         *testing.T
	auth      *Auth
	dpool     *kvpool.Pool
	ppool     *kvpool.Pool
	windows   *WindowTable
	d         *DecodeMachine
	p         *PrefillMachine
	net       []envelope
	delivered []envelope
	writes    []posted
	started   map[string][]int32 // room name -> pages of StartDecode
	allocs    map[string][]int32 // room name -> pages taken by alloc
	names     map[RoomID]string
	prot      Protections
	out       []string
}

func (h *harness) room(name string) RoomID {
	if name == "" {
		h.t.Fatal("room name missing")
	}
	var r RoomID
	copy(r[:], name)
	r[15] = 0xAA // keep ids distinct from a plain string
	h.names[r] = name
	return r
}

func (h *harness) printf(format string, args ...any) {
	h.out = append(h.out, fmt.Sprintf(format, args...))
}

// name replaces room ids with script names in a line.
func (h *harness) name(s string) string {
	for id, n := range h.names {
		s = strings.ReplaceAll(s, id.String(), n)
	}
	return s
}

func args(t *testing.T, fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("argument %q is not key=value", f)
		}
		m[k] = v
	}
	return m
}

func (h *harness) num(a map[string]string, key string, def int) int {
	v, ok := a[key]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		h.t.Fatalf("%s=%q: %v", key, v, err)
	}
	return n
}

func (h *harness) run(line string) []string {
	h.out = nil
	fields := strings.Fields(line)
	a := args(h.t, fields[1:])
	if fields[0] != "setup" && h.d == nil {
		h.t.Fatal("script must start with setup")
	}
	switch fields[0] {
	case "setup":
		h.setup(a)
	case "open":
		r := h.room(a["room"])
		prompt, maxT := uint32(h.num(a, "prompt", 0)), uint32(h.num(a, "max", 0))
		o := &Open{Envelope: Envelope{Room: r}, Prefill: peerPrefill, PromptTokens: prompt, MaxTokens: maxT}
		pf := &Prefill{Envelope: Envelope{Room: r}, Decode: peerDecode, PromptTokens: prompt, MaxTokens: maxT}
		h.auth.Sign(o)
		h.auth.Sign(pf)
		h.net = append(h.net, envelope{peerRouter, peerDecode, o}, envelope{peerRouter, peerPrefill, pf})
	case "abort":
		r := h.room(a["room"])
		to := a["to"]
		if to == "" || to == "both" || to == "decode" {
			m := &Abort{Envelope: Envelope{Room: r}, Reason: reqerr.KindAborted, Decode: peerDecode}
			h.auth.Sign(m)
			h.net = append(h.net, envelope{peerRouter, peerDecode, m})
		}
		if to == "" || to == "both" || to == "prefill" {
			m := &Abort{Envelope: Envelope{Room: r}, Reason: reqerr.KindAborted, Decode: peerDecode}
			h.auth.Sign(m)
			h.net = append(h.net, envelope{peerRouter, peerPrefill, m})
		}
	case "deliver":
		limit := h.num(a, "n", -1)
		for n := 0; limit < 0 || n < limit; n++ {
			i := h.find(h.net, a)
			if i < 0 {
				if n == 0 {
					h.printf("nothing to deliver")
				}
				break
			}
			e := h.net[i]
			h.net = slices.Delete(h.net, i, i+1)
			h.deliver(e)
		}
	case "net":
		for _, e := range h.net {
			h.printf("%s -> %s: %s", side(e.from), side(e.to), h.name(e.msg.String()))
		}
		for _, w := range h.writes {
			h.printf("write seq=%d: %s", w.seq, h.name(w.w.String()))
		}
	case "dup", "forge":
		var e envelope
		if i := h.findLast(h.delivered, a); i >= 0 {
			e = h.delivered[i]
		} else if i := h.find(h.net, a); i >= 0 && fields[0] == "forge" {
			e = h.net[i]
		} else {
			h.t.Fatalf("%s: no message matches", line)
		}
		if fields[0] == "forge" {
			e.msg = forged(e.msg)
			h.printf("forged (MAC broken):")
		}
		h.deliver(e)
	case "drop":
		i := h.find(h.net, a)
		if i < 0 {
			h.t.Fatalf("%s: no queued message matches", line)
		}
		h.printf("lost %s", h.name(h.net[i].msg.String()))
		h.net = slices.Delete(h.net, i, i+1)
	case "compute":
		r := h.room(a["room"])
		h.compute(r, h.num(a, "tokens", 0))
	case "sample":
		h.outputs("P", h.p.Sampled(h.room(a["room"]), int32(h.num(a, "first", 0))))
	case "land":
		h.land(a)
	case "corrupt":
		pg := int32(h.num(a, "page", -1))
		b := h.dpool.PageBytes(pg)
		if a["what"] == "flag" {
			b[6] &^= byte(kvpool.FlagChecksum)
		} else {
			b[kvpool.HeaderSize+100] ^= 0x10
		}
	case "alloc":
		r := h.room(a["room"])
		pages, err := h.dpool.Alloc(r, h.num(a, "pages", 1), nil)
		if err != nil {
			h.printf("alloc: %v", err)
			break
		}
		for i, pg := range pages {
			h.dpool.Stamp(pg, uint32(i), uint32(h.dpool.PageSize()))
			fill(h.dpool, pg, r)
		}
		h.allocs[a["room"]] = pages
		h.printf("%s holds pages %v", a["room"], pages)
	case "stale":
		// Memory a finished request left behind: pools are not zeroed, and
		// this bypasses the pool so invariant builds' poisoning of freed
		// pages does not hide it.
		r := h.room(a["room"])
		n := h.num(a, "pages", 1)
		for pg := range int32(n) {
			hd := kvpool.Header{Fence: Fence{Room: r}, Page: pg, Ordinal: uint32(pg), Tokens: uint32(h.dpool.PageSize()), Flags: kvpool.FlagLocal}
			hd.Put(h.dpool.PageBytes(pg))
			fill(h.dpool, pg, r)
		}
		h.printf("pages 0-%d hold %s's KV", n-1, a["room"])
	case "free":
		r := h.room(a["room"])
		h.dpool.Free(r, h.allocs[a["room"]])
		delete(h.allocs, a["room"])
	case "tick":
		now := int64(h.num(a, "now", 0))
		if s := a["side"]; s == "" || s == "decode" {
			h.outputs("D", h.d.Tick(now))
		}
		if s := a["side"]; s == "" || s == "prefill" {
			h.outputs("P", h.p.Tick(now))
		}
	case "peer-epoch":
		ep := uint64(h.num(a, "epoch", 1))
		if s := a["side"]; s == "" || s == "decode" {
			m := &PeerEpoch{Peer: peerPrefill, Epoch: ep}
			h.auth.Sign(m)
			h.outputs("D", h.d.Step(peerPrefill, m))
		}
		if s := a["side"]; s == "" || s == "prefill" {
			m := &PeerEpoch{Peer: peerDecode, Epoch: ep}
			h.auth.Sign(m)
			h.outputs("P", h.p.Step(peerDecode, m))
		}
	case "grant-unsent":
		h.outputs("D", h.d.GrantUnsent(h.room(a["room"])))
	case "finish":
		h.outputs("D", h.d.Finish(h.room(a["room"])))
		delete(h.started, a["room"])
	case "read":
		h.read(a["room"])
	case "pools":
		h.pools()
	case "stats":
		h.stats()
	default:
		h.t.Fatalf("unknown command %q", fields[0])
	}
	return h.out
}

func (h *harness) setup(a map[string]string) {
	var err error
	h.auth, err = NewAuth([]byte("kvfence test cluster secret"))
	if err != nil {
		h.t.Fatal(err)
	}
	var prot Protections
	for _, name := range strings.Split(a["unsafe"], ",") {
		switch name {
		case "":
		case "fence-check":
			prot.NoFenceCheck = true
		case "window-revocation":
			prot.NoWindowRevocation = true
		case "deferred-release":
			prot.NoDeferredRelease = true
		case "tombstones":
			prot.NoTombstones = true
		case "checksum":
			prot.NoChecksum = true
		case "page-count-agreement":
			prot.NoPageCountAgreement = true
		case "admission-before-reservation":
			prot.NoAdmissionBeforeReservation = true
		default:
			h.t.Fatalf("unknown protection %q", name)
		}
	}
	shape := kvpool.Shape{Layers: 2, KVHeads: 1, HeadDim: 4, PageSize: h.num(a, "page-size", 4)}
	h.dpool, err = kvpool.New(kvpool.Config{Shape: shape, Pages: h.num(a, "decode-pages", 8)})
	if err != nil {
		h.t.Fatal(err)
	}
	h.ppool, err = kvpool.New(kvpool.Config{Shape: shape, Pages: h.num(a, "prefill-pages", 8)})
	if err != nil {
		h.t.Fatal(err)
	}
	window := h.num(a, "window", 32)
	h.windows = NewWindowTable(16)
	h.d, err = NewDecodeMachine(DecodeConfig{Self: peerDecode, Pool: h.dpool, Windows: h.windows, Auth: h.auth,
		Protections: prot, ContextWindow: window, DrainTimeout: int64(h.num(a, "drain-timeout", 10)),
		TransferTimeout: int64(h.num(a, "transfer-timeout", 0)), KeyBase: 100})
	if err != nil {
		h.t.Fatal(err)
	}
	h.p, err = NewPrefillMachine(PrefillConfig{Self: peerPrefill, Pool: h.ppool, Auth: h.auth, Protections: prot,
		ContextWindow: window, WaitTimeout: int64(h.num(a, "wait-timeout", 0))})
	if err != nil {
		h.t.Fatal(err)
	}
	h.net, h.delivered, h.writes = nil, nil, nil
	h.started, h.allocs, h.names = map[string][]int32{}, map[string][]int32{}, map[RoomID]string{}
	h.prot = prot
	h.printf("protections: %v", prot)
	for _, p := range []struct {
		side string
		pool *kvpool.Pool
	}{{"decode", h.dpool}, {"prefill", h.ppool}} {
		_, _, err := kvpool.CheckWindow(p.pool.Tokens(), window, false)
		if err == nil {
			h.printf("%s pool: %d pages, %d tokens; I6 ok", p.side, p.pool.Total(), p.pool.Tokens())
		} else {
			h.printf("%s pool: %d pages, %d tokens; I6 would refuse to start: %v", p.side, p.pool.Total(), p.pool.Tokens(), err)
		}
	}
}

func side(p PeerID) string {
	switch p {
	case peerPrefill:
		return "P"
	case peerDecode:
		return "D"
	case peerRouter:
		return "router"
	}
	return fmt.Sprintf("peer%d", p)
}

func (h *harness) matches(e envelope, a map[string]string) bool {
	if t := a["type"]; t != "" && e.msg.Type().String() != t {
		return false
	}
	if r := a["room"]; r != "" && e.msg.Env().Room != h.room(r) {
		return false
	}
	if to := a["to"]; to != "" && !strings.HasPrefix(map[PeerID]string{peerDecode: "decode", peerPrefill: "prefill"}[e.to], to) {
		return false
	}
	return true
}

func (h *harness) find(es []envelope, a map[string]string) int {
	return slices.IndexFunc(es, func(e envelope) bool { return h.matches(e, a) })
}

func (h *harness) findLast(es []envelope, a map[string]string) int {
	for i := len(es) - 1; i >= 0; i-- {
		if h.matches(es[i], a) {
			return i
		}
	}
	return -1
}

func (h *harness) deliver(e envelope) {
	h.delivered = append(h.delivered, e)
	h.printf("%s -> %s: %s", side(e.from), side(e.to), h.name(e.msg.String()))
	switch e.to {
	case peerDecode:
		h.outputs("D", h.d.Step(e.from, e.msg))
	case peerPrefill:
		h.outputs("P", h.p.Step(e.from, e.msg))
	}
}

// outputs prints a machine's outputs and acts on the ones the harness
// drives: messages are queued, writes are held until landed.
func (h *harness) outputs(who string, outs []Output) {
	self := map[string]PeerID{"D": peerDecode, "P": peerPrefill}[who]
	for _, o := range outs {
		h.printf("  %s: %s", who, h.name(o.String()))
		switch o := o.(type) {
		case Send:
			h.net = append(h.net, envelope{self, o.To, o.Msg})
		case PostWrite:
			h.writes = append(h.writes, posted{o.Seq, o.To, o.Msg})
		case StartDecode:
			h.started[h.names[o.Room]] = o.Pages
		}
	}
}

// fill writes a recognisable pattern for room r into every K/V float of
// page pg: the room's first byte, so that a read can tell whose data a
// page holds.
func fill(pool *kvpool.Pool, pg int32, r RoomID) {
	for l := range pool.Shape().Layers {
		k, v := pool.LayerKV(pg, l)
		for i := range k {
			k[i], v[i] = float32(r[0]), float32(r[0])
		}
	}
}

func (h *harness) compute(r RoomID, tokens int) {
	// The engine writes the KV of the computed positions into its pages:
	// the harness fills whole pages with the room's pattern.
	if st, ok := h.p.State(r); ok && (st == PWaitGrant || st == PRunning) {
		for _, pg := range h.prefillPages(r) {
			fill(h.ppool, pg, r)
		}
	}
	h.outputs("P", h.p.Computed(r, tokens))
}

func (h *harness) prefillPages(r RoomID) []int32 {
	var pages []int32
	for pg := range int32(h.ppool.Total()) {
		if h.ppool.State(pg) == kvpool.Allocated && h.ppool.Expected(pg).Room == r {
			pages = append(pages, pg)
		}
	}
	return pages
}

func (h *harness) land(a map[string]string) {
	var keep []posted
	landed := 0
	for _, w := range h.writes {
		if (a["room"] != "" && w.w.Room != h.room(a["room"])) || (a["seq"] != "" && w.seq != uint64(h.num(a, "seq", 0))) {
			keep = append(keep, w)
			continue
		}
		landed++
		if err := h.windows.Land(h.dpool, w.w); err != nil {
			h.printf("write seq=%d to page %d refused: %v", w.seq, w.w.Page, err)
		} else {
			h.printf("write seq=%d landed in page %d", w.seq, w.w.Page)
		}
		h.outputs("P", h.p.Landed(w.w.Room, w.seq))
	}
	h.writes = keep
	if landed == 0 {
		h.printf("no write to land")
	}
}

func (h *harness) read(name string) {
	pages, ok := h.started[name]
	if !ok {
		h.printf("%s is not decoding", name)
		return
	}
	r := h.room(name)
	refused := false
	if h.prot.NoFenceCheck {
		h.printf("fence check: skipped (unsafe)")
	} else if err := h.dpool.VerifyFences(r, pages); err != nil {
		h.printf("fence check: %s", h.name(err.Error()))
		h.printf("read refused: the request fails closed")
		refused = true
	} else {
		h.printf("fence check: ok")
	}
	var owners []string
	foreign := false
	for _, pg := range pages {
		k, _ := h.dpool.LayerKV(pg, 0)
		owner := "?"
		if b := byte(k[0]); k[0] == float32(b) && b >= 'A' && b <= 'Z' {
			owner = string(b)
		}
		if owner != name {
			foreign = true
		}
		owners = append(owners, fmt.Sprintf("%d:%s", pg, owner))
	}
	h.printf("data: %s", strings.Join(owners, " "))
	if foreign && !refused {
		h.printf("LEAK: %s attends over KV it did not write", name)
	}
}

func (h *harness) pools() {
	for _, p := range []struct {
		side string
		pool *kvpool.Pool
	}{{"decode", h.dpool}, {"prefill", h.ppool}} {
		c := p.pool.Counts()
		h.printf("%s pool: free=%d allocated=%d deferred=%d quarantined=%d total=%d",
			p.side, c.Free, c.Allocated, c.Deferred, c.Quarantined, c.Total)
		if c.Free+c.Allocated+c.Deferred+c.Quarantined != c.Total {
			h.t.Errorf("I5 violated: %+v", c)
		}
	}
}

func (h *harness) stats() {
	ds, ps := h.d.Stats(), h.p.Stats()
	var parts []string
	for r, n := range ds.Dropped {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("dropped-%v=%d", DropReason(r), n))
		}
	}
	for _, f := range []struct {
		name string
		n    uint64
	}{{"admitted", ds.Admitted}, {"rejected", ds.Rejected}, {"granted", ds.Granted}, {"started", ds.Started},
		{"failed", ds.Failed}, {"integrity", ds.IntegrityFailures}, {"drained", ds.DrainedReleases},
		{"timeout", ds.TimeoutQuarantines}, {"epoch", ds.EpochReleases}, {"immediate", ds.ImmediateReleases}} {
		if f.n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", f.name, f.n))
		}
	}
	h.printf("decode: %s", strings.Join(parts, " "))
	parts = nil
	for r, n := range ps.Dropped {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("dropped-%v=%d", DropReason(r), n))
		}
	}
	for _, f := range []struct {
		name string
		n    uint64
	}{{"admitted", ps.Admitted}, {"rejected", ps.Rejected}, {"placeholders", ps.Placeholders},
		{"writes", ps.WritesPosted}, {"done", ps.Done}, {"drained", ps.Drained}, {"failed", ps.Failed}} {
		if f.n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", f.name, f.n))
		}
	}
	h.printf("prefill: %s", strings.Join(parts, " "))
	st := h.dpool.Stats()
	h.printf("decode pool: fence-mismatches=%d checksum-failures=%d quarantined-pages=%d",
		st.FenceMismatches, st.ChecksumFailures, st.QuarantinedPages)
}

// forged returns a copy of m whose MAC is wrong.
func forged(m Message) Message {
	b := Encode(m)
	c, _, err := Decode(b)
	if err != nil {
		panic(err)
	}
	c.Env().MAC[0] ^= 1
	return c
}

var _ = errors.New
