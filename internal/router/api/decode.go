package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on request fields. They are part of the API (the error messages
// name them).
const (
	maxStop        = 4     // stop sequences, as OpenAI documents
	maxTopLogprobs = 20    // chat top_logprobs
	maxCompLogprob = 5     // completions logprobs
	maxMessages    = 10000 // chat messages per request
	maxEcho        = 64    // bytes of a client-supplied name echoed in an error
)

// Error codes of parameter errors (the "code" of the error body).
const (
	codeInvalidJSON = "invalid_json"
	codeInvalidType = "invalid_type"
	codeInvalid     = "invalid_value"
	codeUnsupported = "unsupported_parameter"
	codeUnknown     = "unknown_parameter"
	codeMissing     = "missing_required_parameter"
)

// ParamError is a request the api package rejects itself: bad JSON, a wrong
// type, a value out of range, an unsupported or unknown field. It becomes a
// 400 invalid_request_error naming Param.
type ParamError struct {
	Param   string // the offending field ("messages[2].role"); "" for the body as a whole
	Code    string
	Message string
}

func (e *ParamError) Error() string { return e.Message }

func paramErr(param, code, format string, args ...any) *ParamError {
	return &ParamError{Param: param, Code: code, Message: fmt.Sprintf(format, args...)}
}

// call is a decoded request: what the backend gets, plus what the api layer
// applies itself.
type call struct {
	req          Request
	maxTokensSet bool
	stream       bool
	includeUsage bool
	stop         []string

	streamOptions bool // stream_options was given
}

// decodeLimits are the configured bounds decoding applies.
type decodeLimits struct {
	defaultChatMax int // max tokens of a chat request that sets none
	defaultCompMax int // of a completions request
	maxTokensLimit int // largest max_tokens accepted before the model is known
}

type fieldFunc func(c *call, raw json.RawMessage) error

// The fields each endpoint knows. Every request field is in exactly one of
// three groups: supported (used), accepted (harmless: ignored because it
// cannot change the output, or accepted only at the value that means
// "feature off"), and unsupported (400 naming it unless null). A field in
// none of them is unknown: 400 naming it.
var chatFields = map[string]fieldFunc{
	"model":                 fModel,
	"messages":              fMessages,
	"max_tokens":            fMaxTokens("max_tokens"),
	"max_completion_tokens": fMaxTokens("max_completion_tokens"),
	"temperature":           fTemperature,
	"top_p":                 fTopP,
	"seed":                  fSeed,
	"stop":                  fStop,
	"logprobs":              fChatLogprobs,
	"top_logprobs":          fTopLogprobs,
	"stream":                fStream,
	"stream_options":        fStreamOptions,
	// accepted
	"n":                   fOne("n"),
	"presence_penalty":    fZero("presence_penalty"),
	"frequency_penalty":   fZero("frequency_penalty"),
	"logit_bias":          fEmptyObject("logit_bias"),
	"response_format":     fResponseFormat,
	"tools":               fEmptyArray("tools"),
	"functions":           fEmptyArray("functions"),
	"tool_choice":         fEnum("tool_choice", "none", "auto"),
	"parallel_tool_calls": fIgnoredBool("parallel_tool_calls"),
	"user":                fIgnoredString("user"),
	"safety_identifier":   fIgnoredString("safety_identifier"),
	"prompt_cache_key":    fIgnoredString("prompt_cache_key"),
	"metadata":            fMetadata,
	"store":               fFalse("store"),
	"service_tier":        fEnum("service_tier", "auto", "default"),
	"modalities":          fModalities,
	// unsupported
	"audio":                  fUnsupported("audio"),
	"function_call":          fUnsupported("function_call"),
	"prediction":             fUnsupported("prediction"),
	"reasoning_effort":       fUnsupported("reasoning_effort"),
	"verbosity":              fUnsupported("verbosity"),
	"web_search_options":     fUnsupported("web_search_options"),
	"moderation":             fUnsupported("moderation"),
	"prompt_cache_options":   fUnsupported("prompt_cache_options"),
	"prompt_cache_retention": fUnsupported("prompt_cache_retention"),
}

var completionFields = map[string]fieldFunc{
	"model":          fModel,
	"prompt":         fPrompt,
	"max_tokens":     fMaxTokens("max_tokens"),
	"temperature":    fTemperature,
	"top_p":          fTopP,
	"seed":           fSeed,
	"stop":           fStop,
	"logprobs":       fCompletionLogprobs,
	"stream":         fStream,
	"stream_options": fStreamOptions,
	// accepted
	"n":                 fOne("n"),
	"best_of":           fOne("best_of"),
	"echo":              fFalse("echo"),
	"suffix":            fEmptyString("suffix"),
	"presence_penalty":  fZero("presence_penalty"),
	"frequency_penalty": fZero("frequency_penalty"),
	"logit_bias":        fEmptyObject("logit_bias"),
	"user":              fIgnoredString("user"),
}

// decodeChat decodes and validates a chat completions body.
func decodeChat(body []byte, lim decodeLimits) (call, error) {
	c := call{req: Request{Chat: true, Temperature: 1, TopP: 1}}
	if err := decodeObject(body, chatFields, &c); err != nil {
		return call{}, err
	}
	if c.req.Messages == nil {
		return call{}, paramErr("messages", codeMissing, "Missing required parameter: 'messages'.")
	}
	return finish(c, lim.defaultChatMax, lim)
}

// decodeCompletion decodes and validates a completions body.
func decodeCompletion(body []byte, lim decodeLimits) (call, error) {
	c := call{req: Request{Temperature: 1, TopP: 1}}
	if err := decodeObject(body, completionFields, &c); err != nil {
		return call{}, err
	}
	if c.req.Prompt == "" {
		return call{}, paramErr("prompt", codeMissing, "Missing required parameter: 'prompt'.")
	}
	return finish(c, lim.defaultCompMax, lim)
}

// finish applies the cross-field rules and defaults.
func finish(c call, defaultMax int, lim decodeLimits) (call, error) {
	if c.req.Model == "" {
		return call{}, paramErr("model", codeMissing, "Missing required parameter: 'model'.")
	}
	if !c.maxTokensSet {
		c.req.MaxTokens = defaultMax
		c.req.MaxTokensAuto = true
	} else if c.req.MaxTokens > lim.maxTokensLimit {
		return call{}, paramErr("max_tokens", codeInvalid,
			"Invalid 'max_tokens': integer above maximum value. Expected a value <= %d, but got %d instead.",
			lim.maxTokensLimit, c.req.MaxTokens)
	}
	if c.req.TopP == 0 {
		// top_p 0 keeps only the most likely token: greedy. Said here so
		// that no sampler has to agree on what a zero nucleus means.
		c.req.Temperature, c.req.TopP = 0, 1
	}
	if c.req.TopLogprobs > 0 && !c.req.Logprobs {
		return call{}, paramErr("top_logprobs", codeInvalid, "Invalid 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is set.")
	}
	if c.streamOptions && !c.stream {
		// As OpenAI does: the options would be silently meaningless.
		return call{}, paramErr("stream_options", codeInvalid, "Invalid 'stream_options': only allowed when 'stream' is true.")
	}
	return c, nil
}

// decodeObject checks the body is one valid UTF-8 JSON object with known
// fields only, then runs each field's decoder. Fields are decoded in sorted
// order so that the error for a body with several bad fields is
// deterministic.
func decodeObject(body []byte, spec map[string]fieldFunc, c *call) error {
	// encoding/json replaces invalid UTF-8 by U+FFFD silently; JSON text
	// must be UTF-8 (RFC 8259), so refuse instead of generating from a
	// prompt the client did not send.
	if !utf8.Valid(body) {
		return paramErr("", codeInvalidJSON, "The request body is not valid UTF-8.")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return paramErr("", codeInvalidJSON, "The request body is empty; expected a JSON object.")
	}
	if trimmed[0] != '{' {
		return paramErr("", codeInvalidJSON, "The request body must be a JSON object.")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return jsonError("", err)
	}
	var unknown []string
	names := make([]string, 0, len(fields))
	for name := range fields {
		if _, ok := spec[name]; !ok {
			unknown = append(unknown, name)
			continue
		}
		names = append(names, name)
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		shown := unknown[:min(len(unknown), 5)]
		quoted := make([]string, len(shown))
		for i, u := range shown {
			quoted[i] = "'" + echo(u) + "'"
		}
		more := ""
		if len(unknown) > len(shown) {
			more = fmt.Sprintf(" (and %d more)", len(unknown)-len(shown))
		}
		return paramErr(echo(unknown[0]), codeUnknown, "Unrecognized request argument supplied: %s%s.", strings.Join(quoted, ", "), more)
	}
	slices.Sort(names)
	for _, name := range names {
		raw := fields[name]
		if isNull(raw) {
			continue // null means absent, as in OpenAI's API
		}
		if err := spec[name](c, raw); err != nil {
			return err
		}
	}
	return nil
}

// echo bounds a client-supplied name before it is put in an error message.
func echo(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	cut := maxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

func jsonError(param string, err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return paramErr(param, codeInvalidJSON, "We could not parse the JSON body of your request: %s (at byte %d).", syn.Error(), syn.Offset)
	}
	return paramErr(param, codeInvalidJSON, "We could not parse the JSON body of your request: %s.", err.Error())
}

func typeErr(param, want string) error {
	return paramErr(param, codeInvalidType, "Invalid type for '%s': expected %s.", param, want)
}

// Typed readers. raw is a complete JSON value (the map decode checked it),
// never null.

func readString(param string, raw json.RawMessage) (string, error) {
	if raw[0] != '"' {
		return "", typeErr(param, "a string")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", typeErr(param, "a string")
	}
	return s, nil
}

func readBool(param string, raw json.RawMessage) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, typeErr(param, "a boolean")
}

