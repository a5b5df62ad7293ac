package modelbuild

import "github.com/kvfence/kvfence/internal/tokenizer"

func bundledQwen3() (tokenizer.Config, error) { return tokenizer.BundledQwen3() }
