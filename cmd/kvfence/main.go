// Command kvfence is a disaggregated LLM inference server whose tenants
// cannot see each other's data. This file only dispatches subcommands; each
// subcommand lives in its own file and does flag parsing and wiring only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand of the kvfence binary.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run router, prefill and decode in one process (the quick start)", runServe},
		{"router", "run the OpenAI-compatible front door over remote workers", runRouter},
		{"prefill", "run a prefill worker", runPrefill},
		{"decode", "run a decode worker", runDecode},
		{"generate", "generate a continuation of a prompt locally, no server", runGenerate},
		{"model", "build and inspect GGUF model files (model new | model inspect)", runModel},
		{"audit", "check tenant isolation of a running deployment (not built yet)", runAudit},
		{"bench", "measure throughput and latency of a running deployment (not built yet)", runBench},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "kvfence: a disaggregated LLM inference server with checkable tenant isolation.\n\n")
	fmt.Fprintf(w, "Usage: kvfence <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'kvfence <command> --help' for the flags of one command.\n")
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "kvfence %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "kvfence: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// errUsage reports bad flags or arguments; the flag package has already
// printed what was wrong.
var errUsage = errors.New("usage error")

// parseFlags parses args into fs, mapping flag errors to errUsage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return flag.ErrHelp
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %v\n", fs.Args())
		return errUsage
	}
	return nil
}

// errNotYet marks a subcommand that is not built yet.
func errNotYet(name string) error {
	return fmt.Errorf("%s is not implemented yet", name)
}
