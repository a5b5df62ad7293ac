// Package tenants maps API keys to tenants and bounds how many requests each
// tenant may have in flight at once.
//
// # Key file
//
// The file given to `--api-keys` is plain text, one key per line:
//
//	# comment lines and blank lines are ignored
//	sk-team-a-0123456789abcdef   team-a   8
//	sk-team-a-fedcba9876543210   team-a
//	sk-team-b-00112233445566778  team-b   2
//
// Each line is `KEY TENANT [MAX_CONCURRENT]`, fields separated by spaces or
// tabs. A key is at least MinKeyLen printable non-space ASCII bytes and
// appears once in the file. A tenant name is 1–64 bytes of [A-Za-z0-9._-]:
// it is an identifier that may appear in logs, so it must not carry data.
// MAX_CONCURRENT is the tenant's limit on requests in flight (a positive
// integer); a tenant may have several keys, and all lines that give it a
// limit must give the same one. A tenant without a limit uses the
// caller's default (0 = unlimited).
//
// Keys are compared in constant time: a lookup hashes the presented key with
// SHA-256 and compares the digest with every stored digest without an early
// exit, so neither a key's content nor its length shows in the timing.
//
// # No key file
//
// When no key file is configured the server is open: every request belongs
// to the tenant named Default. Callers should log that loudly at startup.
//
// # Concurrency
//
// Limiter counts requests in flight per tenant. Acquire never blocks: a
// tenant at its limit gets false at once (the HTTP layer turns that into 429),
// so no goroutine ever waits on it. Its memory is bounded by the number of
// requests in flight: a tenant's entry is deleted when its count returns to
// zero.
package tenants
