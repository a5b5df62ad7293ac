/*
 * kvfence transfer protocol (DESIGN.md §4), modelled for spin.
 *
 * One router, one prefill worker P, one decode worker D, a decode page pool
 * of NPAGES pages reused by successive rooms. Control messages travel on
 * asynchronous FIFO channels (one per direction, as on one connection);
 * page writes travel on their own channel and are landed by a separate NIC
 * process, so a write posted before an abort can land after it: a posted
 * write cannot be cancelled. The NIC consults nothing but the window table
 * (win[]) and the connection epoch, exactly as DESIGN.md §6 says a receiver
 * may.
 *
 * Safety properties are asserts, tagged I1..I5 as in DESIGN.md §5. Ghost
 * variables (writer[], too_long[], prejected[]) record the truth the
 * workers cannot see; the workers never read them.
 *
 * Configurations (pass one -D flag to spin; the default is SAFE):
 *   SAFE                       every protection on: must verify.
 *   NO_REVOKE_NO_DEFER         abort frees pages at once: counterexample (I2).
 *   DRAINED_WITHOUT_TOMBSTONE  P acks drained but keeps the room alive and
 *                              no window revocation: counterexample (I2).
 *   REJECTED_BUT_ALIVE         placeholder admission, no page-count
 *                              agreement, no fence or checksum check:
 *                              counterexample (I1).
 *     with -DKEEP_FENCE or -DKEEP_PAGECOUNT (and -DNO_I3): each of
 *     those protections alone stops the foreign read: must verify.
 *   REVOKE_ONLY                revocation without deferred release or
 *                              tombstones: must verify.
 *   DEFER_ONLY                 deferred release + tombstones without
 *                              revocation: must verify.
 * See README.md for the mapping of names to the Go code.
 */

#ifndef NROOMS
#define NROOMS 2
#endif
#define NPAGES 2
#define MAXNEED 2

/* Fault budgets: keep the state space small. */
#ifndef MAXABORT
#define MAXABORT 2
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXTIMEOUT
#define MAXTIMEOUT 1
#endif
#ifndef MAXPREJECT
#define MAXPREJECT 1
#endif

/* Protections, 1 = on (transfer.Protections in the Go code). */
#define FENCE 1
#define REVOKE 1
#define DEFER 1
#define TOMBSTONE 1
#define CHECKSUM 1
#define PAGECOUNT 1
#define ADMISSION 1

#ifdef NO_REVOKE_NO_DEFER
#undef REVOKE
#define REVOKE 0
#undef DEFER
#define DEFER 0
#endif

#ifdef DRAINED_WITHOUT_TOMBSTONE
#undef REVOKE
#define REVOKE 0
#undef TOMBSTONE
#define TOMBSTONE 0
#endif

#ifdef REJECTED_BUT_ALIVE
#undef ADMISSION
#define ADMISSION 0
#ifndef KEEP_PAGECOUNT
#undef PAGECOUNT
#define PAGECOUNT 0
#endif
#ifndef KEEP_FENCE
#undef FENCE
#define FENCE 0
#endif
#undef CHECKSUM
#define CHECKSUM 0
#endif

/* NO_I3 drops the I3 asserts: with placeholder admission the client can
 * never get the original error, but the other protections must still
 * stop the foreign read (KEEP_FENCE, KEEP_PAGECOUNT). */
#ifdef NO_I3
#define ASSERT_I3(c) skip
#else
#define ASSERT_I3(c) assert(c)
#endif

#ifdef REVOKE_ONLY
#undef DEFER
#define DEFER 0
#undef TOMBSTONE
#define TOMBSTONE 0
#endif

#ifdef DEFER_ONLY
#undef REVOKE
#define REVOKE 0
#endif

/* Reachability probes: with -DREACH=n, probe n fails as soon as its event
 * happens, so spin proves the event reachable (the test runs each one, so
 * the SAFE verification is not vacuous). */
