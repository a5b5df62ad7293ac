package tokenizer

import (
	"hash/maphash"
	"sync/atomic"
)

// wordCache remembers the merge results of recent pre-tokens. It is a
// fixed-size, direct-mapped table (bounded memory: cacheSlots entries of
// at most cacheMaxWord bytes) whose slots are swapped atomically, so
// concurrent Encode calls share it without locks. A collision simply
// replaces the older entry. Entries are immutable once published.
type wordCache struct {
	seed  maphash.Seed
	slots [cacheSlots]atomic.Pointer[cacheEntry]
}

const (
	cacheSlots   = 1 << 12
	cacheMaxWord = 64
)

type cacheEntry struct {
	word string
	ids  []int32
}

func (c *wordCache) get(word string) ([]int32, bool) {
	e := c.slots[maphash.String(c.seed, word)&(cacheSlots-1)].Load()
	if e == nil || e.word != word {
		return nil, false
	}
	return e.ids, true
}

func (c *wordCache) put(word string, ids []int32) {
	c.slots[maphash.String(c.seed, word)&(cacheSlots-1)].Store(&cacheEntry{word: word, ids: ids})
}