func readNumber(param string, raw json.RawMessage) (float64, error) {
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, typeErr(param, "a number")
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, paramErr(param, codeInvalid, "Invalid '%s': number out of range.", param)
	}
	return f, nil
}

// readInt accepts integers, and numbers with an integral value (1.0, 1e3),
// as JSON does not distinguish them.
func readInt(param string, raw json.RawMessage) (int64, error) {
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, typeErr(param, "an integer")
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err == nil && f != math.Trunc(f) {
		return 0, typeErr(param, "an integer")
	}
	if err != nil || f >= 1<<63 || f < -(1<<63) {
		return 0, paramErr(param, codeInvalid, "Invalid '%s': integer out of range.", param)
	}
	return int64(f), nil
}

func readArray(param string, raw json.RawMessage) ([]json.RawMessage, error) {
	if raw[0] != '[' {
		return nil, typeErr(param, "an array")
	}
	var a []json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, jsonError(param, err)
	}
	return a, nil
}

func readObject(param string, raw json.RawMessage) (map[string]json.RawMessage, error) {
	if raw[0] != '{' {
		return nil, typeErr(param, "an object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, jsonError(param, err)
	}
	return m, nil
}

// Field decoders.

func fModel(c *call, raw json.RawMessage) error {
	s, err := readString("model", raw)
	if err != nil {
		return err
	}
	if s == "" {
		return paramErr("model", codeMissing, "Missing required parameter: 'model'.")
	}
	c.req.Model = s
	return nil
}

func fMaxTokens(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		n, err := readInt(param, raw)
		if err != nil {
			return err
		}
		if n < 1 {
			return paramErr(param, codeInvalid, "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", param, n)
		}
		if n > math.MaxInt32 {
			return paramErr(param, codeInvalid, "Invalid '%s': integer above maximum value. Expected a value <= %d, but got %d instead.", param, math.MaxInt32, n)
		}
		if c.maxTokensSet && int64(c.req.MaxTokens) != n {
			return paramErr(param, codeInvalid, "Invalid '%s': 'max_tokens' and 'max_completion_tokens' are both set, to different values.", param)
		}
		c.maxTokensSet = true
		c.req.MaxTokens = int(n)
		return nil
	}
}

