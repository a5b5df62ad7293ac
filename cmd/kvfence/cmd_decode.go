package main

import (
	"context"
	"io"
)

func runDecode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotYet("decode")
}
