package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// These tests talk to the handler with the official OpenAI Go SDK: if the
// SDK parses our responses into the values we expect, the shapes are right.

func newSDK(t *testing.T, cfg Config, withKeys bool, key string) (*fixture, openai.Client) {
	t.Helper()
	f := newFixture(t, cfg, withKeys)
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	if key == "" {
		key = "unused"
	}
	return f, openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSDKChat(t *testing.T) {
	f, client := newSDK(t, Config{}, true, keyA)
	ctx := testCtx(t)
	resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     testModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("sys"), openai.UserMessage("héllo")},
		MaxTokens: openai.Int(50),
		Seed:      openai.Int(7),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 {
		t.Fatalf("%d choices", len(resp.Choices))
	}
	ch := resp.Choices[0]
	// "echo: héllo" is 11 characters and 12 tokens (é is two).
	if ch.Message.Content != "echo: héllo" || ch.FinishReason != "stop" || ch.Message.Role != "assistant" || ch.Index != 0 {
		t.Fatalf("choice %+v", ch)
	}
	if !strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Object != "chat.completion" || resp.Model != testModel || resp.Created != f.now.Unix() {
		t.Fatalf("head: id %q object %q model %q created %d", resp.ID, resp.Object, resp.Model, resp.Created)
	}
	// sys: 3+2, héllo: 5+2 prompt tokens.
	if u := resp.Usage; u.PromptTokens != 12 || u.CompletionTokens != 12 || u.TotalTokens != 24 {
		t.Fatalf("usage %+v", u)
	}
	if got := f.b.last(); got.Tenant != "tenant-a" || *got.Seed != 7 || got.MaxTokens != 50 || got.MaxTokensAuto {
		t.Fatalf("backend request %+v", got)
	}
	f.assertClosed(t)
}