func fTemperature(c *call, raw json.RawMessage) error {
	f, err := readNumber("temperature", raw)
	if err != nil {
		return err
	}
	if f < 0 || f > 2 {
		return paramErr("temperature", codeInvalid, "Invalid 'temperature': expected a value between 0 and 2, but got %g instead.", f)
	}
	c.req.Temperature = f
	return nil
}

func fTopP(c *call, raw json.RawMessage) error {
	f, err := readNumber("top_p", raw)
	if err != nil {
		return err
	}
	if f < 0 || f > 1 {
		return paramErr("top_p", codeInvalid, "Invalid 'top_p': expected a value between 0 and 1, but got %g instead.", f)
	}
	c.req.TopP = f
	return nil
}

func fSeed(c *call, raw json.RawMessage) error {
	n, err := readInt("seed", raw)
	if err != nil {
		return err
	}
	c.req.Seed = &n
	return nil
}

func fStop(c *call, raw json.RawMessage) error {
	var stops []string
	if raw[0] == '"' {
		s, err := readString("stop", raw)
		if err != nil {
			return err
		}
		stops = []string{s}
	} else {
		a, err := readArray("stop", raw)
		if err != nil {
			return typeErr("stop", "a string or an array of strings")
		}
		if len(a) > maxStop {
			return paramErr("stop", codeInvalid, "Invalid 'stop': array too long. Expected an array with maximum length %d, but got an array with length %d instead.", maxStop, len(a))
		}
		for i, r := range a {
			s, err := readString(fmt.Sprintf("stop[%d]", i), r)
			if err != nil {
				return err
			}
			stops = append(stops, s)
		}
	}
	for i, s := range stops {
		if s == "" {
			return paramErr("stop", codeInvalid, "Invalid 'stop': stop sequence %d is empty.", i)
		}
	}
	c.stop = stops
	return nil
}

