package router

import "fmt"

// AbortPolicy says what happens to a request whose client went away.
type AbortPolicy uint8

const (
	// AbortFirstToken lets a request whose client left before its first
	// token run until that token and aborts it then; a client that leaves
	// later aborts the request at once. Ordinary disconnects then happen
	// after the KV transfer, never in the middle of it (DESIGN.md §4).
	AbortFirstToken AbortPolicy = iota
	// AbortImmediate aborts at once whenever the client leaves.
	AbortImmediate
)

// String returns the policy's flag value.
func (p AbortPolicy) String() string {
	switch p {
	case AbortFirstToken:
		return "first-token"
	case AbortImmediate:
		return "immediate"
	}
	return fmt.Sprintf("AbortPolicy(%d)", uint8(p))
}

// ParseAbortPolicy parses a flag value: "first-token" or "immediate".
func ParseAbortPolicy(s string) (AbortPolicy, error) {
	switch s {
	case "first-token":
		return AbortFirstToken, nil
	case "immediate":
		return AbortImmediate, nil
	}
	return 0, fmt.Errorf("router: unknown abort policy %q (want first-token or immediate)", s)
}
