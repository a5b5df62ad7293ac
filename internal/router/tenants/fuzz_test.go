package tenants

import (
	"bufio"
	"errors"
	"strings"
	"testing"
)

// FuzzParseKeys: a key file of any bytes parses or fails with ErrSyntax,
// never panics, and a parsed file maps every key line to the tenant the
// line names.
func FuzzParseKeys(f *testing.F) {
	f.Add("# team keys\n" + keyA + " team-a 8\n" + keyB + " team_b\n")
	f.Add(keyA + " a\n" + keyA + " b\n")
	f.Add(keyA + " a 2\n" + keyA2 + " a 3\n")
	f.Add("short t\n")
	f.Add("\n\n#only comments\n")
	f.Add(keyA + " bad/name\n")
	f.Add(keyA + " t -1\n")
	f.Fuzz(func(t *testing.T, file string) {
		k, err := ParseKeys(strings.NewReader(file))
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("error %v does not wrap ErrSyntax", err)
			}
			return
		}
		sc := bufio.NewScanner(strings.NewReader(file))
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
				continue
			}
			got, ok := k.Lookup(fields[0])
			if !ok || got.Name != fields[1] {
				t.Fatalf("key of line %q looks up as %+v, %v", sc.Text(), got, ok)
			}
		}
	})
}