func TestSDKChatStreamWithUsage(t *testing.T) {
	f, client := newSDK(t, Config{}, false, "")
	stream := client.Chat.Completions.NewStreaming(testCtx(t), openai.ChatCompletionNewParams{
		Model:         testModel,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("abcdef")},
		MaxTokens:     openai.Int(8),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var finish string
	var chunks, usageChunks int
	var usage openai.CompletionUsage
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		c := stream.Current()
		acc.AddChunk(c)
		chunks++
		if c.Object != "chat.completion.chunk" || !strings.HasPrefix(c.ID, "chatcmpl-") {
			t.Fatalf("chunk head %q %q", c.Object, c.ID)
		}
		if len(c.Choices) == 0 {
			usageChunks++
			usage = c.Usage
			continue
		}
		text.WriteString(c.Choices[0].Delta.Content)
		if c.Choices[0].FinishReason != "" {
			finish = c.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != "echo: ab" || finish != "length" {
		t.Fatalf("text %q finish %q", text.String(), finish)
	}
	if usageChunks != 1 || usage.PromptTokens != 8 || usage.CompletionTokens != 8 || usage.TotalTokens != 16 {
		t.Fatalf("usage chunks %d usage %+v", usageChunks, usage)
	}
	// role chunk + 8 tokens + finish chunk + usage chunk.
	if chunks != 11 {
		t.Fatalf("%d chunks", chunks)
	}
	if acc.Choices[0].Message.Content != "echo: ab" {
		t.Fatalf("accumulated %q", acc.Choices[0].Message.Content)
	}
	f.assertClosed(t)
}

func TestSDKCompletions(t *testing.T) {
	f, client := newSDK(t, Config{}, false, "")
	ctx := testCtx(t)
	resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:  openai.CompletionNewParamsModel(testModel),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")},
	})
	if err != nil {
		t.Fatal(err)
	}
	// No max_tokens: OpenAI's default of 16.
	if got := resp.Choices[0]; got.Text != "echo: once upon" || got.FinishReason != "stop" {
		t.Fatalf("choice %+v", got)
	}
	if !strings.HasPrefix(resp.ID, "cmpl-") || resp.Object != "text_completion" || resp.Usage.PromptTokens != 9 || resp.Usage.CompletionTokens != 15 {
		t.Fatalf("resp %+v", resp)
	}

	stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
		MaxTokens: openai.Int(10),
	})
	var text strings.Builder
	var finish string
	for stream.Next() {
		c := stream.Current()
		if c.Object != "text_completion" || len(c.Choices) != 1 {
			t.Fatalf("chunk %+v", c)
		}
		text.WriteString(c.Choices[0].Text)
		if c.Choices[0].FinishReason != "" {
			finish = string(c.Choices[0].FinishReason)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != "echo: once" || finish != "length" {
		t.Fatalf("streamed %q finish %q", text.String(), finish)
	}
	f.assertClosed(t)
}

func TestSDKStop(t *testing.T) {
	f, client := newSDK(t, Config{}, false, "")
	ctx := testCtx(t)
	for _, stream := range []bool{false, true} {
		params := openai.ChatCompletionNewParams{
			Model:    testModel,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello world")},
			Stop:     openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"xyz", "lo w", "ld"}},
		}
		var text, finish string
		if stream {
			s := client.Chat.Completions.NewStreaming(ctx, params)
			for s.Next() {
				if c := s.Current(); len(c.Choices) > 0 {
					text += c.Choices[0].Delta.Content
					if c.Choices[0].FinishReason != "" {
						finish = c.Choices[0].FinishReason
					}
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			resp, err := client.Chat.Completions.New(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			text, finish = resp.Choices[0].Message.Content, resp.Choices[0].FinishReason
			// Tokens up to the one completing the stop sequence are billed.
			if resp.Usage.CompletionTokens != int64(len("echo: hello w")) {
				t.Fatalf("completion tokens %d", resp.Usage.CompletionTokens)
			}
		}
		if text != "echo: hel" || finish != "stop" {
			t.Fatalf("stream=%v: text %q finish %q", stream, text, finish)
		}
	}
	// Stopping early closes the stream (an abort for the backend).
	f.assertClosed(t)
}

func TestSDKChatLogprobs(t *testing.T) {
	f, client := newSDK(t, Config{}, false, "")
	ctx := testCtx(t)
	params := openai.ChatCompletionNewParams{
		Model:       testModel,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("é")},
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(2),
	}
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	lps := resp.Choices[0].Logprobs.Content
	// "echo: é": 6 ASCII tokens and two byte tokens for é.
	if len(lps) != 8 {
		t.Fatalf("%d logprob entries", len(lps))
	}
	if lps[0].Token != "e" || lps[0].Logprob != -0.125 || len(lps[0].Bytes) != 1 || lps[0].Bytes[0] != 'e' {
		t.Fatalf("entry 0 %+v", lps[0])
	}
	// The byte tokens of é: "token" shows U+FFFD, "bytes" the exact bytes.
	if lps[6].Token != "\ufffd" || len(lps[6].Bytes) != 1 || lps[6].Bytes[0] != 0xc3 || lps[7].Bytes[0] != 0xa9 {
		t.Fatalf("byte tokens %+v %+v", lps[6], lps[7])
	}
	if top := lps[3].TopLogprobs; len(top) != 2 || top[1].Token != "alt1" || top[1].Logprob != -2 {
		t.Fatalf("top logprobs %+v", top)
	}

	s := client.Chat.Completions.NewStreaming(ctx, params)
	var streamed []openai.ChatCompletionTokenLogprob
	for s.Next() {
		if c := s.Current(); len(c.Choices) > 0 {
			streamed = append(streamed, c.Choices[0].Logprobs.Content...)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if len(streamed) != 8 || streamed[7].Logprob != -1 || len(streamed[7].TopLogprobs) != 2 {
		t.Fatalf("streamed logprobs %+v", streamed)
	}
	f.assertClosed(t)
}

func TestSDKCompletionLogprobs(t *testing.T) {
	_, client := newSDK(t, Config{}, false, "")
	resp, err := client.Completions.New(testCtx(t), openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")},
		Logprobs:  openai.Int(1),
		MaxTokens: openai.Int(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	lp := resp.Choices[0].Logprobs
	if strings.Join(lp.Tokens, "|") != "e|c|h" || len(lp.TokenLogprobs) != 3 || lp.TokenLogprobs[2] != -0.375 {
		t.Fatalf("logprobs %+v", lp)
	}
	if len(lp.TopLogprobs) != 3 || lp.TopLogprobs[0]["alt0"] != -1 || len(lp.TextOffset) != 3 || lp.TextOffset[2] != 2 {
		t.Fatalf("top/offsets %+v %+v", lp.TopLogprobs, lp.TextOffset)
	}
}

func TestSDKErrors(t *testing.T) {
	long := strings.Repeat("a", 190)
	tests := []struct {
		name    string
		key     string
		model   string
		content string
		max     int64
		stream  bool
		status  int
		code    string
		param   string
		message string
	}{
		{"context length", keyA, testModel, long, 50, false, 400, "context_length_exceeded", "",
			"this model's maximum context length is 200 tokens; the request has 192 prompt tokens and asks for 50 more (242 in total). Please reduce the length of the prompt or of max_tokens."},
		{"context length streaming", keyA, testModel, long, 50, true, 400, "context_length_exceeded", "",
			"this model's maximum context length is 200 tokens; the request has 192 prompt tokens and asks for 50 more (242 in total). Please reduce the length of the prompt or of max_tokens."},
		{"unknown model", keyA, "nope", "hi", 5, false, 404, "model_not_found", "model", "The model 'nope' does not exist."},
		{"no key", "", testModel, "hi", 5, false, 401, "invalid_api_key", "", ""},
		{"bad key", "sk-wrong-key-000000000", testModel, "hi", 5, false, 401, "invalid_api_key", "", "Incorrect API key provided."},
		{"integrity before first token, streaming", keyA, testModel, "#fail-first", 5, true, 500, "kv_integrity_error", "", "fence mismatch on page 3"},
		{"integrity", keyB, testModel, "#fail-mid", 5, false, 500, "kv_integrity_error", "", "fence mismatch on page 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, client := newSDK(t, Config{}, true, tt.key)
			opts := []option.RequestOption{}
			if tt.key == "" {
				opts = append(opts, option.WithHeaderDel("Authorization"))
			}
			params := openai.ChatCompletionNewParams{
				Model:     tt.model,
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(tt.content)},
				MaxTokens: openai.Int(tt.max),
			}
			var err error
			if tt.stream {
				s := client.Chat.Completions.NewStreaming(testCtx(t), params, opts...)
				for s.Next() {
					t.Fatalf("got a chunk: %+v", s.Current())
				}
				err = s.Err()
			} else {
				_, err = client.Chat.Completions.New(testCtx(t), params, opts...)
			}
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v (%T), want *openai.Error", err, err)
			}
			if apiErr.StatusCode != tt.status || apiErr.Code != tt.code || apiErr.Param != tt.param ||
				(tt.message != "" && apiErr.Message != tt.message) {
				t.Fatalf("got %d code %q param %q message %q", apiErr.StatusCode, apiErr.Code, apiErr.Param, apiErr.Message)
			}
			if apiErr.Response.Header.Get("X-Request-Id") == "" {
				t.Fatal("no X-Request-Id")
			}
			f.assertClosed(t)
		})
	}
}

func TestSDKErrorAfterStreamStarted(t *testing.T) {
	f, client := newSDK(t, Config{}, false, "")
	s := client.Chat.Completions.NewStreaming(testCtx(t), openai.ChatCompletionNewParams{
		Model:    testModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("#fail-mid")},
	})
	var text string
	for s.Next() {
		if c := s.Current(); len(c.Choices) > 0 {
			text += c.Choices[0].Delta.Content
		}
	}
	err := s.Err()
	if text != "ech" || err == nil || !strings.Contains(err.Error(), "kv_integrity_error") {
		t.Fatalf("text %q err %v", text, err)
	}
	f.assertClosed(t)
}

func TestSDKModels(t *testing.T) {
	_, client := newSDK(t, Config{}, true, keyB)
	ctx := testCtx(t)
	page, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != testModel || page.Data[0].OwnedBy != "kvfence" || page.Data[0].Created != 1700000000 {
		t.Fatalf("models %+v", page.Data)
	}
	m, err := client.Models.Get(ctx, testModel)
	if err != nil || m.ID != testModel {
		t.Fatalf("get %+v %v", m, err)
	}
	_, err = client.Models.Get(ctx, "missing")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("missing model: %v", err)
	}
}
