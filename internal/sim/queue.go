package sim

import "github.com/kvfence/kvfence/internal/transfer"

type evKind uint8

const (
	evArrive    evKind = iota + 1 // a request reaches the router
	evDeliver                     // a control message reaches a worker
	evLand                        // a posted page write reaches the decode worker's NIC
	evLanded                      // the transport reports a posted write finished
	evCompute                     // the prefill engine finishes a chunk
	evDecode                      // the decode engine runs a step
	evAbort                       // the client goes away
	evTimeout                     // the router gives up on a request
	evTick                        // every machine's clock advances
	evPeerEpoch                   // a worker learns that a connection is new
	evCrash                       // a worker crashes and restarts
	evReset                       // a connection is closed and re-established
)

var evNames = [...]string{"", "arrive", "deliver", "land", "landed", "compute", "decode", "abort", "timeout",
	"tick", "peer-epoch", "crash", "reset"}

func (k evKind) String() string { return evNames[k] }

// event is one scheduled happening. Events are values in the queue; the
// only pointer is the message, which machines never modify (so one message
// may be delivered twice: a duplicate).
type event struct {
	at   int64
	seq  uint64 // tie-break: events at the same time run in schedule order
	kind evKind
	toP  bool  // evDeliver, evPeerEpoch, evCrash: the prefill side (else decode)
	rtr  bool  // evDeliver: sent by the router (else by the peer worker)
	p, d int32 // worker indices
	req  int32 // request index, -1 for none
	inc  uint32
	ep   uint64 // connection epoch the message or write was sent on
	n    uint64 // write sequence number (evLanded)
	msg  transfer.Message
}

// queue is a binary min-heap of events ordered by (at, seq). It is written
// out rather than built on container/heap so that pushing an event does not
// box it.
type queue struct{ h []event }

func (q *queue) len() int { return len(q.h) }

func (q *queue) reset() {
	clear(q.h) // drop message pointers
	q.h = q.h[:0]
}

func less(a, b *event) bool { return a.at < b.at || (a.at == b.at && a.seq < b.seq) }

func (q *queue) push(e event) {
	q.h = append(q.h, e)
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(&q.h[i], &q.h[p]) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

func (q *queue) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h[n] = event{}
	q.h = q.h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && less(&q.h[r], &q.h[l]) {
			m = r
		}
		if !less(&q.h[m], &q.h[i]) {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return top
}
