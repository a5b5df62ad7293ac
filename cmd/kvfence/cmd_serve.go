package main

import (
	"context"
	"io"
)

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotYet("serve")
}
