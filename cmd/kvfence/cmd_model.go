package main

import (
	"context"
	"io"
)

func runModel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotYet("model")
}
