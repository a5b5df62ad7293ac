package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestPDDecodeFlags(t *testing.T) {
	for _, tc := range []struct {
		args         []string
		transferPort int
		transferHost string
		err          string
	}{
		{args: nil, transferPort: 8201, transferHost: "127.0.0.1"},
		{args: []string{"--port", "9000", "--host", "0.0.0.0"}, transferPort: 9001, transferHost: "0.0.0.0"},
		{args: []string{"--port", "0"}, transferPort: 0, transferHost: "127.0.0.1"},
		{args: []string{"--port", "9000", "--transfer-port", "7000", "--transfer-host", "10.0.0.1"}, transferPort: 7000, transferHost: "10.0.0.1"},
		{args: []string{"--transfer-backend", "rdma"}, err: "only tcp"},
		{args: []string{"--peer-id", "1"}, err: "--peer-id 1"},
		{args: []string{"--peer-id", "4294967296"}, err: "--peer-id"},
		{args: []string{"--max-running-requests", "0"}, err: "--max-running-requests"},
		{args: []string{"--transfer-port", "70000"}, err: "--transfer-port 70000"},
		{args: []string{"--unsafe-no-checksum"}, transferPort: 8201, transferHost: "127.0.0.1"},
	} {
		o, err := parseDecodeFlags(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if o.transferPort != tc.transferPort || o.transferHost != tc.transferHost {
			t.Errorf("%v: transfer %s:%d, want %s:%d", tc.args, o.transferHost, o.transferPort, tc.transferHost, tc.transferPort)
		}
		if unsafe := slices.Contains(tc.args, "--unsafe-no-checksum"); o.protections.NoChecksum != unsafe || (len(o.unsafeGiven) == 1) != unsafe {
			t.Errorf("%v: protections %+v, given %v", tc.args, o.protections, o.unsafeGiven)
		}
	}
}

func TestPDRouterFlags(t *testing.T) {
	o, err := parseRouterFlags([]string{"--prefill", "10.0.0.1:8100,http://10.0.0.2:8100/", "--prefill", "https://p3:1",
		"--decode", "http://d:8200", "--abort-policy", "immediate"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http://10.0.0.1:8100", "http://10.0.0.2:8100", "https://p3:1"}; !slices.Equal(o.prefill, want) {
		t.Errorf("prefill %v, want %v", o.prefill, want)
	}
	if want := []string{"http://d:8200"}; !slices.Equal(o.decode, want) || o.abortPolicy.String() != "immediate" {
		t.Errorf("decode %v policy %v", o.decode, o.abortPolicy)
	}
	for _, args := range [][]string{
		{"--decode", "http://d:1"},
		{"--prefill", "http://p:1"},
		{"--prefill", "http://p:1", "--decode", "http://d:1", "--abort-policy", "never"},
	} {
		if _, err := parseRouterFlags(args); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestPDClusterSecret(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	short := filepath.Join(dir, "short")
	os.WriteFile(good, []byte("  0123456789abcdef0123\n"), 0o600)
	os.WriteFile(short, []byte("0123456789\n"), 0o600)

	t.Setenv("KVFENCE_CLUSTER_SECRET", "")
	if _, _, err := requiredClusterSecret(""); !errors.Is(err, errNoSecret) {
		t.Errorf("no secret: %v", err)
	}
	s, auth, err := requiredClusterSecret(good)
	if err != nil || string(s) != "0123456789abcdef0123" || auth == nil {
		t.Errorf("file: %q %v", s, err)
	}
	if _, _, err := requiredClusterSecret(short); err == nil {
		t.Errorf("a 10-byte secret was accepted")
	}
	if _, _, err := requiredClusterSecret(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("a missing file was accepted")
	}
	t.Setenv("KVFENCE_CLUSTER_SECRET", "from-the-environment-123")
	if s, _, err := requiredClusterSecret(""); err != nil || string(s) != "from-the-environment-123" {
		t.Errorf("env: %q %v", s, err)
	}
	// The file wins over the environment.
	if s, _, err := requiredClusterSecret(good); err != nil || string(s) != "0123456789abcdef0123" {
		t.Errorf("file and env: %q %v", s, err)
	}
}
