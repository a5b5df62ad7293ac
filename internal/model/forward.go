package model

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/kvfence/kvfence/internal/kernels"
)

// LogitMode says which rows of a chunk need logits.
type LogitMode uint8

const (
	LogitsNone LogitMode = iota // no logits (a prefill chunk that is not the last)
	LogitsLast                  // the chunk's last token only
	LogitsAll                   // every token of the chunk
)

// Seq is one sequence's chunk in a forward batch.
type Seq struct {
	Tokens []int32 // this chunk's tokens (a decode step is a chunk of 1)
	Pos    int     // position of Tokens[0]; positions [0, Pos) are already in the pages
	Pages  []int32 // the sequence's page table; must cover positions [0, Pos+len(Tokens))
	Logits LogitMode
}

// ErrBatch reports a batch Forward refuses: too many tokens or sequences for
// the workspace, an empty chunk, a token outside the vocabulary, a position
// past the context window or a page table too short. Nothing was written.
var ErrBatch = errors.New("model: invalid batch")

// Workspace holds every buffer a forward pass needs, sized once for at most
// maxTokens tokens in maxSeqs chunks, and the worker pool. Forward allocates
// nothing in steady state: the only growth is the logits buffer, the first
// time more rows of logits are asked for than ever before (it starts with
// room for maxSeqs rows).
//
// A Workspace is used by one goroutine at a time. Close stops its workers.
type Workspace struct {
	m                  *Model
	maxTokens, maxSeqs int
	pool               *kernels.Pool

	// Per-token activations, row-major [token][width].
	x, xn, tmp []float32 // Dim
	q, att     []float32 // Heads*HeadDim
	k, v       []float32 // KVHeads*HeadDim
	gate, up   []float32 // FF
	cos, sin   []float32 // HeadDim/2: the rope angles of each token

	rowSeq []int // chunk of each token
	rowPos []int // position of each token

	scores [][]float32 // per worker: attention scores, grown to the longest context seen

	hidden   []float32 // normalized rows that need logits, [row][Dim]
	logits   []float32 // [row][Vocab]
	logitOff []int     // per chunk: first logits row
	logitN   []int     // per chunk: number of logits rows

	attn attnTask
}

// NewWorkspace allocates the scratch for batches of at most maxTokens tokens
// in at most maxSeqs chunks, run on threads worker threads (the caller's
// goroutine included; < 1 means runtime.GOMAXPROCS).
func (m *Model) NewWorkspace(maxTokens, maxSeqs, threads int) *Workspace {
	if threads < 1 {
		threads = runtime.GOMAXPROCS(0)
	}
	maxTokens, maxSeqs = max(maxTokens, 1), max(maxSeqs, 1)
	c := m.Config
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	ws := &Workspace{
		m: m, maxTokens: maxTokens, maxSeqs: maxSeqs,
		pool:     kernels.NewPool(threads),
		x:        make([]float32, maxTokens*c.Dim),
		xn:       make([]float32, maxTokens*c.Dim),
		tmp:      make([]float32, maxTokens*c.Dim),
		q:        make([]float32, maxTokens*qDim),
		att:      make([]float32, maxTokens*qDim),
		k:        make([]float32, maxTokens*kvDim),
		v:        make([]float32, maxTokens*kvDim),
		gate:     make([]float32, maxTokens*c.FF),
		up:       make([]float32, maxTokens*c.FF),
		cos:      make([]float32, maxTokens*c.HeadDim/2),
		sin:      make([]float32, maxTokens*c.HeadDim/2),
		rowSeq:   make([]int, maxTokens),
		rowPos:   make([]int, maxTokens),
		scores:   make([][]float32, threads),
		hidden:   make([]float32, maxSeqs*c.Dim),
		logits:   make([]float32, maxSeqs*c.Vocab),
		logitOff: make([]int, maxSeqs),
		logitN:   make([]int, maxSeqs),
	}
	ws.attn.ws = ws
	// A Workspace dropped without Close still stops its workers: they hold
	// the pool, never the Workspace, so the Workspace can become garbage.
	runtime.AddCleanup(ws, func(p *kernels.Pool) { p.Close() }, ws.pool)
	return ws
}

