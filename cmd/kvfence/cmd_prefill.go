package main

import (
	"context"
	"io"
)

func runPrefill(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotYet("prefill")
}
