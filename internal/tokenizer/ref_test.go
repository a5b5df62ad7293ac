package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// refFile is what scripts/tokref/gen.mjs writes.
type refFile struct {
	Package string `json:"package"`
	Cases   []struct {
		Name     string  `json:"name"`
		Text     string  `json:"text"`
		IDs      []int32 `json:"ids"`
		IDsPlain []int32 `json:"ids_plain"`
		IDsBOS   []int32 `json:"ids_bos"`
		Decoded  string  `json:"decoded"`
	} `json:"cases"`
	Chat []struct {
		Name     string    `json:"name"`
		Messages []Message `json:"messages"`
		AddGen   bool      `json:"add_generation_prompt"`
		Text     string    `json:"text"`
	} `json:"chat"`
}

func readGz(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Gunzip(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func loadRef(t testing.TB, name string) refFile {
	var r refFile
	if err := json.Unmarshal(readGz(t, filepath.Join("testdata", name+".json.gz")), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Cases) < 150 {
		t.Fatalf("%s: only %d reference cases", name, len(r.Cases))
	}
	return r
}

var refToks struct {
	once sync.Once
	m    map[string]*Tokenizer
	err  error
}

// refTokenizer builds (once per test binary) the tokenizer of a reference
// model from its committed tokenizer files.
func refTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	refToks.once.Do(func() {
		refToks.m = map[string]*Tokenizer{}
		for _, n := range []string{"qwen3", "llama3", "llama2", "gpt2re"} {
			var c Config
			var err error
			switch n {
			case "qwen3":
				c, err = BundledQwen3()
			case "gpt2re":
				// Qwen3's vocabulary with the GPT-2 pre-tokenizer (see gen.mjs).
				c = refToks.m["qwen3"].Config()
				c.Pre = PreDefault
			default:
				c, err = FromHFJSON(readGz(t, filepath.Join("testdata", n, "tokenizer.json.gz")),
					readGz(t, filepath.Join("testdata", n, "tokenizer_config.json.gz")))
			}
			if err != nil {
				refToks.err = err
				return
			}
			tok, err := New(c)
			if err != nil {
				refToks.err = err
				return
			}
			refToks.m[n] = tok
		}
	})
	if refToks.err != nil {
		t.Fatal(refToks.err)
	}
	return refToks.m[name]
}

func TestReferenceEncodings(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3", "llama2", "gpt2re"} {
		t.Run(model, func(t *testing.T) {
			tok := refTokenizer(t, model)
			ref := loadRef(t, model)
			fails := 0
			for _, c := range ref.Cases {
				check := func(what string, got, want []int32) {
					if !slices.Equal(got, want) {
						fails++
						t.Errorf("%s %s: %q\n got %v\nwant %v", c.Name, what, c.Text, got, want)
					}
				}
				check("parse-special", tok.Encode(c.Text, EncodeOptions{ParseSpecial: true}), c.IDs)
				check("plain", tok.Encode(c.Text, EncodeOptions{}), c.IDsPlain)
				check("add-special", tok.Encode(c.Text, EncodeOptions{ParseSpecial: true, AddSpecial: true}), c.IDsBOS)
				if got := tok.Decode(c.IDs); got != c.Decoded {
					fails++
					t.Errorf("%s decode: got %q want %q", c.Name, got, c.Decoded)
				}
			}
			t.Logf("%s: %d cases from %s, %d mismatches", model, len(ref.Cases), ref.Package, fails)
		})
	}
}

// TestConcurrentEncode shares one Tokenizer (and its word cache) between
// goroutines; run under -race it checks the cache's publication, and the
// results must equal the references whatever the interleaving.
func TestConcurrentEncode(t *testing.T) {
	tok := refTokenizer(t, "llama3")
	ref := loadRef(t, "llama3")
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ref.Cases {
				c := ref.Cases[(i*7+g*31)%len(ref.Cases)]
				if got := tok.Encode(c.Text, EncodeOptions{ParseSpecial: true}); !slices.Equal(got, c.IDs) {
					errs <- c.Name
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for name := range errs {
		t.Errorf("concurrent encode of %s differs", name)
	}
}
