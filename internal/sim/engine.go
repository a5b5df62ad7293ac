package sim

import (
	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/transfer"
)

// kvValue is the synthetic K (kv=0) or V (kv=1) element i of layer l at
// prompt position pos of request q: a 24-bit odd integer, exact in float32
// and never zero, so a page of another request, a page never written and a
// poisoned page all differ from it.
func kvValue(q int32, pos, l, kv, i int) float32 {
	x := uint64(uint32(q))<<32 ^ uint64(pos)<<12 ^ uint64(l)<<4 ^ uint64(kv)<<3 ^ uint64(i)
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float32(x>>40 | 1)
}

// firstToken is the token the prefill engine samples for request q.
func firstToken(q int32) int32 { return 1000 + q }

// ---- prefill side ----

func (s *Sim) prefillOut(i int32, outs []transfer.Output) {
	w := &s.pf[i]
	for _, o := range outs {
		if s.viol != nil {
			return
		}
		if s.tr {
			s.tracef(s.outReq(o), "p%d: %v", i, o)
		}
		switch o := o.(type) {
		case transfer.Send:
			j, ok := s.decodeIndex(o.To)
			if !ok {
				s.violate(Once, s.reqIndex(o.Msg.Env().Room), -1, "p%d sent %v to unknown peer %d", i, o.Msg.Type(), o.To)
				return
			}
			s.sendPeer(true, i, j, int32(s.reqIndex(o.Msg.Env().Room)), o.Msg)
		case transfer.PostWrite:
			j, ok := s.decodeIndex(o.To)
			if !ok {
				s.violate(Once, s.reqIndex(o.Msg.Room), -1, "p%d posted a write to unknown peer %d", i, o.To)
				return
			}
			s.stats.WritesPosted++
			at := s.now + 1 + s.rng.Int64N(s.f.WriteDelay+1)
			if s.f.Late > 0 && s.rng.Float64() < s.f.Late {
				at += s.rng.Int64N(s.f.LateDelay + 1)
			}
			s.push(event{at: at, kind: evLand, p: i, d: j, req: int32(s.reqIndex(o.Msg.Room)), inc: w.inc,
				ep: s.link(i, j).pView, n: o.Seq, msg: o.Msg})
		case transfer.RunPrefill:
			q := s.reqIndex(o.Room)
			s.alloc(&w.shadow, o.Pages, q, "RunPrefill")
			if q < 0 {
				continue
			}
			r := &s.reqs[q]
			r.pfInc, r.pfActive, r.pfPrompt, r.pfDone = w.inc, true, o.PromptTokens, 0
			r.pfPages = append(r.pfPages[:0], o.Pages...)
			s.push(event{at: s.now + 1 + s.rng.Int64N(10), kind: evCompute, p: i, req: int32(q), inc: w.inc})
		case transfer.StopPrefill:
			if q := s.reqIndex(o.Room); q >= 0 && s.reqs[q].pfInc == w.inc {
				s.reqs[q].pfActive = false
			}
		case transfer.Fail:
			if q := s.reqIndex(o.Room); q >= 0 && s.reqs[q].pfInc == w.inc {
				s.reqs[q].pfActive = false
			}
		case transfer.PagesReleased:
			if q := s.reqIndex(o.Room); q >= 0 && s.reqs[q].pfInc == w.inc && s.reqs[q].pfActive {
				s.violate(I5, q, -1, "p%d freed the local pages of a prefill still computing", i)
				return
			}
			s.release(&w.shadow, o.Pages, kvpool.Free, s.reqIndex(o.Room), "PagesReleased(prefill)")
		}
	}
}

func (s *Sim) decodeIndex(id transfer.PeerID) (int32, bool) {
	j := int(id) - 100
	if j < 0 || j >= len(s.dc) {
		return 0, false
	}
	return int32(j), true
}

func (s *Sim) prefillIndex(id transfer.PeerID) (int32, bool) {
	i := int(id) - 200
	if i < 0 || i >= len(s.pf) {
		return 0, false
	}
	return int32(i), true
}