func fChatLogprobs(c *call, raw json.RawMessage) error {
	b, err := readBool("logprobs", raw)
	c.req.Logprobs = b
	return err
}

func fTopLogprobs(c *call, raw json.RawMessage) error {
	n, err := readInt("top_logprobs", raw)
	if err != nil {
		return err
	}
	if n < 0 || n > maxTopLogprobs {
		return paramErr("top_logprobs", codeInvalid, "Invalid 'top_logprobs': expected a value between 0 and %d, but got %d instead.", maxTopLogprobs, n)
	}
	c.req.TopLogprobs = int(n)
	return nil
}

// fCompletionLogprobs: completions take an integer; n returns the sampled
// token's logprob plus the n most likely alternatives (0 = the sampled token
// only).
func fCompletionLogprobs(c *call, raw json.RawMessage) error {
	n, err := readInt("logprobs", raw)
	if err != nil {
		return err
	}
	if n < 0 || n > maxCompLogprob {
		return paramErr("logprobs", codeInvalid, "Invalid 'logprobs': expected a value between 0 and %d, but got %d instead.", maxCompLogprob, n)
	}
	c.req.Logprobs = true
	c.req.TopLogprobs = int(n)
	return nil
}

func fStream(c *call, raw json.RawMessage) error {
	b, err := readBool("stream", raw)
	c.stream = b
	return err
}

func fStreamOptions(c *call, raw json.RawMessage) error {
	m, err := readObject("stream_options", raw)
	if err != nil {
		return err
	}
	for _, k := range sortedKeys(m) {
		v := m[k]
		param := "stream_options." + echo(k)
		switch {
		case isNull(v):
		case k == "include_usage":
			b, err := readBool(param, v)
			if err != nil {
				return err
			}
			c.includeUsage = b
		case k == "include_obfuscation":
			b, err := readBool(param, v)
			if err != nil {
				return err
			}
			if b {
				return paramErr(param, codeUnsupported, "Unsupported value for '%s': kvfence does not pad stream events; set it to false or omit it.", param)
			}
		default:
			return paramErr(param, codeUnknown, "Unrecognized request argument supplied: '%s'.", param)
		}
	}
	// stream_options without stream is refused in finish, once stream is known.
	c.streamOptions = true
	return nil
}

func fMessages(c *call, raw json.RawMessage) error {
	a, err := readArray("messages", raw)
	if err != nil {
		return err
	}
	if len(a) == 0 {
		return paramErr("messages", codeInvalid, "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.")
	}
	if len(a) > maxMessages {
		return paramErr("messages", codeInvalid, "Invalid 'messages': array too long. Expected an array with maximum length %d, but got an array with length %d instead.", maxMessages, len(a))
	}
	msgs := make([]Message, len(a))
	for i, r := range a {
		m, err := decodeMessage(i, r)
		if err != nil {
			return err
		}
		msgs[i] = m
	}
	c.req.Messages = msgs
	return nil
}

