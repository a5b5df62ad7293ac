package main

import (
	"context"
	"io"
)

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotYet("audit")
}