// Close stops the workspace's worker goroutines. The Workspace must not be
// used afterwards.
func (ws *Workspace) Close() { ws.pool.Close() }

// MaxTokens is the most tokens one Forward call may carry.
func (ws *Workspace) MaxTokens() int { return ws.maxTokens }

// Logits returns the logits of chunk seq's i-th requested row (for
// LogitsLast, i is 0). The slice is valid until the next Forward.
func (ws *Workspace) Logits(seq, i int) []float32 {
	if seq < 0 || seq >= ws.maxSeqs || i < 0 || i >= ws.logitN[seq] {
		panic(fmt.Sprintf("model: Logits(%d, %d) of a chunk with %d rows of logits", seq, i, ws.logitN[max(0, min(seq, ws.maxSeqs-1))]))
	}
	v := ws.m.Config.Vocab
	r := ws.logitOff[seq] + i
	return ws.logits[r*v : (r+1)*v : (r+1)*v]
}

// validate checks a batch against the model and the workspace and fills the
// per-token tables. It returns the number of tokens and of logits rows.
func (ws *Workspace) validate(kv KVStore, batch []Seq) (nTok, nLogits int, err error) {
	c := ws.m.Config
	if len(batch) > ws.maxSeqs {
		return 0, 0, fmt.Errorf("%w: %d chunks, workspace holds %d", ErrBatch, len(batch), ws.maxSeqs)
	}
	ps := kv.PageSize()
	if ps <= 0 {
		return 0, 0, fmt.Errorf("%w: page size %d", ErrBatch, ps)
	}
	for s := range batch {
		sq := &batch[s]
		n := len(sq.Tokens)
		switch {
		case n == 0:
			return 0, 0, fmt.Errorf("%w: chunk %d has no tokens", ErrBatch, s)
		case nTok+n > ws.maxTokens:
			return 0, 0, fmt.Errorf("%w: more than %d tokens", ErrBatch, ws.maxTokens)
		case sq.Pos < 0 || sq.Pos > c.ContextLength-n:
			return 0, 0, fmt.Errorf("%w: chunk %d spans positions [%d, %d), context window is %d", ErrBatch, s, sq.Pos, sq.Pos+n, c.ContextLength)
		case len(sq.Pages) < (sq.Pos+n+ps-1)/ps:
			return 0, 0, fmt.Errorf("%w: chunk %d ends at position %d, its page table covers %d", ErrBatch, s, sq.Pos+n, len(sq.Pages)*ps)
		case sq.Logits > LogitsAll:
			return 0, 0, fmt.Errorf("%w: chunk %d has logit mode %d", ErrBatch, s, sq.Logits)
		}
		for i, p := range sq.Pages[:(sq.Pos+n+ps-1)/ps] {
			if p < 0 {
				return 0, 0, fmt.Errorf("%w: chunk %d page table entry %d is negative", ErrBatch, s, i)
			}
		}
		for i, t := range sq.Tokens {
			if t < 0 || int(t) >= c.Vocab {
				return 0, 0, fmt.Errorf("%w: chunk %d token %d is outside the vocabulary of %d", ErrBatch, s, i, c.Vocab)
			}
			ws.rowSeq[nTok+i] = s
			ws.rowPos[nTok+i] = sq.Pos + i
		}
		ws.logitOff[s] = nLogits
		switch sq.Logits {
		case LogitsNone:
			ws.logitN[s] = 0
		case LogitsLast:
			ws.logitN[s] = 1
		case LogitsAll:
			ws.logitN[s] = n
		}
		nLogits += ws.logitN[s]
		nTok += n
	}
	for s := len(batch); s < ws.maxSeqs; s++ {
		ws.logitN[s] = 0
	}
	return nTok, nLogits, nil
}

