package router

import "sync/atomic"

// slot is one worker as the pairing sees it: its position in the Router's
// list and the requests the Router has in flight on it. The router's own
// count moves the moment a request is assigned, so a burst of requests
// spreads at once instead of piling onto whichever worker reported the lowest
// load last.
type slot struct {
	inFlight atomic.Int64
}

// pickLeast returns the index of the candidate with the lowest load among
// those ok reports usable, starting the scan at start (rotating the start
// breaks ties round-robin), or -1 when none is usable.
func pickLeast(n, start int, ok func(i int) bool, load func(i int) int64) int {
	best, bestLoad := -1, int64(0)
	for k := range n {
		i := (start + k) % n
		if !ok(i) {
			continue
		}
		if l := load(i); best < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best
}