#ifndef REACH
#define REACH 0
#endif
#define PROBE(n) assert(REACH != n)

mtype = { Open, Prefill, Grant, Reject, Write, Done, Abort, Drained, PeerEpoch, Result };

/* Page states (kvpool.State). */
#define F_FREE  0
#define F_ALLOC 1
#define F_DEFER 2
#define F_QUAR  3

/* Decode-side room states. */
#define D_NONE     0
#define D_QUEUED   1
#define D_GRANTED  2
#define D_DECODING 3
#define D_DEFER    4
#define D_DONE     5

/* Outcomes a client can see (reqerr.Kind). */
#define K_NONE      0
#define K_OK        1
#define K_TOOLONG   2
#define K_ABORTED   3
#define K_INTEGRITY 4
#define K_PEER      5
#define K_OVERLOAD  6
#define K_MISMATCH  7

/* Channels. Rooms are 1..NROOMS; 0 is "no room". */
chan r2d  = [2 * NROOMS] of { mtype, byte, byte, bool };          /* Open(r, pages, too long) | Abort(r, _, _) */
chan r2p  = [2 * NROOMS] of { mtype, byte, byte, bool };          /* Prefill(r, pages, too long) | Abort(r, _, _) */
chan d2p  = [2 * NROOMS] of { mtype, byte, byte, byte, byte, byte, byte, byte }; /* Grant(r, count, p0, e0, p1, e1, conn epoch) | Reject(r, kind, ...) */
chan p2d  = [3 * NROOMS + 1] of { mtype, byte, byte };            /* Reject(r, kind) | Done(r, pages) | Drained(r, _) | PeerEpoch(_, epoch) */
chan rtr  = [2 * NROOMS] of { mtype, byte, byte };                /* Result(r, kind) to the router */
chan wire = [NROOMS * MAXNEED] of { mtype, byte, byte, byte, byte }; /* Write(r, page, epoch, conn epoch) */

/* Decode pool (kvpool.Pool). */
byte pstate[NPAGES];   /* F_* */
byte powner[NPAGES];   /* room of the expected fence */
byte pep[NPAGES];      /* epoch of the expected fence: ++ on every allocation */
byte hroom[NPAGES];    /* header fence as last written: room */
byte hep[NPAGES];      /*                                epoch */
byte nfree = NPAGES;
byte nalloc;
byte ndefer;
byte nquar;
bool win[NROOMS + 1];  /* window W(r) open (transfer.WindowTable) */
byte cepoch;           /* connection epoch P<->D; writes of older epochs never land */

/* Ghosts (truth the workers cannot see). */
byte writer[NPAGES];         /* room whose KV data the page holds */
bool too_long[NROOMS + 1];   /* the router's admission must reject it */
bool prejected[NROOMS + 1];  /* P rejected the room */

/* Decode worker D. */
byte dstate[NROOMS + 1];
byte dneed[NROOMS + 1];
byte dpg[(NROOMS + 1) * MAXNEED];
bool ddrained[NROOMS + 1];
byte dcep;                   /* connection epoch D believes in */
byte nres[NROOMS + 1];       /* results D sent per room (exactly once) */
byte nto;

/* Prefill worker P. */
bool phave[NROOMS + 1];      /* has the Prefill request */
byte pn[NROOMS + 1];         /* pages P will write (1 for a placeholder) */
bool pgr[NROOMS + 1];        /* has the Grant */
byte pcnt[NROOMS + 1];       /* page count in the grant */
byte ppg[(NROOMS + 1) * MAXNEED];
byte ppe[(NROOMS + 1) * MAXNEED];
byte pnext[NROOMS + 1];      /* next grant page to write */
bool pdone[NROOMS + 1];      /* Done sent */
bool ptomb[NROOMS + 1];      /* tombstone */
bool powe[NROOMS + 1];       /* owes a Drained */
byte pending[NROOMS + 1];    /* posted writes not yet acknowledged */
byte ncrash;
byte nprej;

