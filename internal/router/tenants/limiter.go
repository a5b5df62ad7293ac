package tenants

import (
	"sync"

	"github.com/kvfence/kvfence/internal/invariants"
)

// Limiter bounds requests in flight per tenant. It is safe for concurrent
// use and never blocks.
type Limiter struct {
	mu struct {
		sync.Mutex
		// active counts requests in flight per tenant; a tenant with none has
		// no entry, so the map holds at most one entry per request in flight.
		active map[string]int
	}
}

// NewLimiter returns an empty limiter.
func NewLimiter() *Limiter {
	l := &Limiter{}
	l.mu.active = map[string]int{}
	return l
}

// Acquire takes one slot of tenant if it has fewer than limit requests in
// flight (limit <= 0 means unlimited) and reports whether it did. Every
// successful Acquire MUST be paired with exactly one Release.
func (l *Limiter) Acquire(tenant string, limit int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.mu.active[tenant]
	if limit > 0 && n >= limit {
		return false
	}
	l.mu.active[tenant] = n + 1
	return true
}

// Release returns a slot taken by Acquire. Releasing a slot that was not
// taken is a programmer error and panics.
func (l *Limiter) Release(tenant string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.mu.active[tenant]
	invariants.Assert(ok && n > 0, "tenants: Release without Acquire")
	if n == 1 {
		delete(l.mu.active, tenant)
		return
	}
	l.mu.active[tenant] = n - 1
}

// Active returns tenant's requests in flight.
func (l *Limiter) Active(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.active[tenant]
}

// Tenants returns the number of tenants with requests in flight (the size of
// the limiter's state).
func (l *Limiter) Tenants() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.active)
}
