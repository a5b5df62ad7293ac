package kernels

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Task is work that a Pool splits by index range.
type Task interface {
	// Run does the work for indices [lo, hi) on worker number worker
	// (0 <= worker < Threads()), e.g. to pick that worker's scratch. Run
	// calls for disjoint ranges run concurrently and MUST NOT write to the
	// same memory.
	Run(lo, hi, worker int)
}

// Pool is a fixed set of worker goroutines that run one Task at a time.
// Workers take chunks of grain consecutive indices from a shared counter
// until none are left, so a worker slowed by a busy machine does not hold
// the others up; which worker does which chunk varies from run to run, so a
// Task's result for an index MUST NOT depend on the worker or on the other
// indices of its chunk. The caller's goroutine is worker 0, so a pool of one
// thread starts no goroutines. Dispatch allocates nothing.
//
// A Pool is used by one goroutine at a time (it is a forward pass's private
// engine); Close stops its goroutines.
type Pool struct {
	threads int
	work    []chan job // work[k-1] feeds worker k; closed by Close
	wg      sync.WaitGroup
	next    atomic.Int64 // next unclaimed index of the running task
	mm      matmulTask   // reused by MatMul so that dispatch does not allocate
	closed  atomic.Bool  // set once by Close (which may run from a cleanup)
}

type job struct {
	t        Task
	n, grain int
	wk       int
}

// NewPool starts threads-1 worker goroutines (threads < 1 means 1).
func NewPool(threads int) *Pool {
	if threads < 1 {
		threads = 1
	}
	p := &Pool{threads: threads}
	for k := 1; k < threads; k++ {
		ch := make(chan job, 1)
		p.work = append(p.work, ch)
		go p.worker(ch)
	}
	return p
}

func (p *Pool) worker(ch <-chan job) {
	for j := range ch {
		p.drain(j)
		p.wg.Done()
	}
}

// drain runs chunks of j's task until the counter passes n.
func (p *Pool) drain(j job) {
	for {
		lo := int(p.next.Add(int64(j.grain))) - j.grain
		if lo >= j.n {
			return
		}
		j.t.Run(lo, min(lo+j.grain, j.n), j.wk)
	}
}

// Threads is the number of workers, the caller's goroutine included.
func (p *Pool) Threads() int { return p.threads }

// Run runs t over [0, n) in chunks of grain indices (grain < 1 means 1) and
// returns when every index is done.
func (p *Pool) Run(n, grain int, t Task) {
	if p.closed.Load() {
		panic("kernels: Run on a closed Pool")
	}
	grain = max(grain, 1)
	parts := min(p.threads, (n+grain-1)/grain)
	if parts <= 1 {
		if n > 0 {
			t.Run(0, n, 0)
		}
		return
	}
	p.next.Store(0)
	p.wg.Add(parts - 1)
	for k := 1; k < parts; k++ {
		p.work[k-1] <- job{t: t, n: n, grain: grain, wk: k}
	}
	p.drain(job{t: t, n: n, grain: grain, wk: 0})
	p.wg.Wait()
}

// Close stops the worker goroutines. The Pool must not be used afterwards.
// Closing twice, from any goroutine, is harmless.
func (p *Pool) Close() {
	if p.closed.Swap(true) {
		return
	}
	for _, ch := range p.work {
		close(ch)
	}
}

// Matrix is a weight matrix of Rows rows of Cols elements in a compact
// format, row-major, exactly as a GGUF tensor with Dims [Cols, Rows] stores
// it. Data usually aliases a file mapping.
type Matrix struct {
	Format     Format
	Rows, Cols int
	Data       []byte
	rowBytes   int
}

// NewMatrix checks that data holds rows×cols elements of format f.
func NewMatrix(f Format, rows, cols int, data []byte) (Matrix, error) {
	rb, err := f.RowBytes(cols)
	if err != nil {
		return Matrix{}, err
	}
	if rows <= 0 || cols <= 0 {
		return Matrix{}, fmt.Errorf("kernels: matrix of %d×%d", rows, cols)
	}
	if len(data) != rows*rb {
		return Matrix{}, fmt.Errorf("kernels: %d×%d %v matrix needs %d bytes, have %d", rows, cols, f, rows*rb, len(data))
	}
	return Matrix{Format: f, Rows: rows, Cols: cols, Data: data, rowBytes: rb}, nil
}

// Row returns the bytes of row i.
func (m *Matrix) Row(i int) []byte {
	return m.Data[i*m.rowBytes : (i+1)*m.rowBytes : (i+1)*m.rowBytes]
}

// DotRow returns the dot product of x (Cols long) with row i.
func (m *Matrix) DotRow(i int, x []float32) float32 {
	return Dot(m.Format, x[:m.Cols], m.Row(i))
}

// matmulTile is how many weight rows a worker takes at a time: they stay in
// cache while every activation row passes over them.
const matmulTile = 16

type matmulTask struct {
	out, x  []float32
	t       int
	w       *Matrix
	scratch []tileScratch // per worker; kept across calls
}

// tiledMinRows is the number of activation rows from which converting a
// tile of weights once beats converting each element in every Dot.
const tiledMinRows = 4

func (mt *matmulTask) Run(lo, hi, worker int) {
	w, cols, rows := mt.w, mt.w.Cols, mt.w.Rows
	for o0 := lo; o0 < hi; o0 += matmulTile {
		o1 := min(o0+matmulTile, hi)
		if mt.t >= tiledMinRows {
			mt.runTiled(o0, o1, &mt.scratch[worker])
			continue
		}
		for r := 0; r < mt.t; r++ {
			xr := mt.x[r*cols : (r+1)*cols]
			or := mt.out[r*rows : (r+1)*rows]
			for o := o0; o < o1; o++ {
				or[o] = Dot(w.Format, xr, w.Row(o))
			}
		}
	}
}

// MatMul computes out[r*w.Rows+o] = x[r*w.Cols:][:w.Cols] · row o of w for
// the t activation rows of x, splitting the output rows over the pool. Each
// element is computed exactly as Dot computes it (see tile.go), so the
// result does not depend on t or on the number of threads. Scratch for
// converted weight tiles grows to the widest matrix seen and is kept.
func (p *Pool) MatMul(out, x []float32, t int, w *Matrix) {
	if len(x) < t*w.Cols || len(out) < t*w.Rows {
		panic(fmt.Sprintf("kernels: MatMul of %d rows: x has %d of %d, out %d of %d", t, len(x), t*w.Cols, len(out), t*w.Rows))
	}
	if p.mm.scratch == nil {
		p.mm.scratch = make([]tileScratch, p.threads)
	}
	if t >= tiledMinRows {
		// Grow every worker's tile here, not in the worker: which workers
		// take part in a call varies, and growth must not wait for the
		// first call a worker happens to join.
		for i := range p.mm.scratch {
			p.mm.scratch[i].ensure(w.Cols)
		}
	}
	p.mm.out, p.mm.x, p.mm.t, p.mm.w = out, x, t, w
	p.Run(w.Rows, matmulTile, &p.mm)
	p.mm.out, p.mm.x, p.mm.w = nil, nil, nil
}
