package layers

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kvfence/kvfence/internal/"

// TestDependenciesPointDown fails when a package imports one listed after it
// in Order, or when a package is missing from Order.
func TestDependenciesPointDown(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	rank := map[string]int{}
	for i, p := range Order {
		rank[p] = i
	}
	seen := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(path, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		me, ok := rank[rel]
		if !ok {
			t.Errorf("package internal/%s is not in layers.Order: add it where its dependencies allow", rel)
			return nil
		}
		seen++
		for _, imp := range pkg.Imports {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			if r, ok := rank[dep]; !ok || r >= me {
				t.Errorf("internal/%s imports internal/%s, which is not below it in layers.Order", rel, dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < len(Order)/2 {
		t.Fatalf("only %d packages found under %s: the walk is broken", seen, root)
	}
}

// TestOrderHasNoDuplicates keeps Order a strict ranking.
func TestOrderHasNoDuplicates(t *testing.T) {
	s := slices.Clone(Order)
	slices.Sort(s)
	if len(slices.Compact(s)) != len(Order) {
		t.Fatal("a package appears twice in Order")
	}
}

// TestOrderNamesRealPackages catches stale entries after a package is removed.
func TestOrderNamesRealPackages(t *testing.T) {
	for _, p := range Order {
		if p == "audit" {
			continue // planned: the isolation auditor (DESIGN §9)
		}
		if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(p))); err != nil {
			t.Errorf("layers.Order names internal/%s, which does not exist", p)
		}
	}
}
