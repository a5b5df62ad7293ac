package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

func do(f *fixture, method, path, body, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	return rec
}

// errorBody is the exact body of an error response.
func errorBody(message, typ, param, code string) string {
	var p, c any
	if param != "" {
		p = param
	}
	if code != "" {
		c = code
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(map[string]any{"error": map[string]any{"message": message, "type": typ, "param": p, "code": c}})
	// encoding/json sorts map keys; our body has OpenAI's order.
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Param   any    `json:"param"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(buf.Bytes(), &e)
	buf.Reset()
	enc.Encode(e)
	return buf.String()
}

const inv = "invalid_request_error"

func TestDecodeErrors(t *testing.T) {
	msg := `"messages":[{"role":"user","content":"hi"}]`
	chat := func(extra string) string { return `{"model":"kvfence-test",` + msg + extra + `}` }
	tests := []struct {
		name       string
		completion bool
		body       string
		status     int
		want       string // exact body
	}{
		{"malformed JSON", false, `{"model":`, 400,
			errorBody("We could not parse the JSON body of your request: unexpected end of JSON input (at byte 9).", inv, "", "invalid_json")},
		{"bad JSON syntax", false, `{"model" "x"}`, 400,
			errorBody("We could not parse the JSON body of your request: invalid character '\"' after object key (at byte 10).", inv, "", "invalid_json")},
		{"trailing garbage", false, chat("") + `{}`, 400,
			errorBody("We could not parse the JSON body of your request: invalid character '{' after top-level value (at byte 69).", inv, "", "invalid_json")},
		{"not an object", false, `[1,2]`, 400,
			errorBody("The request body must be a JSON object.", inv, "", "invalid_json")},
		{"null body", false, `null`, 400,
			errorBody("The request body must be a JSON object.", inv, "", "invalid_json")},
		{"empty body", false, ``, 400,
			errorBody("The request body is empty; expected a JSON object.", inv, "", "invalid_json")},
		{"invalid UTF-8", false, `{"model":"kvfence-test","messages":[{"role":"user","content":"a` + "\xff\xfe" + `"}]}`, 400,
			errorBody("The request body is not valid UTF-8.", inv, "", "invalid_json")},
		{"max_tokens string", false, chat(`,"max_tokens":"5"`), 400,
			errorBody("Invalid type for 'max_tokens': expected an integer.", inv, "max_tokens", "invalid_type")},
		{"max_tokens fraction", false, chat(`,"max_tokens":2.5`), 400,
			errorBody("Invalid type for 'max_tokens': expected an integer.", inv, "max_tokens", "invalid_type")},
		{"max_tokens negative", false, chat(`,"max_tokens":-1`), 400,
			errorBody("Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got -1 instead.", inv, "max_tokens", "invalid_value")},
		{"max_tokens zero", false, chat(`,"max_completion_tokens":0`), 400,
			errorBody("Invalid 'max_completion_tokens': integer below minimum value. Expected a value >= 1, but got 0 instead.", inv, "max_completion_tokens", "invalid_value")},
		{"max_tokens huge", false, chat(`,"max_tokens":1000000000000`), 400,
			errorBody("Invalid 'max_tokens': integer above maximum value. Expected a value <= 2147483647, but got 1000000000000 instead.", inv, "max_tokens", "invalid_value")},
		{"max_tokens beyond int64", false, chat(`,"max_tokens":1e30`), 400,
			errorBody("Invalid 'max_tokens': integer out of range.", inv, "max_tokens", "invalid_value")},
		{"max_tokens over limit", false, chat(`,"max_tokens":5000000`), 400,
			errorBody("Invalid 'max_tokens': integer above maximum value. Expected a value <= 1048576, but got 5000000 instead.", inv, "max_tokens", "invalid_value")},
		{"max_tokens fills the context", false, chat(`,"max_tokens":200`), 400,
			errorBody("Invalid 'max_tokens': 200 tokens leave no room for a prompt; this model's maximum context length is 200 tokens.", inv, "max_tokens", "invalid_value")},
		{"max_tokens conflict", false, chat(`,"max_tokens":5,"max_completion_tokens":6`), 400,
			errorBody("Invalid 'max_tokens': 'max_tokens' and 'max_completion_tokens' are both set, to different values.", inv, "max_tokens", "invalid_value")},
		{"unknown model", false, `{"model":"gpt-9",` + msg + `}`, 404,
			errorBody("The model 'gpt-9' does not exist.", inv, "model", "model_not_found")},
		{"missing model", false, `{` + msg + `}`, 400,
			errorBody("Missing required parameter: 'model'.", inv, "model", "missing_required_parameter")},
		{"model not a string", false, `{"model":7,` + msg + `}`, 400,
			errorBody("Invalid type for 'model': expected a string.", inv, "model", "invalid_type")},
		{"n=2", false, chat(`,"n":2`), 400,
			errorBody("Unsupported value for 'n': kvfence generates one choice per request, so 'n' must be 1 (got 2).", inv, "n", "unsupported_parameter")},
		{"tools", false, chat(`,"tools":[{"type":"function","function":{"name":"f"}}]`), 400,
			errorBody("Unsupported parameter: 'tools' is not supported by kvfence.", inv, "tools", "unsupported_parameter")},
		{"response_format json", false, chat(`,"response_format":{"type":"json_object"}`), 400,
			errorBody("Unsupported value for 'response_format.type': 'json_object'. kvfence supports only 'text'.", inv, "response_format.type", "unsupported_parameter")},
		{"logit_bias", false, chat(`,"logit_bias":{"50256":-100}`), 400,
			errorBody("Unsupported parameter: 'logit_bias' is not supported by kvfence.", inv, "logit_bias", "unsupported_parameter")},
		{"presence_penalty", false, chat(`,"presence_penalty":0.5`), 400,
			errorBody("Unsupported value for 'presence_penalty': kvfence does not apply penalties, so 'presence_penalty' must be 0 (got 0.5).", inv, "presence_penalty", "unsupported_parameter")},
		{"reasoning_effort", false, chat(`,"reasoning_effort":"low"`), 400,
			errorBody("Unsupported parameter: 'reasoning_effort' is not supported by kvfence.", inv, "reasoning_effort", "unsupported_parameter")},
		{"unknown field", false, chat(`,"max_token":5`), 400,
			errorBody("Unrecognized request argument supplied: 'max_token'.", inv, "max_token", "unknown_parameter")},
		{"unknown fields", false, chat(`,"zz":1,"aa":2,"b":3,"c":4,"d":5,"e":6,"f":7`), 400,
			errorBody("Unrecognized request argument supplied: 'aa', 'b', 'c', 'd', 'e' (and 2 more).", inv, "aa", "unknown_parameter")},
		{"case matters", false, chat(`,"MAX_TOKENS":5`), 400,
			errorBody("Unrecognized request argument supplied: 'MAX_TOKENS'.", inv, "MAX_TOKENS", "unknown_parameter")},
		{"messages missing", false, `{"model":"kvfence-test"}`, 400,
			errorBody("Missing required parameter: 'messages'.", inv, "messages", "missing_required_parameter")},
		{"messages not an array", false, `{"model":"kvfence-test","messages":"hi"}`, 400,
			errorBody("Invalid type for 'messages': expected an array.", inv, "messages", "invalid_type")},
		{"empty messages", false, `{"model":"kvfence-test","messages":[]}`, 400,
			errorBody("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.", inv, "messages", "invalid_value")},
		{"unknown role", false, `{"model":"kvfence-test","messages":[{"role":"user","content":"a"},{"role":"robot","content":"b"}]}`, 400,
			errorBody("Invalid value for 'messages[1].role': 'robot'. Supported values are: 'system', 'developer', 'user' and 'assistant'.", inv, "messages[1].role", "invalid_value")},
		{"tool role", false, `{"model":"kvfence-test","messages":[{"role":"tool","content":"b","tool_call_id":"x"}]}`, 400,
			errorBody("Unsupported value for 'messages[0].role': kvfence does not support tool calling, so messages with role 'tool' are not accepted.", inv, "messages[0].role", "unsupported_parameter")},
		{"tool calls", false, `{"model":"kvfence-test","messages":[{"role":"assistant","content":"b","tool_calls":[{"id":"x"}]}]}`, 400,
			errorBody("Unsupported parameter: 'messages[0].tool_calls' is not supported by kvfence.", inv, "messages[0].tool_calls", "unsupported_parameter")},
		{"missing content", false, `{"model":"kvfence-test","messages":[{"role":"user"}]}`, 400,
			errorBody("Missing required parameter: 'messages[0].content'.", inv, "messages[0].content", "missing_required_parameter")},
		{"missing role", false, `{"model":"kvfence-test","messages":[{"content":"x"}]}`, 400,
			errorBody("Missing required parameter: 'messages[0].role'.", inv, "messages[0].role", "missing_required_parameter")},
		{"message not an object", false, `{"model":"kvfence-test","messages":["hi"]}`, 400,
			errorBody("Invalid type for 'messages[0]': expected an object.", inv, "messages[0]", "invalid_type")},
		{"message unknown field", false, `{"model":"kvfence-test","messages":[{"role":"user","content":"x","weight":1}]}`, 400,
			errorBody("Unrecognized request argument supplied: 'messages[0].weight'.", inv, "messages[0].weight", "unknown_parameter")},
		{"image part", false, `{"model":"kvfence-test","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400,
			errorBody("Unsupported value for 'messages[0].content[0].type': 'image_url'. kvfence accepts only 'text' content parts.", inv, "messages[0].content[0].type", "unsupported_parameter")},
		{"content number", false, `{"model":"kvfence-test","messages":[{"role":"user","content":5}]}`, 400,
			errorBody("Invalid type for 'messages[0].content': expected a string or an array of content parts.", inv, "messages[0].content", "invalid_type")},
		{"five stops", false, chat(`,"stop":["a","b","c","d","e"]`), 400,
			errorBody("Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length 5 instead.", inv, "stop", "invalid_value")},
		{"empty stop", false, chat(`,"stop":""`), 400,
			errorBody("Invalid 'stop': stop sequence 0 is empty.", inv, "stop", "invalid_value")},
		{"stop number", false, chat(`,"stop":["a",3]`), 400,
			errorBody("Invalid type for 'stop[1]': expected a string.", inv, "stop[1]", "invalid_type")},
		{"temperature high", false, chat(`,"temperature":3`), 400,
			errorBody("Invalid 'temperature': expected a value between 0 and 2, but got 3 instead.", inv, "temperature", "invalid_value")},
		{"temperature string", false, chat(`,"temperature":"hot"`), 400,
			errorBody("Invalid type for 'temperature': expected a number.", inv, "temperature", "invalid_type")},
		{"top_p negative", false, chat(`,"top_p":-0.1`), 400,
			errorBody("Invalid 'top_p': expected a value between 0 and 1, but got -0.1 instead.", inv, "top_p", "invalid_value")},
		{"seed fraction", false, chat(`,"seed":1.5`), 400,
			errorBody("Invalid type for 'seed': expected an integer.", inv, "seed", "invalid_type")},
		{"logprobs string", false, chat(`,"logprobs":"yes"`), 400,
			errorBody("Invalid type for 'logprobs': expected a boolean.", inv, "logprobs", "invalid_type")},
		{"top_logprobs alone", false, chat(`,"top_logprobs":3`), 400,
			errorBody("Invalid 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is set.", inv, "top_logprobs", "invalid_value")},
		{"top_logprobs high", false, chat(`,"logprobs":true,"top_logprobs":21`), 400,
			errorBody("Invalid 'top_logprobs': expected a value between 0 and 20, but got 21 instead.", inv, "top_logprobs", "invalid_value")},
		{"stream_options without stream", false, chat(`,"stream_options":{"include_usage":true}`), 400,
			errorBody("Invalid 'stream_options': only allowed when 'stream' is true.", inv, "stream_options", "invalid_value")},
		{"stream_options unknown", false, chat(`,"stream":true,"stream_options":{"usage":true}`), 400,
			errorBody("Unrecognized request argument supplied: 'stream_options.usage'.", inv, "stream_options.usage", "unknown_parameter")},
		{"completion prompt missing", true, `{"model":"kvfence-test"}`, 400,
			errorBody("Missing required parameter: 'prompt'.", inv, "prompt", "missing_required_parameter")},
		{"completion token prompt", true, `{"model":"kvfence-test","prompt":[1,2,3]}`, 400,
			errorBody("Unsupported value for 'prompt': kvfence accepts one prompt per request, as a string.", inv, "prompt", "unsupported_parameter")},
		{"completion batch prompt", true, `{"model":"kvfence-test","prompt":["a","b"]}`, 400,
			errorBody("Unsupported value for 'prompt': kvfence accepts one prompt per request, as a string.", inv, "prompt", "unsupported_parameter")},
		{"completion empty prompt", true, `{"model":"kvfence-test","prompt":""}`, 400,
			errorBody("Invalid 'prompt': empty string.", inv, "prompt", "invalid_value")},
		{"completion logprobs 6", true, `{"model":"kvfence-test","prompt":"a","logprobs":6}`, 400,
			errorBody("Invalid 'logprobs': expected a value between 0 and 5, but got 6 instead.", inv, "logprobs", "invalid_value")},
		{"completion echo", true, `{"model":"kvfence-test","prompt":"a","echo":true}`, 400,
			errorBody("Unsupported value for 'echo': kvfence supports only false.", inv, "echo", "unsupported_parameter")},
		{"completion messages", true, `{"model":"kvfence-test","prompt":"a",` + msg + `}`, 400,
			errorBody("Unrecognized request argument supplied: 'messages'.", inv, "messages", "unknown_parameter")},
	}
	f := newFixture(t, Config{}, false)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := "/v1/chat/completions"
			if tt.completion {
				path = "/v1/completions"
			}
			rec := do(f, "POST", path, tt.body, "")
			if rec.Code != tt.status || rec.Body.String() != tt.want {
				t.Fatalf("got %d %s\nwant %d %s", rec.Code, rec.Body.String(), tt.status, tt.want)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
		})
	}
	f.assertClosed(t)
	if _, closed, _ := f.b.counts(); closed != 0 {
		t.Fatalf("%d rejected requests reached the backend", closed)
	}
}