func decodeMessage(i int, raw json.RawMessage) (Message, error) {
	p := fmt.Sprintf("messages[%d]", i)
	obj, err := readObject(p, raw)
	if err != nil {
		return Message{}, err
	}
	var m Message
	haveRole, haveContent := false, false
	for _, k := range sortedKeys(obj) {
		v := obj[k]
		param := p + "." + echo(k)
		switch k {
		case "role":
			if isNull(v) {
				continue
			}
			s, err := readString(param, v)
			if err != nil {
				return Message{}, err
			}
			switch s {
			case "system", "user", "assistant":
				m.Role = s
			case "developer":
				// OpenAI's newer name for system instructions; chat
				// templates know only "system".
				m.Role = "system"
			case "tool", "function":
				return Message{}, paramErr(param, codeUnsupported, "Unsupported value for '%s': kvfence does not support tool calling, so messages with role '%s' are not accepted.", param, s)
			default:
				return Message{}, paramErr(param, codeInvalid, "Invalid value for '%s': '%s'. Supported values are: 'system', 'developer', 'user' and 'assistant'.", param, echo(s))
			}
			haveRole = true
		case "content":
			if isNull(v) {
				continue
			}
			s, err := decodeContent(param, v)
			if err != nil {
				return Message{}, err
			}
			m.Content = s
			haveContent = true
		case "refusal":
			// Assistant messages copied from a response carry refusal: null.
			if !isNull(v) {
				return Message{}, paramErr(param, codeUnsupported, "Unsupported parameter: '%s' is not supported by kvfence.", param)
			}
		case "name", "tool_calls", "tool_call_id", "function_call", "audio", "annotations":
			if isNull(v) || (k == "tool_calls" && string(v) == "[]") {
				continue
			}
			return Message{}, paramErr(param, codeUnsupported, "Unsupported parameter: '%s' is not supported by kvfence.", param)
		default:
			return Message{}, paramErr(param, codeUnknown, "Unrecognized request argument supplied: '%s'.", param)
		}
	}
	if !haveRole {
		return Message{}, paramErr(p+".role", codeMissing, "Missing required parameter: '%s.role'.", p)
	}
	if !haveContent {
		return Message{}, paramErr(p+".content", codeMissing, "Missing required parameter: '%s.content'.", p)
	}
	return m, nil
}

// decodeContent accepts a string or an array of text parts, which it joins.
func decodeContent(param string, raw json.RawMessage) (string, error) {
	if raw[0] == '"' {
		return readString(param, raw)
	}
	parts, err := readArray(param, raw)
	if err != nil {
		return "", typeErr(param, "a string or an array of content parts")
	}
	var sb strings.Builder
	for j, pr := range parts {
		pp := fmt.Sprintf("%s[%d]", param, j)
		obj, err := readObject(pp, pr)
		if err != nil {
			return "", err
		}
		typ, ok := obj["type"]
		if !ok || isNull(typ) {
			return "", paramErr(pp+".type", codeMissing, "Missing required parameter: '%s.type'.", pp)
		}
		ts, err := readString(pp+".type", typ)
		if err != nil {
			return "", err
		}
		if ts != "text" {
			return "", paramErr(pp+".type", codeUnsupported, "Unsupported value for '%s.type': '%s'. kvfence accepts only 'text' content parts.", pp, echo(ts))
		}
		for _, k := range sortedKeys(obj) {
			if k != "type" && k != "text" {
				return "", paramErr(pp+"."+echo(k), codeUnknown, "Unrecognized request argument supplied: '%s.%s'.", pp, echo(k))
			}
		}
		tr, ok := obj["text"]
		if !ok || isNull(tr) {
			return "", paramErr(pp+".text", codeMissing, "Missing required parameter: '%s.text'.", pp)
		}
		s, err := readString(pp+".text", tr)
		if err != nil {
			return "", err
		}
		sb.WriteString(s)
	}
	return sb.String(), nil
}

func fPrompt(c *call, raw json.RawMessage) error {
	var s string
	if raw[0] == '"' {
		var err error
		if s, err = readString("prompt", raw); err != nil {
			return err
		}
	} else {
		a, err := readArray("prompt", raw)
		if err != nil {
			return typeErr("prompt", "a string")
		}
		if len(a) != 1 || a[0][0] != '"' {
			// Several prompts are a batch (n results), and token-id prompts
			// bypass the tokenizer: neither is supported.
			return paramErr("prompt", codeUnsupported, "Unsupported value for 'prompt': kvfence accepts one prompt per request, as a string.")
		}
		if s, err = readString("prompt", a[0]); err != nil {
			return err
		}
	}
	if s == "" {
		return paramErr("prompt", codeInvalid, "Invalid 'prompt': empty string.")
	}
	c.req.Prompt = s
	return nil
}

