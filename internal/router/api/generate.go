package api

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/kvfence/kvfence/internal/reqerr"
)

// gen streams one generation to the client, or collects it into one
// response. It runs on the request's goroutine.
type gen struct {
	h *handler
	w *statusWriter
	r *http.Request
	c *call
	s Stream
	// release closes s and frees the tenant's slot; idempotent. Called
	// before the final write (see generate).
	release func()
	id      string // request id
	respID  string // "chatcmpl-<id>" or "cmpl-<id>"
	tenant  string

	start, last time.Time
	created     int64
	stop        stopMatcher
	tokens      int  // tokens received from the stream
	headersSent bool // streaming: the 200 and the SSE headers are out

	buf  []byte // reused for every chunk
	rc   *http.ResponseController
	one  [1]Token // the token of a streamed chunk's logprobs, without allocating
	off  [1]int
	sent int // streaming: bytes of text sent, the next completions text_offset

	// Non-streaming: the whole answer.
	text    []byte
	lps     []Token // when logprobs were asked for
	offsets []int   // completions text_offset
}

func (g *gen) run() {
	ctx := g.r.Context()
	finish := ""
	defer func() { g.h.m.genTokens.Add(float64(g.tokens)) }()
	for {
		tok, err := g.s.Next(ctx)
		if errors.Is(err, io.EOF) {
			finish = g.s.Result().FinishReason
			if finish == "" {
				finish = FinishStop
			}
			if rest := g.stop.flush(); rest != "" {
				if !g.emit(rest, nil) {
					return
				}
			}
			break
		}
		if err != nil {
			g.release()
			g.fail(err)
			return
		}
		now := g.h.cfg.Now()
		if g.tokens == 0 {
			g.h.m.ttft.Observe(now.Sub(g.start).Seconds())
		} else {
			g.h.m.itl.Observe(now.Sub(g.last).Seconds())
		}
		g.last = now
		g.tokens++
		out, stopped := g.stop.push(tok.Text)
		var lp *Token
		if g.c.req.Logprobs {
			lp = &tok
		}
		if !g.emit(out, lp) {
			return
		}
		if stopped {
			finish = FinishStop // the deferred Close aborts the rest
			break
		}
	}
	g.end(finish)
}

// emit sends (streaming) or keeps (not) a piece of text and the logprobs of
// the token that produced it. It reports false when the client is gone.
func (g *gen) emit(text string, lp *Token) bool {
	if !g.c.stream {
		if lp != nil {
			g.lps = append(g.lps, *lp)
			g.offsets = append(g.offsets, len(g.text))
		}
		g.text = append(g.text, text...)
		return true
	}
	if !g.headersSent && !g.sendHeaders() {
		return false
	}
	if text == "" && lp == nil {
		return true
	}
	b := g.chunkStart()
	if g.c.req.Chat {
		b = append(b, `{"index":0,"delta":{"content":`...)
		b = appendString(b, text)
		b = append(b, `},"logprobs":`...)
		if lp != nil {
			g.one[0] = *lp
			b = appendChatLogprobs(b, g.one[:])
		} else {
			b = append(b, "null"...)
		}
	} else {
		b = append(b, `{"text":`...)
		b = appendString(b, text)
		b = append(b, `,"index":0,"logprobs":`...)
		if lp != nil {
			g.one[0], g.off[0] = *lp, g.sent
			b = appendCompletionLogprobs(b, g.one[:], g.off[:])
		} else {
			b = append(b, "null"...)
		}
	}
	b = append(b, `,"finish_reason":null}]`...)
	g.sent += len(text)
	return g.send(g.chunkEnd(b))
}

