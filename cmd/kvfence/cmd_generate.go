package main

import (
	"context"
	"io"
)

func runGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotYet("generate")
}
