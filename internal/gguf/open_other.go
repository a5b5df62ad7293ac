//go:build !unix

package gguf

import "os"

// Open reads the file at path and parses it. On this platform the file is
// read into memory rather than mapped.
func Open(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data)
}