// Accepted fields: checked for type, and for the value meaning "off".

func fOne(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		n, err := readInt(param, raw)
		if err != nil {
			return err
		}
		if n != 1 {
			return paramErr(param, codeUnsupported, "Unsupported value for '%s': kvfence generates one choice per request, so '%s' must be 1 (got %d).", param, param, n)
		}
		return nil
	}
}

func fZero(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		f, err := readNumber(param, raw)
		if err != nil {
			return err
		}
		if f != 0 {
			return paramErr(param, codeUnsupported, "Unsupported value for '%s': kvfence does not apply penalties, so '%s' must be 0 (got %g).", param, param, f)
		}
		return nil
	}
}

func fFalse(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		b, err := readBool(param, raw)
		if err != nil {
			return err
		}
		if b {
			return paramErr(param, codeUnsupported, "Unsupported value for '%s': kvfence supports only false.", param)
		}
		return nil
	}
}

func fEmptyString(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		s, err := readString(param, raw)
		if err != nil {
			return err
		}
		if s != "" {
			return paramErr(param, codeUnsupported, "Unsupported parameter: '%s' is not supported by kvfence.", param)
		}
		return nil
	}
}

func fEmptyObject(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		m, err := readObject(param, raw)
		if err != nil {
			return err
		}
		if len(m) != 0 {
			return paramErr(param, codeUnsupported, "Unsupported parameter: '%s' is not supported by kvfence.", param)
		}
		return nil
	}
}

func fEmptyArray(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		a, err := readArray(param, raw)
		if err != nil {
			return err
		}
		if len(a) != 0 {
			return paramErr(param, codeUnsupported, "Unsupported parameter: '%s' is not supported by kvfence.", param)
		}
		return nil
	}
}

func fEnum(param string, allowed ...string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		if raw[0] != '"' {
			return paramErr(param, codeUnsupported, "Unsupported value for '%s': kvfence accepts only '%s'.", param, strings.Join(allowed, "', '"))
		}
		s, err := readString(param, raw)
		if err != nil {
			return err
		}
		if !slices.Contains(allowed, s) {
			return paramErr(param, codeUnsupported, "Unsupported value for '%s': '%s'. kvfence accepts only '%s'.", param, echo(s), strings.Join(allowed, "', '"))
		}
		return nil
	}
}

func fIgnoredBool(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		_, err := readBool(param, raw)
		return err
	}
}

func fIgnoredString(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		_, err := readString(param, raw)
		return err
	}
}

func fMetadata(c *call, raw json.RawMessage) error {
	m, err := readObject("metadata", raw)
	if err != nil {
		return err
	}
	for _, k := range sortedKeys(m) {
		if _, err := readString("metadata."+echo(k), m[k]); err != nil {
			return err
		}
	}
	return nil
}

func fResponseFormat(c *call, raw json.RawMessage) error {
	m, err := readObject("response_format", raw)
	if err != nil {
		return err
	}
	t, ok := m["type"]
	if !ok || len(m) != 1 {
		return paramErr("response_format", codeUnsupported, "Unsupported value for 'response_format': kvfence supports only {\"type\": \"text\"}.")
	}
	s, err := readString("response_format.type", t)
	if err != nil {
		return err
	}
	if s != "text" {
		return paramErr("response_format.type", codeUnsupported, "Unsupported value for 'response_format.type': '%s'. kvfence supports only 'text'.", echo(s))
	}
	return nil
}

func fModalities(c *call, raw json.RawMessage) error {
	a, err := readArray("modalities", raw)
	if err != nil {
		return err
	}
	for i, r := range a {
		s, err := readString(fmt.Sprintf("modalities[%d]", i), r)
		if err != nil {
			return err
		}
		if s != "text" {
			return paramErr("modalities", codeUnsupported, "Unsupported value for 'modalities': '%s'. kvfence supports only 'text'.", echo(s))
		}
	}
	return nil
}

func fUnsupported(param string) fieldFunc {
	return func(c *call, raw json.RawMessage) error {
		return paramErr(param, codeUnsupported, "Unsupported parameter: '%s' is not supported by kvfence.", param)
	}
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