// sendHeaders commits the streaming response. It happens at the first token
// (or the end), not before, so that an error the backend reports before any
// token still gets its own HTTP status.
func (g *gen) sendHeaders() bool {
	hdr := g.w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no") // proxies must not buffer the stream
	g.w.WriteHeader(http.StatusOK)
	g.headersSent = true
	if g.c.req.Chat {
		b := g.chunkStart()
		b = append(b, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
		return g.send(g.chunkEnd(b))
	}
	return true
}

func (g *gen) chunkStart() []byte {
	b := append(g.buf[:0], "data: "...)
	object := "text_completion"
	if g.c.req.Chat {
		object = "chat.completion.chunk"
	}
	b = appendHead(b, g.respID, object, g.created, g.c.req.Model)
	return append(b, `,"choices":[`...)
}

func (g *gen) chunkEnd(b []byte) []byte {
	if g.c.includeUsage {
		// With include_usage every chunk carries usage, null until the last.
		b = append(b, `,"usage":null`...)
	}
	return append(b, "}\n\n"...)
}

// send writes and flushes one SSE frame. It reports false, and records the
// client as gone, when the write fails.
func (g *gen) send(b []byte) bool {
	g.buf = b[:0]
	if _, err := g.w.Write(b); err != nil {
		g.clientGone()
		return false
	}
	if g.rc == nil {
		g.rc = http.NewResponseController(g.w)
	}
	if err := g.rc.Flush(); err != nil {
		g.clientGone()
		return false
	}
	return true
}

func (g *gen) clientGone() {
	if g.w.recorded != StatusClientClosed {
		g.h.m.rejected.WithLabelValues(reqerr.KindAborted.String()).Inc()
	}
	g.w.recorded = StatusClientClosed
}

// fail ends the request with err: an HTTP error if nothing was sent yet,
// else an SSE error event after which the stream ends without [DONE], so a
// client that ignores error events still sees an unfinished stream.
func (g *gen) fail(err error) {
	if !g.headersSent || g.r.Context().Err() != nil {
		g.h.fail(g.w, g.r, g.id, g.tenant, err)
		return
	}
	info := ErrorFor(err)
	g.h.m.rejected.WithLabelValues(info.Reason).Inc()
	g.h.logFailure(g.r, g.id, g.tenant, info, err)
	b := append(g.buf[:0], "data: "...)
	b = appendError(b, &info)
	g.send(append(b, "\n\n"...))
}

func (g *gen) end(finish string) {
	prompt := g.s.Result().PromptTokens
	g.release() // after Result: Close ends the stream's life
	g.h.m.promptTokens.Add(float64(prompt))
	defer func() { g.h.m.e2e.Observe(g.h.cfg.Now().Sub(g.start).Seconds()) }()
	if g.c.stream {
		if !g.headersSent && !g.sendHeaders() {
			return
		}
		b := g.chunkStart()
		if g.c.req.Chat {
			b = append(b, `{"index":0,"delta":{},"logprobs":null,"finish_reason":`...)
		} else {
			b = append(b, `{"text":"","index":0,"logprobs":null,"finish_reason":`...)
		}
		b = appendFinish(b, finish)
		b = append(b, "}]"...)
		if !g.send(g.chunkEnd(b)) {
			return
		}
		if g.c.includeUsage {
			b = g.chunkStart()
			b = append(b, `],"usage":`...)
			b = appendUsage(b, prompt, g.tokens)
			if !g.send(append(b, "}\n\n"...)) {
				return
			}
		}
		g.send(append(g.buf[:0], "data: [DONE]\n\n"...))
		return
	}

	b := g.buf[:0]
	if g.c.req.Chat {
		b = appendHead(b, g.respID, "chat.completion", g.created, g.c.req.Model)
		b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
		b = appendString(b, string(g.text))
		b = append(b, `,"refusal":null},"logprobs":`...)
		if g.c.req.Logprobs {
			b = appendChatLogprobs(b, g.lps)
		} else {
			b = append(b, "null"...)
		}
	} else {
		b = appendHead(b, g.respID, "text_completion", g.created, g.c.req.Model)
		b = append(b, `,"choices":[{"text":`...)
		b = appendString(b, string(g.text))
		b = append(b, `,"index":0,"logprobs":`...)
		if g.c.req.Logprobs {
			b = appendCompletionLogprobs(b, g.lps, g.offsets)
		} else {
			b = append(b, "null"...)
		}
	}
	b = append(b, `,"finish_reason":`...)
	b = appendFinish(b, finish)
	b = append(b, `}],"usage":`...)
	b = appendUsage(b, prompt, g.tokens)
	b = append(b, "}\n"...)
	g.w.Header().Set("Content-Type", "application/json")
	if _, err := g.w.Write(b); err != nil {
		g.clientGone()
	}
}
