package tenants

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const keyA = "sk-aaaaaaaaaaaaaaaa"
const keyA2 = "sk-aaaaaaaaaaaaaaa2"
const keyB = "sk-bbbbbbbbbbbbbbbb"

func TestParseKeys(t *testing.T) {
	file := "# team keys\n\n" +
		keyA + " team-a 8\n" +
		"  " + keyA2 + "\tteam-a   \n" +
		keyB + " team_b\n"
	k, err := ParseKeys(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key  string
		want Tenant
		ok   bool
	}{
		{keyA, Tenant{"team-a", 8}, true},
		{keyA2, Tenant{"team-a", 8}, true}, // the limit of another line of the tenant applies
		{keyB, Tenant{"team_b", 0}, true},
		{"sk-aaaaaaaaaaaaaaa", Tenant{}, false}, // prefix of a key
		{keyA + "x", Tenant{}, false},
		{"", Tenant{}, false},
		{"team-a", Tenant{}, false},
	}
	for _, tt := range tests {
		got, ok := k.Lookup(tt.key)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v, %v", tt.key, got, ok, tt.want, tt.ok)
		}
	}
	if k.Len() != 3 || k.Tenants() != 2 {
		t.Errorf("Len, Tenants = %d, %d; want 3, 2", k.Len(), k.Tenants())
	}
}

func TestParseKeysErrors(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"empty", "# nothing\n\n", "no keys"},
		{"one field", keyA + "\n", "line 1: want `KEY TENANT [MAX_CONCURRENT]`, got 1 fields"},
		{"four fields", keyA + " a 1 2\n", "got 4 fields"},
		{"short key", "short tenant\n", "line 1: key is 5 bytes, want at least 16"},
		{"bad tenant", keyA + " team/a\n", "line 1: tenant name must be"},
		{"long tenant", keyA + " " + strings.Repeat("t", 65) + "\n", "tenant name must be"},
		{"zero limit", keyA + " a 0\n", "MAX_CONCURRENT must be a positive integer"},
		{"negative limit", keyA + " a -1\n", "MAX_CONCURRENT must be a positive integer"},
		{"text limit", keyA + " a many\n", "MAX_CONCURRENT must be a positive integer"},
		{"duplicate key", "#\n" + keyA + " a\n" + keyA + " b\n", "line 3: the key of line 2 appears again"},
		{"conflicting limits", keyA + " a 1\n" + keyA2 + " a 2\n", "line 2: tenant a has limit 2 here and 1 on an earlier line"},
		{"non-ascii key", "sk-ääääääääääääää a\n", "not printable ASCII"},
		{"long line", keyA + " a " + strings.Repeat(" ", 5000) + "1\n", "longer than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseKeys(strings.NewReader(tt.file))
			if err == nil {
				t.Fatalf("ParseKeys accepted %q", tt.file)
			}
			if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q; want ErrSyntax containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "sk-") {
				t.Fatalf("error %q leaks a key", err)
			}
		})
	}
}

func TestLoadKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(keyB+" b 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := k.Lookup(keyB); !ok || got != (Tenant{"b", 3}) {
		t.Fatalf("Lookup = %+v, %v", got, ok)
	}
	if _, err := LoadKeys(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestNilKeysMatchNothing(t *testing.T) {
	var k *Keys
	if _, ok := k.Lookup(keyA); ok || k.Len() != 0 {
		t.Fatal("nil Keys matched")
	}
}

func TestLimiter(t *testing.T) {
	l := NewLimiter()
	if !l.Acquire("a", 2) || !l.Acquire("a", 2) {
		t.Fatal("first two acquires refused")
	}
	if l.Acquire("a", 2) {
		t.Fatal("third acquire over limit 2 granted")
	}
	if !l.Acquire("b", 1) {
		t.Fatal("another tenant refused")
	}
	if l.Active("a") != 2 || l.Active("b") != 1 {
		t.Fatalf("active a=%d b=%d", l.Active("a"), l.Active("b"))
	}
	l.Release("a")
	if !l.Acquire("a", 2) {
		t.Fatal("acquire after release refused")
	}
	for range 100 {
		if !l.Acquire("u", 0) {
			t.Fatal("unlimited tenant refused")
		}
	}
	for range 100 {
		l.Release("u")
	}
	l.Release("a")
	l.Release("a")
	l.Release("b")
	if l.Tenants() != 0 {
		t.Fatalf("limiter keeps %d tenants at rest; its state must be bounded by requests in flight", l.Tenants())
	}
}

func TestLimiterReleaseWithoutAcquirePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Release without Acquire did not panic")
		}
	}()
	NewLimiter().Release("a")
}

func TestLimiterConcurrentNeverExceedsLimit(t *testing.T) {
	l := NewLimiter()
	const limit = 3
	var mu sync.Mutex
	inside, peak := 0, 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 200 {
				if !l.Acquire("t", limit) {
					continue
				}
				mu.Lock()
				inside++
				peak = max(peak, inside)
				mu.Unlock()
				mu.Lock()
				inside--
				mu.Unlock()
				l.Release("t")
			}
		})
	}
	wg.Wait()
	if peak > limit || peak == 0 {
		t.Fatalf("peak %d in flight with limit %d", peak, limit)
	}
	if l.Tenants() != 0 {
		t.Fatal("state left behind")
	}
}

func BenchmarkLookup(b *testing.B) {
	var sb strings.Builder
	for i := range 100 {
		sb.WriteString("sk-key-number-" + strings.Repeat("x", 10) + string(rune('A'+i%26)) + string(rune('a'+i/26)) + " t\n")
	}
	k, err := ParseKeys(strings.NewReader(sb.String()))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		k.Lookup("sk-not-a-key-at-all-000")
	}
}
