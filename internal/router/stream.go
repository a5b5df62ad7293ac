package router

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/kvfence/kvfence/internal/engine"
	"github.com/kvfence/kvfence/internal/reqerr"
	"github.com/kvfence/kvfence/internal/router/api"
	"github.com/kvfence/kvfence/internal/tokenizer"
	"github.com/kvfence/kvfence/internal/transfer"
)

// stream is one generation: the api.Stream the handler reads, over the
// decode worker's engine.TokenStream. Next and Close are called by the
// handler's goroutine; the prefill goroutine only sets preErr and signals
// preDone.
type stream struct {
	r       *Router
	dec     engine.Decoder
	pre     engine.Prefiller
	decSlot *slot
	preSlot *slot
	decPeer transfer.PeerID
	room    transfer.RoomID
	prompt  int
	logp    bool

	// ctx is the generation's own context (never the HTTP request's);
	// cancel ends the prefill call. Cancelled once, in finish.
	ctx    context.Context
	cancel context.CancelFunc
	ts     engine.TokenStream
	td     *tokenizer.StreamDecoder

	preDone chan struct{} // closed when the prefill call returned
	preMu   sync.Mutex    // guards preErr
	preErr  error         // the prefill call's failure, if it was not ours

	// Handler goroutine only (and the first-token waiter after Close hands
	// the stream over to it).
	first  bool   // a token was received
	ended  bool   // io.EOF or an error was received from ts
	err    error  // the error Next returns from now on
	finish string // the finish reason of the last event
	tokens int
	closed bool
}

// runPrefill runs the prefill side. A failure that is not the stream's own
// cancellation aborts the decode side: when the prefill worker failed before
// its machine saw the room (unreachable, refused the call), the decode side
// would otherwise wait for a transfer that never comes.
func (s *stream) runPrefill(req *engine.PrefillRequest, id string) {
	defer s.r.wg.Done()
	defer close(s.preDone)
	defer s.preSlot.inFlight.Add(-1)
	err := s.pre.Prefill(s.ctx, req)
	if err == nil || s.ctx.Err() != nil {
		return
	}
	s.preMu.Lock()
	s.preErr = err
	s.preMu.Unlock()
	s.r.cfg.Log.Warn("prefill failed; aborting the decode side", "request", id, "kind", reqerr.KindOf(err).String(), "err", err)
	m := &transfer.Abort{Envelope: transfer.Envelope{Room: s.room}, Reason: reqerr.KindAborted, Decode: s.decPeer}
	s.r.cfg.Auth.Sign(m)
	s.dec.Abort(m)
}

// Next returns the next token. See api.Stream.
func (s *stream) Next(ctx context.Context) (api.Token, error) {
	if s.err != nil {
		return api.Token{}, s.err
	}
	ev, err := s.ts.Next(ctx)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, io.EOF) && reqerr.KindOf(err) == reqerr.KindUnknown {
			// Only the wait ended; the generation goes on until Close.
			return api.Token{}, err
		}
		s.ended = true
		s.err = s.outcome(err)
		return api.Token{}, s.err
	}
	s.first = true
	s.tokens++
	tok := api.Token{ID: ev.ID}
	switch ev.Finish {
	case "":
		tok.Text = s.td.Next(ev.ID)
	case engine.FinishStop:
		// The stop token is generated and counted but is not text; held-back
		// bytes of an incomplete character end the text.
		s.finish = api.FinishStop
		tok.Text = s.td.Flush()
	default:
		s.finish = api.FinishLength
		tok.Text = s.td.Next(ev.ID) + s.td.Flush()
	}
	if s.logp {
		tok.Bytes = s.r.tok.Piece(ev.ID)
		tok.Logprob = ev.Logprob
		if len(ev.Top) > 0 {
			tok.Top = make([]api.TopLogprob, len(ev.Top))
			for i, t := range ev.Top {
				tok.Top[i] = api.TopLogprob{ID: t.ID, Bytes: s.r.tok.Piece(t.ID), Logprob: t.Logprob}
			}
		}
	}
	return tok, nil
}

// outcome is the error Next reports for the decode stream's err: io.EOF as
// is; an aborted decode side whose abort came from a failed prefill reports
// the prefill's error, the original one.
func (s *stream) outcome(err error) error {
	if errors.Is(err, io.EOF) {
		if s.finish == "" {
			s.finish = api.FinishStop
		}
		return io.EOF
	}
	if reqerr.KindOf(err) == reqerr.KindAborted {
		s.preMu.Lock()
		perr := s.preErr
		s.preMu.Unlock()
		if perr != nil {
			return perr
		}
	}
	return err
}

// Result reports the usage and finish reason so far.
func (s *stream) Result() api.Result {
	res := api.Result{PromptTokens: s.prompt, CompletionTokens: s.tokens}
	if errors.Is(s.err, io.EOF) {
		res.FinishReason = s.finish
	}
	return res
}

// Close ends the stream, applying the abort policy when the generation has
// not ended. It does not block on the workers: the first-token wait runs on
// a goroutine of its own.
func (s *stream) Close() {
	if s.closed {
		return
	}
	s.closed = true
	switch {
	case s.ended:
		s.finishStream(false)
	case s.first || s.r.cfg.AbortPolicy == AbortImmediate:
		s.finishStream(true)
	default:
		// The client left before the first token: let the request reach it
		// (the transfer completes instead of being aborted midway), then
		// abort. The router's hard stop ends the wait.
		s.r.wg.Add(1)
		go func() {
			defer s.r.wg.Done()
			ev, err := s.ts.Next(s.r.base)
			// Abort unless the generation already ended by itself (its
			// first event was its last, or it failed); a hard stop of the
			// router (base ended) aborts too.
			ended := err == nil && ev.Finish != "" || err != nil && s.r.base.Err() == nil
			s.finishStream(!ended)
		}()
	}
}

// finishStream aborts the room on both workers when abort is set, closes the
// decode stream, ends the prefill call and releases the stream's share of
// the router. It runs once per stream.
func (s *stream) finishStream(abort bool) {
	if abort {
		s.r.abortRoom(s.dec, s.pre, s.room, s.decPeer)
	}
	s.ts.Close()
	s.cancel()
	s.release()
}

// release gives back the decode slot and the stream's place in the
// Router's wait group. The prefill goroutine gives back its own.
func (s *stream) release() {
	s.decSlot.inFlight.Add(-1)
	if s.preDone == nil {
		s.preSlot.inFlight.Add(-1) // the prefill call never started
		if s.cancel != nil {
			s.cancel()
		}
	}
	s.r.wg.Done()
}
