// Package invariants reports whether expensive internal consistency checks
// are compiled in. They are on in race builds (so `go test -race` exercises
// them) and in builds tagged `invariants`; production builds skip them.
//
// Checks guarded by Enabled turn silent corruption into a loud crash: a page
// freed twice, accounting that drifts, a fence that does not match its page.
package invariants

// Enabled is true in race builds and builds with the invariants tag.
const Enabled = raceEnabled || tagEnabled

// Assert panics with msg when cond is false. It is for programmer errors
// only; operating errors are returned values.
func Assert(cond bool, msg string) {
	if !cond {
		panic("kvfence: invariant violated: " + msg)
	}
}