/* Router. */
byte outcome[NROOMS + 1];
bool aborted[NROOMS + 1];
byte nopen = 1;
byte nab;

/* Scratch, not part of the state vector: only used inside atomic steps. */
hidden byte t_r, t_n, t_k, t_c, t_i, t_p, t_ok, g0, e0, g1, e1;
hidden byte w_r, w_p, w_e, w_c;

/* ---------------- decode side ---------------- */

inline check_acct() {
	/* I5: every page is in exactly one state and the counters agree. */
	t_i = 0; t_n = 0; t_k = 0; t_c = 0; t_p = 0;
	do
	:: t_i < NPAGES ->
		if
		:: pstate[t_i] == F_FREE -> t_n++
		:: pstate[t_i] == F_ALLOC -> t_k++
		:: pstate[t_i] == F_DEFER -> t_c++
		:: pstate[t_i] == F_QUAR -> t_p++
		fi;
		t_i++
	:: else -> break
	od;
	assert(t_n == nfree && t_k == nalloc && t_c == ndefer && t_p == nquar);
	assert(nfree + nalloc + ndefer + nquar == NPAGES);
	t_i = 0; t_n = 0; t_k = 0; t_c = 0; t_p = 0
}

inline revoke(r) {
#if REVOKE
	win[r] = 0
#else
	skip
#endif
}

/* Move every page of r from its current state to state s. */
inline pages_to(r, s) {
	t_i = 0;
	do
	:: t_i < dneed[r] ->
		t_p = dpg[r * MAXNEED + t_i];
		assert(powner[t_p] == r && pstate[t_p] != F_FREE);
		if
		:: pstate[t_p] == F_ALLOC -> nalloc--
		:: pstate[t_p] == F_DEFER -> ndefer--
		:: pstate[t_p] == F_QUAR -> nquar--
		fi;
		pstate[t_p] = s;
		if
		:: s == F_FREE -> nfree++; powner[t_p] = 0
		:: s == F_DEFER -> ndefer++
		:: s == F_QUAR -> nquar++
		fi;
		t_i++
	:: else -> break
	od;
	t_i = 0; t_p = 0
}

inline finish(r) {
	dstate[r] = D_DONE;
	/* I3/I5: a finished room holds no allocated or deferred page. */
	t_i = 0;
	do
	:: t_i < NPAGES -> assert(powner[t_i] != r || pstate[t_i] == F_QUAR || pstate[t_i] == F_FREE); t_i++
	:: else -> break
	od;
	t_i = 0
}

inline result(r, k) {
	nres[r]++;
	assert(nres[r] == 1);   /* a request ends exactly once */
	rtr!Result(r, k)
}

/* Admit queued rooms in arrival order while their pages fit. */
inline admit() {
	t_r = 1;
	do
	:: t_r <= NROOMS && dstate[t_r] != D_QUEUED -> t_r++
	:: t_r <= NROOMS && dstate[t_r] == D_QUEUED && nfree >= dneed[t_r] ->
#if ADMISSION
		assert(!too_long[t_r]);   /* I3: rejected means never reserved */
#endif
		t_i = 0; t_p = 0;
		do
		:: t_i < dneed[t_r] ->
			do
			:: pstate[t_p] == F_FREE -> break
			:: else -> t_p++
			od;
			pstate[t_p] = F_ALLOC; nfree--; nalloc++;
			pep[t_p]++; powner[t_p] = t_r;
			dpg[t_r * MAXNEED + t_i] = t_p;
			t_i++
		:: else -> break
		od;
		win[t_r] = 1;
		dstate[t_r] = D_GRANTED;
		g0 = dpg[t_r * MAXNEED]; e0 = pep[g0];
		if
		:: dneed[t_r] > 1 -> g1 = dpg[t_r * MAXNEED + 1]; e1 = pep[g1]
		:: else -> g1 = 0; e1 = 0
		fi;
		if
		:: cepoch == dcep -> d2p!Grant(t_r, dneed[t_r], g0, e0, g1, e1, dcep)
		:: else -> skip   /* sent on a dead connection: lost */
		fi;
		t_r++
	:: t_r <= NROOMS && dstate[t_r] == D_QUEUED && nfree < dneed[t_r] -> break  /* FIFO: head waits */
	:: t_r > NROOMS -> break
	od;
	t_r = 0; t_i = 0; t_p = 0; g0 = 0; e0 = 0; g1 = 0; e1 = 0
}

