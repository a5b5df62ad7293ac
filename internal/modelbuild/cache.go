package modelbuild

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvfence/kvfence/internal/gguf"
)

// generatorVersion names the weight generator. Bump it whenever the bytes
// Build writes for given Options change (TestGoldenWeights pins them), so
// files cached under the old name are not reused.
const generatorVersion = "kvfence-modelbuild-v1"

// Cached returns the path of the model described by o inside dir, building
// it there first unless a file built from identical options is already
// present. Benchmarks use it so a large preset is generated once per
// machine rather than once per run. The name of the file is a digest of
// the options (tokenizer included) and of the generator version; it is
// written atomically, so concurrent callers at worst both build it.
func Cached(o Options, dir string) (string, error) {
	r, err := resolve(o)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s %d %d %d %d %d %d %d %d %d %g %g %g %v %q\n", generatorVersion,
		r.Arch, r.Layers, r.Dim, r.Heads, r.KVHeads, r.HeadDim, r.FF, r.Ctx, r.Type, r.Seed,
		r.RopeBase, r.RMSEps, r.RopeScale, r.Tied, r.Name)
	tw := gguf.NewWriter()
	for _, kv := range r.Tokenizer.GGUFKV() {
		tw.Set(kv.Key, kv.Value)
	}
	if _, err := tw.WriteTo(h); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%dL-%d-%s-%x.gguf",
		r.Arch, r.Layers, r.Dim, strings.ToLower(r.Type.String()), h.Sum(nil)[:8]))
	if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := Write(o, path); err != nil {
		return "", err
	}
	return path, nil
}
