package kvpool

import (
	"errors"
	"fmt"
)

// Shape is what the pool needs to know about the model: enough to lay out a
// page. It is fixed for the pool's lifetime.
type Shape struct {
	Layers   int // transformer blocks
	KVHeads  int // key/value heads per layer
	HeadDim  int // dimension of one head
	PageSize int // token slots per page
}

// Validate reports a shape that cannot describe a page.
func (s Shape) Validate() error {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.PageSize <= 0 {
		return fmt.Errorf("kvpool: invalid shape %+v: every field must be positive", s)
	}
	if s.BlockFloats() > 1<<28/(2*s.Layers) {
		return fmt.Errorf("kvpool: shape %+v: page larger than 1 GiB", s)
	}
	return nil
}

// BlockFloats is the number of float32 in one layer's K (or V) of one page:
// PageSize*KVHeads*HeadDim.
func (s Shape) BlockFloats() int { return s.PageSize * s.KVHeads * s.HeadDim }

// PageBytes is the size of one page: the header plus K and V of every layer.
func (s Shape) PageBytes() int { return HeaderSize + 2*s.Layers*s.BlockFloats()*4 }

// PagesFor returns how many pages of shape s fit in budget bytes.
func PagesFor(budget int64, s Shape) int {
	if budget <= 0 || s.Validate() != nil {
		return 0
	}
	n := budget / int64(s.PageBytes())
	if n > 1<<31-1 {
		n = 1<<31 - 1 // page ids are int32
	}
	return int(n)
}

// ErrPoolTooSmall is wrapped by *CapacityError.
var ErrPoolTooSmall = errors.New("kvpool: pool smaller than the context window")

// CapacityError is the I6 refusal: a pool that holds fewer tokens than the
// context window would accept requests it can never hold (the "rejected but
// alive" failure started that way: a 681,280-token pool behind a 1,048,576
// token window).
type CapacityError struct {
	PoolTokens int // tokens the pool holds (pages * page size)
	Window     int // the configured context window
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("kv pool holds %d tokens, fewer than the context window of %d tokens: "+
		"raise the KV cache memory or lower the context length", e.PoolTokens, e.Window)
}

func (e *CapacityError) Unwrap() error { return ErrPoolTooSmall }

// CheckWindow is the I6 startup check. A pool holding at least window
// tokens passes unchanged. Otherwise, with lower false it returns a
// *CapacityError naming both numbers; with lower true it returns the pool's
// token count as the new window and a note saying so, for the caller to log.
func CheckWindow(poolTokens, window int, lower bool) (effective int, note string, err error) {
	if window <= 0 {
		return 0, "", fmt.Errorf("kvpool: context window %d must be positive", window)
	}
	if poolTokens >= window {
		return window, "", nil
	}
	if !lower || poolTokens <= 0 {
		return 0, "", &CapacityError{PoolTokens: poolTokens, Window: window}
	}
	return poolTokens, fmt.Sprintf("context window lowered from %d to %d tokens: the kv pool holds only %d tokens",
		window, poolTokens, poolTokens), nil
}