inline d_abort(r) {
	if
	:: dstate[r] == D_QUEUED -> finish(r)
	:: dstate[r] == D_GRANTED ->
		revoke(r);
		if
		:: DEFER && !ddrained[r] -> pages_to(r, F_DEFER); dstate[r] = D_DEFER
		:: else -> pages_to(r, F_FREE); finish(r)
		fi
	:: dstate[r] == D_DECODING -> pages_to(r, F_FREE); finish(r)
	:: else -> skip
	fi
}

/* P says it will never write for r again: Reject, or Drained. */
inline d_quiet(r) {
	ddrained[r] = 1;
	if
	:: dstate[r] == D_NONE || dstate[r] == D_QUEUED -> finish(r)
	:: dstate[r] == D_GRANTED -> PROBE(8); revoke(r); pages_to(r, F_FREE); finish(r)
	:: dstate[r] == D_DEFER -> PROBE(4); pages_to(r, F_FREE); finish(r)
	:: else -> skip
	fi
}

inline integrity_fail(r) {
	revoke(r); pages_to(r, F_QUAR); result(r, K_INTEGRITY); finish(r)
}

/* Done(r, n): verify every granted page, then decode. */
inline d_done(r, n) {
	t_ok = 1;
#if PAGECOUNT
	if :: n != dneed[r] -> t_ok = 0 :: else -> skip fi;
#endif
	/* Without page-count agreement D trusts the writer's count and checks
	 * only the pages Done lists (as (*DecodeMachine).verify does). */
	t_i = 0;
	do
	:: t_i < dneed[r] && (PAGECOUNT || t_i < n) ->
		t_p = dpg[r * MAXNEED + t_i];
#if FENCE
		if :: hroom[t_p] != r || hep[t_p] != pep[t_p] -> t_ok = 0 :: else -> skip fi;
#endif
#if CHECKSUM
		/* A page without a checksum in Done fails; the checksum is over
		 * the data P wrote for r. */
		if :: t_i >= n || writer[t_p] != r -> t_ok = 0 :: else -> skip fi;
#endif
		t_i++
	:: else -> break
	od;
	if
	:: t_ok ->
		revoke(r);
		/* StartDecode. The engine checks every page's fence before its
		 * first read and fails closed (Finish frees the pages). */
		d_readfences(r);
		if
		:: t_ok ->
			t_i = 0;
			do
			:: t_i < dneed[r] ->
				t_p = dpg[r * MAXNEED + t_i];
				assert(writer[t_p] == r);                       /* I1 */
				assert(hroom[t_p] == r && hep[t_p] == pep[t_p]); /* I4 */
				t_i++
			:: else -> break
			od;
			assert(n == dneed[r]);                                  /* I4: pages and tokens */
			ASSERT_I3(!too_long[r] && !prejected[r]);               /* I3 */
			dstate[r] = D_DECODING
		:: else -> pages_to(r, F_FREE); result(r, K_INTEGRITY); finish(r)
		fi
	:: else -> integrity_fail(r)
	fi;
	t_ok = 0; t_i = 0; t_p = 0
}

/* The engine's fence check before a read (kvpool.VerifyFences): t_ok = 0
 * on a mismatch. */
inline d_readfences(r) {
	t_i = 0;
	do
	:: t_i < dneed[r] ->
		t_p = dpg[r * MAXNEED + t_i];
#if FENCE
		if :: hroom[t_p] != r || hep[t_p] != pep[t_p] -> t_ok = 0 :: else -> skip fi;
#endif
		t_i++
	:: else -> break
	od
}