// Forward runs one batch: it embeds every chunk's tokens, writes their K and
// V into their pages (position p of a chunk goes to page Pages[p/PageSize],
// slot p%PageSize), lets each token attend over positions [0, p] of its own
// sequence through its page table, and computes logits for the rows asked
// (read them with Logits). A token's result is bit-identical whatever else
// is in the batch and however its sequence was chunked (see package
// kernels).
//
// A batch that does not fit the workspace, the vocabulary, the context
// window or its page tables is refused with an error wrapping ErrBatch
// before anything is written. Chunks of one batch must not share page
// slots they write.
func (m *Model) Forward(ws *Workspace, kv KVStore, batch []Seq) error {
	if ws.m != m {
		return fmt.Errorf("%w: workspace belongs to another model", ErrBatch)
	}
	nTok, nLogits, err := ws.validate(kv, batch)
	if err != nil || nTok == 0 {
		return err
	}
	c := m.Config
	maxCtx := 0
	for s := range batch {
		maxCtx = max(maxCtx, batch[s].Pos+len(batch[s].Tokens))
	}
	if len(ws.scores[0]) < maxCtx {
		// High-water growth, in steps of 1024 positions.
		n := min((maxCtx+1023)/1024*1024, c.ContextLength)
		for i := range ws.scores {
			ws.scores[i] = make([]float32, n)
		}
	}
	dim, hd, half := c.Dim, c.HeadDim, c.HeadDim/2
	qDim, kvDim := c.Heads*hd, c.KVHeads*hd
	ps := kv.PageSize()
	eps := c.RMSEps
	pool := ws.pool

	// Embeddings and the rope angles of every token.
	for r := 0; r < nTok; r++ {
		tok := int(batch[ws.rowSeq[r]].Tokens[ws.rowPos[r]-batch[ws.rowSeq[r]].Pos])
		kernels.DecodeRow(m.embd.Format, m.embd.Row(tok), ws.x[r*dim:(r+1)*dim])
		kernels.RoPEAngles(ws.cos[r*half:(r+1)*half], ws.sin[r*half:(r+1)*half], ws.rowPos[r], m.freq)
	}

	ws.attn.kv, ws.attn.batch, ws.attn.scale = kv, batch, float32(1/math.Sqrt(float64(hd)))
	for li := range m.layers {
		ly := &m.layers[li]
		for r := 0; r < nTok; r++ {
			kernels.RMSNorm(ws.xn[r*dim:(r+1)*dim], ws.x[r*dim:(r+1)*dim], ly.attnNorm, eps)
		}
		pool.MatMul(ws.q, ws.xn, nTok, &ly.wq)
		pool.MatMul(ws.k, ws.xn, nTok, &ly.wk)
		pool.MatMul(ws.v, ws.xn, nTok, &ly.wv)
		for r := 0; r < nTok; r++ {
			q, k, v := ws.q[r*qDim:(r+1)*qDim], ws.k[r*kvDim:(r+1)*kvDim], ws.v[r*kvDim:(r+1)*kvDim]
			if ly.bq != nil {
				kernels.Add(q, ly.bq)
				kernels.Add(k, ly.bk)
				kernels.Add(v, ly.bv)
			}
			cos, sin := ws.cos[r*half:(r+1)*half], ws.sin[r*half:(r+1)*half]
			for h := 0; h < c.Heads; h++ {
				qh := q[h*hd : (h+1)*hd]
				if ly.qNorm != nil {
					kernels.RMSNorm(qh, qh, ly.qNorm, eps)
				}
				kernels.RoPE(qh, cos, sin, c.NeoXRope)
			}
			for h := 0; h < c.KVHeads; h++ {
				kh := k[h*hd : (h+1)*hd]
				if ly.kNorm != nil {
					kernels.RMSNorm(kh, kh, ly.kNorm, eps)
				}
				kernels.RoPE(kh, cos, sin, c.NeoXRope)
			}
			// Store this token's K and V: one contiguous slot per page.
			p := ws.rowPos[r]
			pk, pv := kv.LayerKV(batch[ws.rowSeq[r]].Pages[p/ps], li)
			slot := p % ps
			copy(pk[slot*kvDim:(slot+1)*kvDim], k)
			copy(pv[slot*kvDim:(slot+1)*kvDim], v)
		}
		ws.attn.layer = li
		pool.Run(nTok*c.Heads, attnGrain, &ws.attn)
		pool.MatMul(ws.tmp, ws.att, nTok, &ly.wo)
		kernels.Add(ws.x[:nTok*dim], ws.tmp[:nTok*dim])

		for r := 0; r < nTok; r++ {
			kernels.RMSNorm(ws.xn[r*dim:(r+1)*dim], ws.x[r*dim:(r+1)*dim], ly.ffnNorm, eps)
		}
		pool.MatMul(ws.gate, ws.xn, nTok, &ly.wGate)
		pool.MatMul(ws.up, ws.xn, nTok, &ly.wUp)
		kernels.SiLUMul(ws.gate[:nTok*c.FF], ws.gate, ws.up)
		pool.MatMul(ws.tmp, ws.gate, nTok, &ly.wDown)
		kernels.Add(ws.x[:nTok*dim], ws.tmp[:nTok*dim])
	}
	ws.attn.kv, ws.attn.batch = nil, nil

	if nLogits == 0 {
		return nil
	}
	if nLogits*c.Vocab > len(ws.logits) {
		// High-water growth: the first call that asks for more rows than any
		// before. Steady state allocates nothing.
		ws.logits = make([]float32, nLogits*c.Vocab)
		ws.hidden = make([]float32, nLogits*dim)
	}
	row, first := 0, 0
	for s := range batch {
		n := len(batch[s].Tokens)
		from := first
		if batch[s].Logits == LogitsLast {
			from = first + n - 1
		}
		for i := 0; i < ws.logitN[s]; i++ {
			r := from + i
			kernels.RMSNorm(ws.hidden[row*dim:(row+1)*dim], ws.x[r*dim:(r+1)*dim], m.outNorm, eps)
			row++
		}
		first += n
	}
	pool.MatMul(ws.logits, ws.hidden, nLogits, &m.output)
	return nil
}

