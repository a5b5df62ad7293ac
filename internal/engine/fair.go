package engine

import "slices"

// fairQueue orders waiting requests round-robin over tenants: each tenant
// has a FIFO, and admission takes the head of the next tenant in turn, so
// one tenant's flood waits behind its own requests, not in front of
// everyone else's. Owned by a driver goroutine.
type fairQueue struct {
	queues map[string][]*dreq
	ring   []string // tenants with a non-empty queue, in turn order
	next   int      // index in ring of the tenant whose turn it is
	n      int
}

func newFairQueue() fairQueue { return fairQueue{queues: make(map[string][]*dreq)} }

func (f *fairQueue) len() int { return f.n }

func (f *fairQueue) push(tenant string, q *dreq) {
	if len(f.queues[tenant]) == 0 {
		// A tenant that becomes busy goes last in the current round.
		f.ring = slices.Insert(f.ring, f.next, tenant)
		f.next++
		if f.next >= len(f.ring) {
			f.next = 0
		}
	}
	f.queues[tenant] = append(f.queues[tenant], q)
	f.n++
}

// peek returns the request whose turn it is.
func (f *fairQueue) peek() *dreq {
	if len(f.ring) == 0 {
		return nil
	}
	return f.queues[f.ring[f.next]][0]
}

// pop removes the request peek returned and passes the turn on.
func (f *fairQueue) pop() {
	t := f.ring[f.next]
	q := f.queues[t]
	q[0] = nil
	f.queues[t] = q[1:]
	f.n--
	if len(f.queues[t]) == 0 {
		delete(f.queues, t)
		f.ring = slices.Delete(f.ring, f.next, f.next+1)
	} else {
		f.next++
	}
	if f.next >= len(f.ring) {
		f.next = 0
	}
}

// remove takes q out wherever it is (a request that ended while waiting).
func (f *fairQueue) remove(q *dreq) {
	t := q.req.Tenant
	qs := f.queues[t]
	i := slices.Index(qs, q)
	if i < 0 {
		return
	}
	f.queues[t] = slices.Delete(qs, i, i+1)
	f.n--
	if len(f.queues[t]) > 0 {
		return
	}
	delete(f.queues, t)
	j := slices.Index(f.ring, t)
	f.ring = slices.Delete(f.ring, j, j+1)
	if j < f.next {
		f.next--
	}
	if f.next >= len(f.ring) {
		f.next = 0
	}
}

// all returns every waiting request (for shutdown).
func (f *fairQueue) all() []*dreq {
	var out []*dreq
	for _, t := range f.ring {
		out = append(out, f.queues[t]...)
	}
	return out
}