/* Run the decode steps: every page read checks its fence first. */
inline d_decode(r) {
	t_ok = 1;
	d_readfences(r);
	if
	:: t_ok ->
		t_i = 0;
		do
		:: t_i < dneed[r] -> assert(writer[dpg[r * MAXNEED + t_i]] == r); t_i++   /* I1 */
		:: else -> break
		od;
		if :: pep[dpg[r * MAXNEED]] >= 2 -> PROBE(3) :: else -> skip fi;
		if :: dneed[r] == 2 -> PROBE(7) :: else -> skip fi;
		pages_to(r, F_FREE); result(r, K_OK); finish(r)
	:: else -> integrity_fail(r)
	fi;
	t_ok = 0; t_i = 0; t_p = 0
}

/* The connection to P was re-established: no write of an older connection
 * can land, so deferred and quarantined pages are safe to free and rooms
 * waiting for P fail. */
inline d_peer_epoch(e) {
	dcep = e;
	t_r = 1;
	do
	:: t_r <= NROOMS ->
		if
		:: dstate[t_r] == D_GRANTED -> revoke(t_r); pages_to(t_r, F_FREE); result(t_r, K_PEER); finish(t_r)
		:: dstate[t_r] == D_DEFER -> pages_to(t_r, F_FREE); finish(t_r)
		:: else -> skip
		fi;
		t_r++
	:: else -> break
	od;
	t_p = 0;
	do
	:: t_p < NPAGES ->
		if
		:: pstate[t_p] == F_QUAR -> PROBE(5); pstate[t_p] = F_FREE; nquar--; nfree++; powner[t_p] = 0
		:: else -> skip
		fi;
		t_p++
	:: else -> break
	od;
	t_r = 0; t_p = 0
}

#define DTIMEOUT(R) :: atomic { dstate[R] == D_DEFER && nto < MAXTIMEOUT -> nto++; pages_to(R, F_QUAR); finish(R); admit(); check_acct() }
#define DDECODE(R)  :: atomic { dstate[R] == D_DECODING -> d_decode(R); admit(); check_acct() }

active proctype DecodeWorker() {
end:
	do
	:: atomic { r2d?Open(t_r, t_n, t_k) ->
		if
		:: dstate[t_r] != D_NONE -> skip   /* P already rejected it */
		:: dstate[t_r] == D_NONE && t_k && ADMISSION ->
			/* Admission before reservation: reject with the original
			 * error, reserve nothing, tell P. */
			result(t_r, K_TOOLONG); finish(t_r);
			if
			:: cepoch == dcep -> d2p!Reject(t_r, K_TOOLONG, 0, 0, 0, 0, dcep)
			:: else -> skip   /* sent on a dead connection: lost */
			fi
		:: dstate[t_r] == D_NONE && !(t_k && ADMISSION) -> dstate[t_r] = D_QUEUED; dneed[t_r] = t_n
		fi;
		admit(); check_acct() }
	:: atomic { r2d?Abort(t_r, t_n, t_k) -> d_abort(t_r); admit(); check_acct() }
	:: atomic { p2d?Reject(t_r, t_k) -> d_quiet(t_r); admit(); check_acct() }
	:: atomic { p2d?Drained(t_r, t_n) -> d_quiet(t_r); admit(); check_acct() }
	:: atomic { p2d?Done(t_r, t_n) ->
		if
		:: dstate[t_r] == D_GRANTED -> d_done(t_r, t_n)
		:: else -> skip
		fi;
		admit(); check_acct() }
	:: atomic { p2d?PeerEpoch(t_r, t_c) -> d_peer_epoch(t_c); admit(); check_acct() }
	DDECODE(1)
	DDECODE(2)
#if NROOMS > 2
	DDECODE(3)
#endif
	DTIMEOUT(1)
	DTIMEOUT(2)
#if NROOMS > 2
	DTIMEOUT(3)
#endif
	od
}