// compute is the prefill engine finishing a chunk: it writes the chunk's
// synthetic K/V into the local pages and reports progress.
func (s *Sim) compute(e *event) {
	w := &s.pf[e.p]
	r := &s.reqs[e.req]
	if w.inc != e.inc || r.pfInc != e.inc || !r.pfActive {
		return
	}
	ps := s.cfg.PageSize
	end := min(r.pfDone+1+s.rng.IntN(2*ps), r.pfPrompt)
	for pos := r.pfDone; pos < end; pos++ {
		k, v := w.pool.LayerKV(r.pfPages[pos/ps], 0)
		base := (pos % ps) * 4
		for x := range 4 {
			k[base+x] = kvValue(e.req, pos, 0, 0, x)
			v[base+x] = kvValue(e.req, pos, 0, 1, x)
		}
	}
	r.pfDone = end
	if s.tr {
		s.tracef(int(e.req), "p%d engine: computed %d/%d", e.p, end, r.pfPrompt)
	}
	s.prefillOut(e.p, w.m.Computed(r.room, end))
	if s.viol != nil || !r.pfActive {
		return
	}
	if r.pfDone == r.pfPrompt {
		r.pfActive = false
		s.prefillOut(e.p, w.m.Sampled(r.room, firstToken(e.req)))
		return
	}
	s.push(event{at: s.now + 1 + s.rng.Int64N(10), kind: evCompute, p: e.p, req: e.req, inc: e.inc})
}

// ---- decode side ----

func (s *Sim) decodeOut(j int32, outs []transfer.Output) {
	w := &s.dc[j]
	for _, o := range outs {
		if s.viol != nil {
			return
		}
		if s.tr {
			s.tracef(s.outReq(o), "d%d: %v", j, o)
		}
		switch o := o.(type) {
		case transfer.Send:
			i, ok := s.prefillIndex(o.To)
			if !ok {
				s.violate(Once, s.reqIndex(o.Msg.Env().Room), -1, "d%d sent %v to unknown peer %d", j, o.Msg.Type(), o.To)
				return
			}
			s.sendPeer(false, i, j, int32(s.reqIndex(o.Msg.Env().Room)), o.Msg)
		case transfer.OpenWindow:
			q := s.reqIndex(o.Room)
			s.alloc(&w.shadow, o.Pages, q, "OpenWindow")
			if q >= 0 && s.reqs[q].tooLong && s.check(I3) {
				r := &s.reqs[q]
				s.violate(I3, q, -1, "%d pages reserved for a request admission must reject (prompt %d + max %d > window %d)",
					len(o.Pages), r.prompt, r.maxTokens, s.cfg.Window)
				return
			}
		case transfer.StartDecode:
			s.startDecoding(j, o)
		case transfer.Fail:
			s.decodeFail(j, o)
		case transfer.PagesReleased:
			s.stats.Released++
			s.release(&w.shadow, o.Pages, kvpool.Free, s.reqIndex(o.Room), "PagesReleased")
		case transfer.PagesDeferred:
			s.stats.Deferred++
			s.release(&w.shadow, o.Pages, kvpool.Deferred, s.reqIndex(o.Room), "PagesDeferred")
		case transfer.PagesQuarantined:
			s.stats.Quarantined++
			s.release(&w.shadow, o.Pages, kvpool.Quarantined, s.reqIndex(o.Room), "PagesQuarantined")
		}
	}
}

func (s *Sim) decodeFail(j int32, o transfer.Fail) {
	q := s.reqIndex(o.Room)
	if q < 0 {
		s.violate(Once, -1, -1, "d%d failed unknown room %v", j, o.Room)
		return
	}
	r := &s.reqs[q]
	s.decisionBy(r, j)
	k := reqerr.KindOf(o.Err)
	switch r.decided {
	case 0:
		r.decided = decFailed
		if k == reqerr.KindContextLength && s.check(I3) {
			_, live := s.dc[j].m.State(r.room)
			if c := s.dc[j].pool.RoomCounts(r.room); live || c.Total > 0 {
				s.violate(I3, q, -1, "rejected with %v but d%d still has the room (live %v) or its pages %+v", k, j, live, c)
				return
			}
		}
		s.end(int32(q), outError, k)
	case decStarted:
		// Only an abort stops a running sequence; the engine then stops
		// and calls Finish.
		if !r.dAborted && s.check(Once) {
			s.violate(Once, q, -1, "d%d failed (%v) a request it had started without an abort", j, k)
			return
		}
		r.decStop = true
	default:
		if s.check(Once) {
			s.violate(Once, q, -1, "d%d failed a request twice (second: %v)", j, k)
		}
	}
}

// decisionBy makes the exactly-once check per decode incarnation: a
// restarted decode worker is a new machine that never saw the previous
// one's decisions (the router ended those requests when it crashed).
func (s *Sim) decisionBy(r *request, j int32) {
	if inc := s.dc[j].inc; r.decidedInc != inc {
		if r.decided != 0 {
			s.stats.Redecided++
		}
		r.decidedInc, r.decided, r.dAborted = inc, 0, false
	}
}

