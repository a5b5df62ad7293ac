package api

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// The response bodies are appended by hand into a reused buffer: a streamed
// token costs one small append and one write, not a reflection-driven
// marshal. The shapes are OpenAI's (the SDK tests parse every one of them).

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD (a
// token's own bytes may be a fragment of a character; its "bytes" field
// carries them exactly). U+2028 and U+2029 are escaped so the output is also
// valid JavaScript.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendLogprob appends a logprob. JSON has no -Inf: a token the sampler
// could never pick gets -9999, the value OpenAI uses for it.
func appendLogprob(dst []byte, lp float32) []byte {
	if math.IsInf(float64(lp), 0) || math.IsNaN(float64(lp)) || lp < -9999 {
		lp = -9999
	}
	return strconv.AppendFloat(dst, float64(lp), 'g', -1, 32)
}

func appendBytes(dst []byte, s string) []byte {
	dst = append(dst, '[')
	for i := 0; i < len(s); i++ {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(s[i]), 10)
	}
	return append(dst, ']')
}

func appendUsage(dst []byte, prompt, completion int) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	return append(dst, '}')
}

// appendHead appends the fields every response object starts with.
func appendHead(dst []byte, id, object string, created int64, model string) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, created, 10)
	dst = append(dst, `,"model":`...)
	return appendString(dst, model)
}

func appendFinish(dst []byte, reason string) []byte {
	if reason == "" {
		return append(dst, "null"...)
	}
	return appendString(dst, reason)
}

// appendChatLogprobEntry appends one element of choices[].logprobs.content.
func appendChatLogprobEntry(dst []byte, t *Token) []byte {
	dst = append(dst, `{"token":`...)
	dst = appendString(dst, t.Bytes)
	dst = append(dst, `,"logprob":`...)
	dst = appendLogprob(dst, t.Logprob)
	dst = append(dst, `,"bytes":`...)
	dst = appendBytes(dst, t.Bytes)
	dst = append(dst, `,"top_logprobs":[`...)
	for i := range t.Top {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"token":`...)
		dst = appendString(dst, t.Top[i].Bytes)
		dst = append(dst, `,"logprob":`...)
		dst = appendLogprob(dst, t.Top[i].Logprob)
		dst = append(dst, `,"bytes":`...)
		dst = appendBytes(dst, t.Top[i].Bytes)
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// appendChatLogprobs appends a chat choice's logprobs object for toks.
func appendChatLogprobs(dst []byte, toks []Token) []byte {
	dst = append(dst, `{"content":[`...)
	for i := range toks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendChatLogprobEntry(dst, &toks[i])
	}
	return append(dst, `],"refusal":null}`...)
}

// appendCompletionLogprobs appends a completions choice's logprobs object:
// parallel arrays, top_logprobs as one {token: logprob} object per position.
// offsets[i] is the byte offset of token i's text in the completion.
func appendCompletionLogprobs(dst []byte, toks []Token, offsets []int) []byte {
	dst = append(dst, `{"tokens":[`...)
	for i := range toks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, toks[i].Bytes)
	}
	dst = append(dst, `],"token_logprobs":[`...)
	for i := range toks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendLogprob(dst, toks[i].Logprob)
	}
	dst = append(dst, `],"top_logprobs":[`...)
	for i := range toks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '{')
		for j := range toks[i].Top {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, toks[i].Top[j].Bytes)
			dst = append(dst, ':')
			dst = appendLogprob(dst, toks[i].Top[j].Logprob)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"text_offset":[`...)
	for i := range offsets {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(offsets[i]), 10)
	}
	return append(dst, "]}"...)
}

// appendError appends an OpenAI error body.
func appendError(dst []byte, e *ErrorInfo) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendString(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, e.Type)
	dst = append(dst, `,"param":`...)
	if e.Param == "" {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, e.Param)
	}
	dst = append(dst, `,"code":`...)
	if e.Code == "" {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, e.Code)
	}
	return append(dst, "}}"...)
}
