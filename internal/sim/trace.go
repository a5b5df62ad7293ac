package sim

import (
	"fmt"
	"strings"
)

// Explain replays cfg (with v its violation) and returns the events that
// led to v: every line about the requests v names and every line about no
// single request (crashes, resets, PeerEpoch), the last `last` of them, and
// v itself. Replaying is exact: a run is a function of its Config.
func Explain(cfg Config, v *Violation, last int) string {
	var lines []string
	cfg.Trace = func(e TraceEvent) {
		if e.Req == -1 || e.Req == v.Req || (v.Other >= 0 && e.Req == v.Other) {
			lines = append(lines, fmt.Sprintf("t=%-6d #%-6d req %-4d %s", e.Time, e.Event, e.Req, e.Text))
		}
	}
	res := Run(cfg)
	var b strings.Builder
	if res.Violation == nil || res.Violation.Inv != v.Inv || res.Violation.Event != v.Event {
		fmt.Fprintf(&b, "replay did not reproduce the violation (got %v): the run is not deterministic\n", res.Violation)
	}
	if last > 0 && len(lines) > last {
		fmt.Fprintf(&b, "... %d earlier lines\n", len(lines)-last)
		lines = lines[len(lines)-last:]
	}
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
