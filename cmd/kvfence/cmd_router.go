package main

import (
	"context"
	"io"
)

func runRouter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotYet("router")
}