/* ---------------- prefill side ---------------- */

inline p_clear(r) {
	phave[r] = 0; pn[r] = 0; pgr[r] = 0; pcnt[r] = 0; pnext[r] = 0; pdone[r] = 0;
	ppg[r * MAXNEED] = 0; ppe[r * MAXNEED] = 0; ppg[r * MAXNEED + 1] = 0; ppe[r * MAXNEED + 1] = 0
}

inline p_reject(r, k) {
#if TOMBSTONE
	ptomb[r] = 1;
#endif
	prejected[r] = 1;
	p_clear(r);
	p2d!Reject(r, k);
	rtr!Result(r, k)
}

inline p_agree(r) {
#if PAGECOUNT
	if
	:: phave[r] && pgr[r] && pcnt[r] != pn[r] -> p_reject(r, K_MISMATCH)
	:: else -> skip
	fi
#else
	skip
#endif
}

#define PPOST(R) :: atomic { phave[R] && pgr[R] && !ptomb[R] && pnext[R] < pn[R] && pnext[R] < pcnt[R] -> \
	wire!Write(R, ppg[R * MAXNEED + pnext[R]], ppe[R * MAXNEED + pnext[R]], cepoch); \
	pending[R]++; pnext[R]++ }
#define PDONE(R) :: atomic { phave[R] && pgr[R] && !ptomb[R] && !pdone[R] && pending[R] == 0 && \
	(pnext[R] == pn[R] || pnext[R] == pcnt[R]) -> pdone[R] = 1; p2d!Done(R, pnext[R]) }
#define PDRAIN(R) :: atomic { powe[R] && pending[R] == 0 -> powe[R] = 0; p2d!Drained(R, 0) }

active proctype PrefillWorker() {
end:
	do
	:: atomic { r2p?Prefill(t_r, t_n, t_k) ->
		if
		:: ptomb[t_r] -> skip
		:: !ptomb[t_r] && t_k && ADMISSION -> p_reject(t_r, K_TOOLONG)
		:: !ptomb[t_r] && t_k && !ADMISSION ->
			/* "rejected but alive": a one-token placeholder flows on */
			phave[t_r] = 1; pn[t_r] = 1; p_agree(t_r)
		:: !ptomb[t_r] && !t_k ->
			if
			:: nprej < MAXPREJECT -> nprej++; p_reject(t_r, K_OVERLOAD)   /* e.g. own pool full */
			:: true -> phave[t_r] = 1; pn[t_r] = t_n; p_agree(t_r)
			fi
		fi;
		t_r = 0; t_n = 0; t_k = 0 }
	:: atomic { d2p?Reject(t_r, t_k, g0, e0, g1, e1, t_c) ->
		/* D refused the room before reserving anything. */
#if TOMBSTONE
		ptomb[t_r] = 1;
#endif
		p_clear(t_r);
		t_r = 0; t_k = 0; t_c = 0; g0 = 0; e0 = 0; g1 = 0; e1 = 0 }
	:: atomic { r2p?Abort(t_r, t_n, t_k) ->
#if TOMBSTONE
		ptomb[t_r] = 1; p_clear(t_r);
#endif
		powe[t_r] = 1;
		t_r = 0; t_n = 0; t_k = 0 }
	:: atomic { d2p?Grant(t_r, t_n, g0, e0, g1, e1, t_c) ->
		if
		:: t_c != cepoch || ptomb[t_r] -> PROBE(6)   /* stale connection, or tombstoned */
		:: else ->
			pgr[t_r] = 1; pcnt[t_r] = t_n;
			ppg[t_r * MAXNEED] = g0; ppe[t_r * MAXNEED] = e0;
			ppg[t_r * MAXNEED + 1] = g1; ppe[t_r * MAXNEED + 1] = e1;
			p_agree(t_r)
		fi;
		t_r = 0; t_n = 0; t_c = 0; g0 = 0; e0 = 0; g1 = 0; e1 = 0 }
	PPOST(1)
	PPOST(2)
	PDONE(1)
	PDONE(2)
	PDRAIN(1)
	PDRAIN(2)
#if NROOMS > 2
	PPOST(3)
	PDONE(3)
	PDRAIN(3)
#endif
	/* Crash and restart (or a connection reset): P forgets everything, the
	 * connection's messages are lost, its posted writes will never land. */
	:: atomic { ncrash < MAXCRASH ->
		ncrash++; cepoch++;
		t_r = 1;
		do
		:: t_r <= NROOMS -> p_clear(t_r); ptomb[t_r] = 0; powe[t_r] = 0; pending[t_r] = 0; t_r++
		:: else -> break
		od;
		do :: p2d?_, _, _ :: empty(p2d) -> break od;
		do :: d2p?_, _, _, _, _, _, _, _ :: empty(d2p) -> break od;
		/* (D's messages sent before it learns the new epoch are lost
		 * too: D sends only while cepoch == dcep.) */
		p2d!PeerEpoch(0, cepoch);
		t_r = 0 }
	od
}