func (s *Sim) startDecoding(j int32, o transfer.StartDecode) {
	w := &s.dc[j]
	q := s.reqIndex(o.Room)
	if q < 0 {
		s.violate(Once, -1, -1, "d%d started unknown room %v", j, o.Room)
		return
	}
	r := &s.reqs[q]
	s.decisionBy(r, j)
	if r.decided != 0 && s.check(Once) {
		s.violate(Once, q, -1, "d%d started a request it had already ended (decision %d)", j, r.decided)
		return
	}
	r.decided = decStarted
	r.decInc, r.decActive, r.decStop = w.inc, true, false
	r.decPages = append(r.decPages[:0], o.Pages...)
	r.decSteps = 1 + s.rng.IntN(3)
	s.push(event{at: s.now + 1 + s.rng.Int64N(8), kind: evDecode, d: j, req: int32(q), inc: w.inc})
	// The engine checks every page's fence before its first read, and fails
	// closed (the first step calls Finish).
	if !s.cfg.Protections.NoFenceCheck {
		if err := w.pool.VerifyFences(r.room, r.decPages); err != nil {
			s.stats.FenceFailsAtRead++
			r.decStop = true
			s.end(int32(q), outError, reqerr.KindIntegrity)
			if s.tr {
				s.tracef(q, "d%d engine: fence check before the first read failed: %v", j, err)
			}
			return
		}
	}
	// I4: the transfer is complete: the agreed prompt, one page per
	// ordinal, each last written by this request under this allocation's
	// fence, and the first token the prefill sampled.
	ps := s.cfg.PageSize
	if s.check(I4) {
		if o.PromptTokens != r.prompt || len(o.Pages) != (r.prompt+ps-1)/ps || o.FirstToken != firstToken(int32(q)) {
			s.violate(I4, q, -1, "decoding with prompt %d in %d pages, first token %d; the request has prompt %d (%d pages), first token %d",
				o.PromptTokens, len(o.Pages), o.FirstToken, r.prompt, (r.prompt+ps-1)/ps, firstToken(int32(q)))
			return
		}
	}
	for i, pg := range o.Pages {
		g := w.ghost[pg]
		exp := w.pool.Expected(pg)
		if g.req != int32(q) {
			if g.req >= 0 && s.check(I1) {
				s.violate(I1, q, int(g.req), "decoding from page %d (ordinal %d), whose data was last written for request %d", pg, i, g.req)
				return
			}
			if g.req < 0 && s.check(I4) {
				s.violate(I4, q, -1, "decoding from page %d (ordinal %d), never written", pg, i)
				return
			}
		} else if (g.ord != uint32(i) || g.epoch != exp.Epoch) && s.check(I4) {
			s.violate(I4, q, -1, "page %d holds ordinal %d of epoch %d, decoding wants ordinal %d of epoch %d", pg, g.ord, g.epoch, i, exp.Epoch)
			return
		}
	}
	s.readPrompt(j, int32(q), I1)
	if s.viol == nil && r.tooLong && s.check(I3) {
		s.violate(I3, q, -1, "a request admission must reject is decoding")
	}
}

// readPrompt is an attention read of the whole prompt: every token's K/V
// must be the request's own.
func (s *Sim) readPrompt(j int32, q int32, inv Invariant) {
	if !s.check(inv) {
		return
	}
	w := &s.dc[j]
	r := &s.reqs[q]
	ps := s.cfg.PageSize
	for pos := 0; pos < r.prompt; pos++ {
		if pos/ps >= len(r.decPages) {
			s.violate(I4, int(q), -1, "prompt position %d is beyond the %d pages decoding uses", pos, len(r.decPages))
			return
		}
		pg := r.decPages[pos/ps]
		k, v := w.pool.LayerKV(pg, 0)
		base := (pos % ps) * 4
		for x := range 4 {
			if k[base+x] != kvValue(q, pos, 0, 0, x) || v[base+x] != kvValue(q, pos, 0, 1, x) {
				s.violate(inv, int(q), int(w.ghost[pg].req), "read of prompt position %d in page %d is not this request's KV (page last written for request %d)",
					pos, pg, w.ghost[pg].req)
				return
			}
		}
	}
}

// decodeStep is one decode step of a running sequence: fence check (the
// engine's), then an attention read over the prompt.
func (s *Sim) decodeStep(e *event) {
	w := &s.dc[e.d]
	r := &s.reqs[e.req]
	if w.inc != e.inc || r.decInc != e.inc || !r.decActive {
		return
	}
	finish := func() {
		r.decActive = false
		if s.tr {
			s.tracef(int(e.req), "d%d engine: Finish", e.d)
		}
		s.decodeOut(e.d, w.m.Finish(r.room))
	}
	if r.decStop {
		finish()
		return
	}
	if !s.cfg.Protections.NoFenceCheck {
		if err := w.pool.VerifyFences(r.room, r.decPages); err != nil {
			s.stats.FenceFailsAtRead++
			if s.tr {
				s.tracef(int(e.req), "d%d engine: fence check failed: %v", e.d, err)
			}
			s.end(e.req, outError, reqerr.KindIntegrity)
			finish()
			return
		}
	}
	s.readPrompt(e.d, e.req, I1)
	if s.viol != nil {
		return
	}
	if r.decSteps--; r.decSteps > 0 {
		s.push(event{at: s.now + 1 + s.rng.Int64N(8), kind: evDecode, d: e.d, req: e.req, inc: e.inc})
		return
	}
	s.end(e.req, outSuccess, 0)
	finish()
}

