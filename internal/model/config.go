package model

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvfence/kvfence/internal/gguf"
)

// Config is the shape of a model, read from GGUF metadata.
type Config struct {
	Arch          string // general.architecture: llama, qwen2 or qwen3
	Name          string // general.name, informational
	Layers        int
	Dim           int // embedding length
	Heads         int // query heads
	KVHeads       int // key/value heads (grouped-query attention when < Heads)
	HeadDim       int // per-head dimension; qwen3 may have HeadDim*Heads != Dim
	FF            int // feed-forward hidden size
	Vocab         int
	ContextLength int
	RopeBase      float64
	RopeScale     float64 // linear rope scaling factor; 1 when none
	RMSEps        float64

	NeoXRope       bool // rotate (i, i+HeadDim/2) instead of (2i, 2i+1)
	QKVBias        bool // qwen2: biases on q, k and v
	QKNorm         bool // qwen3: per-head RMSNorm of q and k before rope
	TiedEmbeddings bool // output.weight absent: logits use token_embd
}

// SupportedArchitectures lists the general.architecture values Load accepts.
var SupportedArchitectures = []string{"llama", "qwen2", "qwen3"}

// ErrUnsupported reports a model file this runtime cannot run: an unknown
// architecture, rope scaling kind or tensor type.
var ErrUnsupported = errors.New("model: unsupported")

// KVFloats is the number of float32s of K (and as many of V) one token slot
// holds in one layer.
func (c Config) KVFloats() int { return c.KVHeads * c.HeadDim }

// ConfigFromGGUF reads the model shape from f's metadata and tensor table.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	var c Config
	arch, err := f.String("general.architecture")
	if err != nil {
		return c, fmt.Errorf("model: %w", err)
	}
	c.Arch = arch
	switch arch {
	case "llama":
	case "qwen2":
		c.NeoXRope, c.QKVBias = true, true
	case "qwen3":
		c.NeoXRope, c.QKNorm = true, true
	default:
		return c, fmt.Errorf("%w architecture %q (supported: %s)", ErrUnsupported, arch, strings.Join(SupportedArchitectures, ", "))
	}
	c.Name, _ = f.String("general.name")

	p := arch + "."
	need := func(key string, dst *int) {
		if err != nil {
			return
		}
		var v uint64
		v, err = f.Uint(p + key)
		if err == nil && (v == 0 || v > 1<<30) {
			err = fmt.Errorf("model: %s%s = %d is out of range", p, key, v)
		}
		*dst = int(v)
	}
	opt := func(key string, dst *int, def int) {
		if err != nil {
			return
		}
		if _, ok := f.Get(p + key); !ok {
			*dst = def
			return
		}
		need(key, dst)
	}
	need("embedding_length", &c.Dim)
	need("block_count", &c.Layers)
	need("feed_forward_length", &c.FF)
	need("attention.head_count", &c.Heads)
	opt("attention.head_count_kv", &c.KVHeads, c.Heads)
	opt("context_length", &c.ContextLength, 2048)
	if err == nil {
		opt("attention.key_length", &c.HeadDim, c.Dim/c.Heads)
	}
	if err != nil {
		return c, fmt.Errorf("model: %w", err)
	}
	if _, ok := f.Get(p + "attention.value_length"); ok {
		vl, err := f.Uint(p + "attention.value_length")
		if err != nil {
			return c, fmt.Errorf("model: %w", err)
		}
		if int(vl) != c.HeadDim {
			return c, fmt.Errorf("%w: %sattention.value_length %d differs from key_length %d", ErrUnsupported, p, vl, c.HeadDim)
		}
	}

	if _, ok := f.Get(p + "rope.dimension_count"); ok {
		// Partial rotary embedding (fewer rotated dimensions than the head)
		// is not implemented; refuse rather than compute something else.
		rd, err := f.Uint(p + "rope.dimension_count")
		if err != nil {
			return c, fmt.Errorf("model: %w", err)
		}
		if int(rd) != c.HeadDim {
			return c, fmt.Errorf("%w: %srope.dimension_count %d differs from the head dimension %d", ErrUnsupported, p, rd, c.HeadDim)
		}
	}

	c.RopeBase = 10000
	if v, ok := f.Get(p + "rope.freq_base"); ok && v != nil {
		if c.RopeBase, err = f.Float(p + "rope.freq_base"); err != nil {
			return c, fmt.Errorf("model: %w", err)
		}
	}
	c.RMSEps = 1e-5
	if arch != "llama" {
		c.RMSEps = 1e-6
	}
	if _, ok := f.Get(p + "attention.layer_norm_rms_epsilon"); ok {
		if c.RMSEps, err = f.Float(p + "attention.layer_norm_rms_epsilon"); err != nil {
			return c, fmt.Errorf("model: %w", err)
		}
	}
	c.RopeScale = 1
	scaling := "none"
	if _, ok := f.Get(p + "rope.scaling.type"); ok {
		if scaling, err = f.String(p + "rope.scaling.type"); err != nil {
			return c, fmt.Errorf("model: %w", err)
		}
	}
	switch scaling {
	case "none", "":
		// Older converters wrote only rope.scale_linear.
		if _, ok := f.Get(p + "rope.scale_linear"); ok {
			if c.RopeScale, err = f.Float(p + "rope.scale_linear"); err != nil {
				return c, fmt.Errorf("model: %w", err)
			}
		}
	case "linear":
		if c.RopeScale, err = f.Float(p + "rope.scaling.factor"); err != nil {
			return c, fmt.Errorf("model: %w", err)
		}
	default:
		return c, fmt.Errorf("%w rope scaling %q (supported: none, linear)", ErrUnsupported, scaling)
	}

	emb, ok := f.Tensor("token_embd.weight")
	if !ok {
		return c, fmt.Errorf("model: tensor token_embd.weight is missing")
	}
	if len(emb.Dims) != 2 || emb.Dims[1] == 0 || emb.Dims[1] > 1<<24 {
		return c, fmt.Errorf("model: tensor token_embd.weight has dims %v, want [%d, vocab]", emb.Dims, c.Dim)
	}
	c.Vocab = int(emb.Dims[1])
	if _, ok := f.Get(p + "vocab_size"); ok {
		if v, err := f.Uint(p + "vocab_size"); err != nil || int(v) != c.Vocab {
			return c, fmt.Errorf("model: %svocab_size disagrees with token_embd.weight (%d rows)", p, c.Vocab)
		}
	}
	_, hasOutput := f.Tensor("output.weight")
	c.TiedEmbeddings = !hasOutput
	return c, c.validate()
}

func (c Config) validate() error {
	switch {
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("model: %d heads is not a multiple of %d kv heads", c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("model: head dimension %d is odd", c.HeadDim)
	case c.RopeBase <= 0 || c.RopeScale <= 0:
		return fmt.Errorf("model: rope base %g and scale %g must be positive", c.RopeBase, c.RopeScale)
	case !(c.RMSEps > 0 && c.RMSEps < 1):
		return fmt.Errorf("model: rms epsilon %g out of range", c.RMSEps)
	}
	return nil
}
