package sim

import (
	"runtime"
	"sync"
)

// parallelSweep runs n seeds from `from` on every core. Each seed is an
// independent, deterministic run; only the order results are summed in
// varies, and sums commute.
func parallelSweep(from uint64, n int, cfgOf func(seed uint64) Config, maxViolations int) (Stats, []*Violation) {
	var (
		mu    sync.Mutex // guards total, vs and next
		total Stats
		vs    []*Violation
		next  = from
		end   = from + uint64(n)
		wg    sync.WaitGroup
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= end || len(vs) >= maxViolations {
					mu.Unlock()
					return
				}
				seed := next
				next++
				mu.Unlock()
				res := Run(cfgOf(seed))
				mu.Lock()
				total.Add(res.Stats)
				if res.Violation != nil && len(vs) < maxViolations {
					vs = append(vs, res.Violation)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return total, vs
}
