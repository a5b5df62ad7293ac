package tenants

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Default is the tenant of every request when no key file is configured.
const Default = "default"

// MinKeyLen is the shortest key a key file may hold. Short keys are
// guessable; the limit is a floor, not a recommendation (use 32+ random bytes).
const MinKeyLen = 16

// maxTenantLen bounds tenant names, which appear in logs.
const maxTenantLen = 64

// maxLineLen bounds one line of the key file; longer lines are an error.
const maxLineLen = 4096

// Tenant is who a key belongs to.
type Tenant struct {
	Name string
	// MaxConcurrent is the tenant's limit on requests in flight; 0 means the
	// caller's default applies.
	MaxConcurrent int
}

type entry struct {
	digest [sha256.Size]byte
	tenant Tenant
}

// Keys is an immutable set of API keys. It is safe for concurrent use.
type Keys struct {
	entries []entry
}

// ErrSyntax is wrapped by every parse error; errors name the line number,
// never the key.
var ErrSyntax = errors.New("api key file syntax")

// LoadKeys reads a key file (format in the package documentation).
func LoadKeys(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	k, err := ParseKeys(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// ParseKeys parses a key file. An empty file (no keys) is an error: a server
// configured with keys but holding none would refuse everyone, which is
// never what the operator meant.
func ParseKeys(r io.Reader) (*Keys, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), maxLineLen)
	k := &Keys{}
	limits := map[string]int{} // tenant -> limit given on some line (0 = none yet)
	seen := map[[sha256.Size]byte]int{}
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) < 2 || len(fields) > 3 {
			return nil, fmt.Errorf("%w: line %d: want `KEY TENANT [MAX_CONCURRENT]`, got %d fields", ErrSyntax, line, len(fields))
		}
		key, name := fields[0], fields[1]
		if len(key) < MinKeyLen {
			return nil, fmt.Errorf("%w: line %d: key is %d bytes, want at least %d", ErrSyntax, line, len(key), MinKeyLen)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				return nil, fmt.Errorf("%w: line %d: key holds a byte that is not printable ASCII", ErrSyntax, line)
			}
		}
		if !validTenant(name) {
			return nil, fmt.Errorf("%w: line %d: tenant name must be 1-%d bytes of [A-Za-z0-9._-]", ErrSyntax, line, maxTenantLen)
		}
		limit := 0
		if len(fields) == 3 {
			n, err := strconv.Atoi(fields[2])
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("%w: line %d: MAX_CONCURRENT must be a positive integer", ErrSyntax, line)
			}
			limit = n
		}
		if prev, ok := limits[name]; ok && limit != 0 && prev != 0 && prev != limit {
			return nil, fmt.Errorf("%w: line %d: tenant %s has limit %d here and %d on an earlier line", ErrSyntax, line, name, limit, prev)
		}
		if limit != 0 || limits[name] == 0 {
			limits[name] = limit
		}
		d := sha256.Sum256([]byte(key))
		if first, dup := seen[d]; dup {
			return nil, fmt.Errorf("%w: line %d: the key of line %d appears again", ErrSyntax, line, first)
		}
		seen[d] = line
		k.entries = append(k.entries, entry{digest: d, tenant: Tenant{Name: name}})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d: longer than %d bytes", ErrSyntax, line+1, maxLineLen)
		}
		return nil, err
	}
	if len(k.entries) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrSyntax)
	}
	// A limit given on any line of a tenant applies to all its keys.
	for i := range k.entries {
		k.entries[i].tenant.MaxConcurrent = limits[k.entries[i].tenant.Name]
	}
	return k, nil
}

func validTenant(s string) bool {
	if len(s) == 0 || len(s) > maxTenantLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Lookup returns the tenant of key. It takes time proportional to the number
// of keys whatever key is presented, and compares every digest in constant
// time. A nil *Keys matches nothing.
func (k *Keys) Lookup(key string) (Tenant, bool) {
	if k == nil {
		return Tenant{}, false
	}
	d := sha256.Sum256([]byte(key))
	found := -1
	for i := range k.entries {
		eq := subtle.ConstantTimeCompare(d[:], k.entries[i].digest[:])
		// Select without branching on the comparison result.
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return Tenant{}, false
	}
	return k.entries[found].tenant, true
}

// Len returns the number of keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.entries)
}

// Tenants returns the number of distinct tenants.
func (k *Keys) Tenants() int {
	if k == nil {
		return 0
	}
	names := map[string]struct{}{}
	for _, e := range k.entries {
		names[e.tenant.Name] = struct{}{}
	}
	return len(names)
}
