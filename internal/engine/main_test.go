package engine

import (
	"os"
	"testing"
)

var testDir string

// TestMain gives the package's tests one temporary directory (the tiny
// model is written there once) and removes it afterwards.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-engine-test-")
	if err != nil {
		panic(err)
	}
	testDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