func TestBodyTooLarge(t *testing.T) {
	f := newFixture(t, Config{}, false)
	body := `{"model":"kvfence-test","messages":[{"role":"user","content":"` + strings.Repeat("a", 10<<20) + `"}]}`
	rec := do(f, "POST", "/v1/chat/completions", body, "")
	want := errorBody("The request body is larger than the limit of 4194304 bytes.", inv, "", "request_too_large")
	if rec.Code != http.StatusRequestEntityTooLarge || rec.Body.String() != want {
		t.Fatalf("got %d %s", rec.Code, rec.Body.String())
	}
	// The server keeps serving.
	rec = do(f, "POST", "/v1/completions", `{"model":"kvfence-test","prompt":"ok","max_tokens":3}`, "")
	if !strings.Contains(rec.Body.String(), `"text":"ech"`) {
		t.Fatalf("after a large body: %d %s", rec.Code, rec.Body.String())
	}
}

func TestDecodeNormalizes(t *testing.T) {
	seed := int64(-42)
	tests := []struct {
		name       string
		completion bool
		body       string
		want       Request
		stream     bool
		stops      []string
	}{
		{"defaults", false, `{"model":"kvfence-test","messages":[{"role":"user","content":"hi"}]}`,
			Request{Chat: true, Model: testModel, Messages: []Message{{"user", "hi"}}, MaxTokens: 199, MaxTokensAuto: true, Temperature: 1, TopP: 1}, false, nil},
		{"everything", false, `{"model":"kvfence-test","messages":[{"role":"developer","content":"be brief"},
			{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"name":null},
			{"role":"assistant","content":"c","refusal":null,"tool_calls":[]}],
			"max_completion_tokens":7,"temperature":0,"top_p":0.5,"seed":-42,"stop":"\n","logprobs":true,"top_logprobs":2,
			"stream":true,"stream_options":{"include_usage":true},"n":1,"user":"u1","presence_penalty":0,"frequency_penalty":0.0,
			"logit_bias":{},"tools":[],"tool_choice":"none","response_format":{"type":"text"},"store":false,"metadata":{"k":"v"},
			"service_tier":"auto","modalities":["text"],"parallel_tool_calls":true,"max_tokens":null,"audio":null}`,
			Request{Chat: true, Model: testModel, Messages: []Message{{"system", "be brief"}, {"user", "ab"}, {"assistant", "c"}},
				MaxTokens: 7, Temperature: 0, TopP: 0.5, Seed: &seed, Logprobs: true, TopLogprobs: 2}, true, []string{"\n"}},
		{"top_p 0 is greedy", false, `{"model":"kvfence-test","messages":[{"role":"user","content":"x"}],"top_p":0,"temperature":0.7}`,
			Request{Chat: true, Model: testModel, Messages: []Message{{"user", "x"}}, MaxTokens: 199, MaxTokensAuto: true, Temperature: 0, TopP: 1}, false, nil},
		{"integral float max_tokens", false, `{"model":"kvfence-test","messages":[{"role":"user","content":""}],"max_tokens":5.0}`,
			Request{Chat: true, Model: testModel, Messages: []Message{{"user", ""}}, MaxTokens: 5, Temperature: 1, TopP: 1}, false, nil},
		{"completion", true, `{"model":"kvfence-test","prompt":["once"],"logprobs":0,"stop":["x","y"],"best_of":1,"echo":false,"suffix":null}`,
			Request{Model: testModel, Prompt: "once", MaxTokens: 16, MaxTokensAuto: true, Temperature: 1, TopP: 1, Logprobs: true}, false, []string{"x", "y"}},
	}
	lim := decodeLimits{defaultChatMax: 4096, defaultCompMax: 16, maxTokensLimit: 1 << 20}
	f := newFixture(t, Config{}, false)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			decode := decodeChat
			path := "/v1/chat/completions"
			if tt.completion {
				decode, path = decodeCompletion, "/v1/completions"
			}
			c, err := decode([]byte(tt.body), lim)
			if err != nil {
				t.Fatal(err)
			}
			if c.stream != tt.stream || !reflect.DeepEqual(c.stop, tt.stops) {
				t.Fatalf("stream %v stop %q", c.stream, c.stop)
			}
			// Through the handler: the backend sees the normalized request,
			// with the default clamped below the model's context.
			rec := do(f, "POST", path, tt.body, "")
			if rec.Code != 200 {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			got := f.b.last()
			if got.ID == "" || got.Tenant != "default" || rec.Header().Get("X-Request-Id") != got.ID {
				t.Fatalf("id %q tenant %q header %q", got.ID, got.Tenant, rec.Header().Get("X-Request-Id"))
			}
			got.ID, got.Tenant = "", ""
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("backend got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