// ---- accounting ----

func (s *Sim) alloc(sh *shadow, pages []int32, q int, what string) {
	for _, pg := range pages {
		if sh.state[pg] != kvpool.Free {
			if s.check(I5) {
				s.violate(I5, q, -1, "%s allocated page %d, which the outputs left %v", what, pg, sh.state[pg])
			}
			return
		}
		sh.counts[kvpool.Free]--
		sh.counts[kvpool.Allocated]++
		sh.state[pg] = kvpool.Allocated
	}
}

func (s *Sim) release(sh *shadow, pages []int32, to kvpool.State, q int, what string) {
	for _, pg := range pages {
		from := sh.state[pg]
		ok := from != kvpool.Free && from != to && !(to == kvpool.Deferred && from != kvpool.Allocated)
		if !ok {
			if s.check(I5) {
				s.violate(I5, q, -1, "%s moved page %d from %v to %v", what, pg, from, to)
			}
			return
		}
		sh.counts[from]--
		sh.counts[to]++
		sh.state[pg] = to
	}
}

// checkAccounting is I5 after every event: each pool's counts equal the
// accounting rebuilt from the machines' outputs (and so add up to the
// total); every 64 events, page by page.
func (s *Sim) checkAccounting() {
	if !s.check(I5) {
		return
	}
	full := s.events%64 == 0
	for i := range s.pf {
		s.comparePool("p", i, s.pf[i].pool, &s.pf[i].shadow, full)
	}
	for j := range s.dc {
		s.comparePool("d", j, s.dc[j].pool, &s.dc[j].shadow, full)
	}
}

func (s *Sim) comparePool(side string, idx int, pool *kvpool.Pool, sh *shadow, full bool) {
	if s.viol != nil {
		return
	}
	c := pool.Counts()
	got := [4]int{c.Free, c.Allocated, c.Deferred, c.Quarantined}
	if got != sh.counts || c.Free+c.Allocated+c.Deferred+c.Quarantined != c.Total {
		s.violate(I5, -1, -1, "%s%d pool counts free/alloc/defer/quar %v, outputs say %v (total %d)", side, idx, got, sh.counts, c.Total)
		return
	}
	if full {
		for pg, want := range sh.state {
			if st := pool.State(int32(pg)); st != want {
				s.violate(I5, s.reqIndex(pool.Expected(int32(pg)).Room), -1, "%s%d page %d is %v, outputs say %v", side, idx, pg, st, want)
				return
			}
		}
	}
}

// checkRest runs when the queue is empty: every request ended once, and
// every pool is back to all free.
func (s *Sim) checkRest() {
	for q := range s.reqs {
		if s.reqs[q].out == outNone && s.check(Liveness) {
			s.violate(Liveness, q, -1, "request never ended")
			return
		}
	}
	if !s.check(I5) {
		return
	}
	for i := range s.pf {
		if c := s.pf[i].pool.Counts(); c.Free != c.Total {
			s.violate(I5, -1, -1, "at rest p%d pool is not all free: %+v", i, c)
			return
		}
	}
	for j := range s.dc {
		if c := s.dc[j].pool.Counts(); c.Free != c.Total {
			s.violate(I5, -1, -1, "at rest d%d pool is not all free: %+v", j, c)
			return
		}
	}
}

// outReq is the request an output concerns, for traces.
func (s *Sim) outReq(o transfer.Output) int {
	var room transfer.RoomID
	switch o := o.(type) {
	case transfer.Send:
		room = o.Msg.Env().Room
	case transfer.PostWrite:
		room = o.Msg.Room
	case transfer.OpenWindow:
		room = o.Room
	case transfer.RevokeWindow:
		room = o.Room
	case transfer.StartDecode:
		room = o.Room
	case transfer.Fail:
		room = o.Room
	case transfer.RunPrefill:
		room = o.Room
	case transfer.StopPrefill:
		room = o.Room
	case transfer.PagesReleased:
		room = o.Room
	case transfer.PagesDeferred:
		room = o.Room
	case transfer.PagesQuarantined:
		room = o.Room
	case transfer.Dropped:
		room = o.Room
	}
	return s.reqIndex(room)
}