// attnGrain is how many (token, head) pairs a worker takes at a time.
const attnGrain = 4

// attnTask computes attention for (token, head) pairs: index i is token
// i/Heads, head i%Heads. Each pair reads its sequence's K and V through the
// page table in position order, so its result does not depend on the batch.
type attnTask struct {
	ws    *Workspace
	kv    KVStore
	batch []Seq
	layer int
	scale float32
}

func (t *attnTask) Run(lo, hi, worker int) {
	ws := t.ws
	c := ws.m.Config
	hd, kvDim, qDim := c.HeadDim, c.KVHeads*c.HeadDim, c.Heads*c.HeadDim
	group := c.Heads / c.KVHeads
	ps := t.kv.PageSize()
	for i := lo; i < hi; i++ {
		r, h := i/c.Heads, i%c.Heads
		pos := ws.rowPos[r]
		pages := t.batch[ws.rowSeq[r]].Pages
		off := (h / group) * hd
		q := ws.q[r*qDim+h*hd : r*qDim+(h+1)*hd]
		sc := ws.scores[worker][:pos+1]
		for j := 0; j <= pos; {
			k, _ := t.kv.LayerKV(pages[j/ps], t.layer)
			for s := j % ps; s < ps && j <= pos; s, j = s+1, j+1 {
				sc[j] = kernels.DotF32(q, k[s*kvDim+off:s*kvDim+off+hd]) * t.scale
			}
		}
		kernels.Softmax(sc)
		out := ws.att[r*qDim+h*hd : r*qDim+(h+1)*hd]
		clear(out)
		for j := 0; j <= pos; {
			_, v := t.kv.LayerKV(pages[j/ps], t.layer)
			for s := j % ps; s < ps && j <= pos; s, j = s+1, j+1 {
				kernels.AXPY(sc[j], v[s*kvDim+off:s*kvDim+off+hd], out)
			}
		}
	}
}
