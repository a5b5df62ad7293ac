package spec

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// config is one spin run of transfer.pml.
type config struct {
	name    string
	defines []string
	// violated is "" when the model must verify with zero errors;
	// otherwise a counterexample must exist and its failed assertion must
	// contain this text (which names the invariant, see assertTags).
	violated string
}

// assertTags maps text of an assert in transfer.pml to the invariant it
// checks, for readable failure messages.
var assertTags = []struct{ text, inv string }{
	{"pstate[w_p]", "I2 late write"},
	{"writer[", "I1 foreign read"},
	{"hroom[", "I4 incomplete transfer"},
	{"(n==dneed", "I4 token count"},
	{"too_long", "I3 rejected request"},
	{"prejected", "I3 rejected request"},
	{"nres[", "request ended twice"},
	{"nfree", "I5 accounting"},
	{"nalloc", "I5 accounting"},
	{"powner[", "page state"},
}

var probeRe = regexp.MustCompile(`^\((\d+)!=(\d+)\)$`)

func tag(assertion string) string {
	if probeRe.MatchString(assertion) { // PROBE(n) after preprocessing
		return "reachability probe"
	}
	for _, a := range assertTags {
		if strings.Contains(assertion, a.text) {
			return a.inv
		}
	}
	return "unknown assert"
}

func TestModel(t *testing.T) {
	spin, err := exec.LookPath("spin")
	if err != nil {
		t.Fatal("spin is not installed: install Debian's 'spin' package (scripts/test.sh does when run as root)")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatal("gcc is not installed: spin's verifier pan is C source and needs gcc")
	}
	model, err := os.ReadFile("transfer.pml")
	if err != nil {
		t.Fatal(err)
	}

	configs := []config{
		{name: "SAFE"},
		{name: "REVOKE_ONLY", defines: []string{"-DREVOKE_ONLY"}},
		{name: "DEFER_ONLY", defines: []string{"-DDEFER_ONLY"}},
		{name: "NO_REVOKE_NO_DEFER", defines: []string{"-DNO_REVOKE_NO_DEFER"}, violated: "I2 late write"},
		{name: "DRAINED_WITHOUT_TOMBSTONE", defines: []string{"-DDRAINED_WITHOUT_TOMBSTONE"}, violated: "I2 late write"},
		{name: "REJECTED_BUT_ALIVE", defines: []string{"-DREJECTED_BUT_ALIVE"}, violated: "I1 foreign read"},
		// Placeholder admission can never give the client its original
		// error (I3, so those asserts are off here), but the fence check
		// alone, or page-count agreement alone, stops the foreign read.
		{name: "REJECTED_BUT_ALIVE_fence_only", defines: []string{"-DREJECTED_BUT_ALIVE", "-DKEEP_FENCE", "-DNO_I3"}},
		{name: "REJECTED_BUT_ALIVE_pagecount_only", defines: []string{"-DREJECTED_BUT_ALIVE", "-DKEEP_PAGECOUNT", "-DNO_I3"}},
		{name: "REJECTED_BUT_ALIVE_fence_only_I3", defines: []string{"-DREJECTED_BUT_ALIVE", "-DKEEP_FENCE"}, violated: "I3 rejected request"},
	}
	// Every probe must be reachable in the safe model, or its verification
	// would prove nothing about that path. Probe 9 (a write landing in a
	// deferred page) cannot happen when revocation is on, so it is probed
	// where deferred release is the only protection against it.
	probes := []struct {
		n    string
		what string
		cfg  string
	}{
		{"1", "write refused by a revoked window", ""},
		{"2", "write of a dead connection dropped", ""},
		{"3", "room decodes from a reused page", ""},
		{"4", "Drained frees deferred pages", ""},
		{"5", "new connection epoch frees quarantine", ""},
		{"6", "tombstone drops a late Grant", ""},
		{"7", "two-page room decodes", ""},
		{"8", "Reject frees granted pages", ""},
		{"9", "late write lands in a deferred page", "-DDEFER_ONLY"},
	}
	for _, p := range probes {
		d := []string{"-DREACH=" + p.n}
		if p.cfg != "" {
			d = append(d, p.cfg)
		}
		configs = append(configs, config{name: "reach_" + p.n + "_" + strings.ReplaceAll(p.what, " ", "_"), defines: d, violated: "reachability probe"})
	}

	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			run(t, spin, gcc, model, c)
		})
	}
}

var (
	errorsRe = regexp.MustCompile(`errors: (\d+)`)
	statesRe = regexp.MustCompile(`(\d+) states, stored`)
	depthRe  = regexp.MustCompile(`depth reached (\d+)`)
	failRe   = regexp.MustCompile(`assertion violated (.*) \(at depth`)
)

func run(t *testing.T, spin, gcc string, model []byte, c config) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "transfer.pml"), model, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sh := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	sh(spin, append(append([]string{}, c.defines...), "-a", "transfer.pml")...)
	// -O0: compiling pan.c dominates the run time at this model size.
	sh(gcc, "-O0", "-DSAFETY", "-o", "pan", "pan.c")
	// -E: the processes loop forever, so end states are not errors; the
	// properties are the asserts.
	out := sh("./pan", "-E", "-m10000")
	if strings.Contains(out, "max search depth too small") {
		t.Fatalf("search depth exceeded; raise -m:\n%s", out)
	}
	m := errorsRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no error count in pan output:\n%s", out)
	}
	states, depth := "?", "?"
	if s := statesRe.FindStringSubmatch(out); s != nil {
		states = s[1]
	}
	if s := depthRe.FindStringSubmatch(out); s != nil {
		depth = s[1]
	}
	if c.violated == "" {
		if m[1] != "0" {
			t.Errorf("%s must verify but pan found %s error(s)\n%s", c.name, m[1], summary(t, sh, spin, c, out))
			return
		}
		t.Logf("%s verified: %s states stored, depth %s", c.name, states, depth)
		return
	}
	if m[1] == "0" {
		t.Fatalf("%s must produce a counterexample (%s) but verified with %s states", c.name, c.violated, states)
	}
	f := failRe.FindStringSubmatch(out)
	if f == nil {
		t.Fatalf("%s: pan found an error that is not an assertion:\n%s", c.name, out)
	}
	if got := tag(f[1]); got != c.violated {
		t.Fatalf("%s: counterexample violates %q (%s), want %s\n%s", c.name, got, f[1], c.violated, summary(t, sh, spin, c, out))
	}
	t.Logf("%s: counterexample (%s) after %s states:\n%s", c.name, c.violated, states, summary(t, sh, spin, c, out))
}

// summary replays the trail and keeps the message sends and receives and
// the failed assertion: the interleaving, without the variable dump.
func summary(t *testing.T, sh func(string, ...string) string, spin string, c config, panOut string) string {
	t.Helper()
	if !strings.Contains(panOut, "wrote transfer.pml.trail") {
		return panOut
	}
	tr := sh(spin, append(append([]string{}, c.defines...), "-t", "-c", "transfer.pml")...)
	var b strings.Builder
	for _, line := range strings.Split(tr, "\n") {
		if strings.Contains(line, "!") || strings.Contains(line, "?") || strings.Contains(line, "assertion") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