/* ---------------- the NIC on D's side ---------------- */

active proctype Nic() {
end:
	do
	:: atomic { wire?Write(w_r, w_p, w_e, w_c) ->
		if
		:: w_c != cepoch -> PROBE(2)   /* connection gone: the write never lands */
		:: else ->
			if
			:: win[w_r] ->
				/* I2: a write lands only in a page still held under its fence. */
				assert(pstate[w_p] != F_FREE && powner[w_p] == w_r && pep[w_p] == w_e);
				if :: pstate[w_p] == F_DEFER -> PROBE(9) :: else -> skip fi;
				hroom[w_p] = w_r; hep[w_p] = w_e; writer[w_p] = w_r
			:: else -> PROBE(1)   /* window revoked: refused */
			fi;
			pending[w_r]--
		fi;
		w_r = 0; w_p = 0; w_e = 0; w_c = 0 }
	od
}

/* ---------------- router ---------------- */

#define RABORT(R) :: atomic { nopen > R && !aborted[R] && outcome[R] == K_NONE && nab < MAXABORT -> \
	nab++; aborted[R] = 1; outcome[R] = K_ABORTED; r2d!Abort(R, 0, 0); r2p!Abort(R, 0, 0) }

#define RESTING(R) (dstate[R] == D_DONE)
#if NROOMS > 2
#define ALLRESTING (RESTING(1) && RESTING(2) && RESTING(3))
#else
#define ALLRESTING (RESTING(1) && RESTING(2))
#endif

/* Room r needs r pages (1..MAXNEED); room 2's client may ask for more
 * tokens than the window allows (prompt + max_tokens too long). */
active proctype Router() {
end:
	do
	:: atomic { nopen <= NROOMS ->
		t_r = nopen; nopen++;
		t_n = (t_r - 1) % MAXNEED + 1;
		if
		:: t_r == 2 -> too_long[2] = 1
		:: true -> skip
		fi;
		r2d!Open(t_r, t_n, too_long[t_r]); r2p!Prefill(t_r, t_n, too_long[t_r]);
		t_r = 0; t_n = 0 }
	RABORT(1)
	RABORT(2)
#if NROOMS > 2
	RABORT(3)
#endif
	:: atomic { rtr?Result(t_r, t_k) ->
		if
		:: outcome[t_r] == K_NONE ->
			outcome[t_r] = t_k;
			/* I3: a request admission must reject gets the original error. */
			ASSERT_I3(!too_long[t_r] || t_k == K_TOOLONG)
		:: else -> skip
		fi;
		t_r = 0; t_k = 0 }
	:: atomic { nopen > NROOMS && ALLRESTING -> assert(nalloc == 0 && ndefer == 0); break }   /* I5 at rest */
	od
}
