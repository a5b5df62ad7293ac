package tcp

import (
	"context"
	"testing"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/transfer"
	"github.com/kvfence/kvfence/internal/transfer/link"
)

// countSink counts reports and signals when a target is reached; it does
// not record them (the benchmark measures the transport, not the sink).
type countSink struct {
	n      chan struct{}
	up     chan struct{}
	failed chan error
}

func (s *countSink) Deliver(_ transfer.PeerID, m transfer.Message) {
	if m.Type() == transfer.TypePeerEpoch {
		select {
		case s.up <- struct{}{}:
		default:
		}
	}
}
func (s *countSink) Landed(r link.Report) {
	if r.Err != nil {
		select {
		case s.failed <- r.Err:
		default:
		}
	}
	s.n <- struct{}{}
}

// BenchmarkPageWrite posts page writes of the qwen3-0.6b page shape (28
// layers, 8 KV heads, head dim 128, 16 tokens: 3.67 MB a page) over
// loopback and waits until every one is acknowledged as applied.
func BenchmarkPageWrite(b *testing.B) {
	shape := kvpool.Shape{Layers: 28, KVHeads: 8, HeadDim: 128, PageSize: 16}
	f := newFixture(b, fixOpts{shape: shape, pages: 8, noConnect: true})
	sink := &countSink{n: make(chan struct{}, 1<<16), up: make(chan struct{}, 1), failed: make(chan error, 1)}
	pre, err := Dial(Config{Self: prefillID, Secret: testSecret, Sink: sink}, decodeID, f.ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer pre.Close()
	<-sink.up
	rm := room(1)
	pages := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	f.windows.Open(1, rm, pages)
	writes := make([]transfer.PostWrite, len(pages))
	for i, pg := range pages {
		writes[i] = f.write(1, rm, pg, pg, 0, byte(i))
	}
	ctx := context.Background()
	b.SetBytes(int64(shape.PageBytes()))
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for i := range b.N {
			pw := writes[i%len(writes)]
			pw.Seq = uint64(i + 1)
			pre.Post(ctx, pw)
		}
	}()
	for range b.N {
		<-sink.n
	}
	b.StopTimer()
	select {
	case err := <-sink.failed:
		b.Fatal(err)
	default:
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pages/s")
}
