package tokenizer

import (
	"errors"
	"strings"
	"testing"
)

// Llama 3: the renderings of the real template by the Jinja engine bundled
// with the reference JS tokenizer (testdata/llama3.json.gz).
func TestChatTemplateLlama3Reference(t *testing.T) {
	tok := refTokenizer(t, "llama3")
	if got := tok.ChatTemplateName(); got != "llama3" {
		t.Fatalf("template recognised as %q", got)
	}
	ref := loadRef(t, "llama3")
	if len(ref.Chat) < 10 {
		t.Fatalf("only %d chat renderings", len(ref.Chat))
	}
	for _, c := range ref.Chat {
		got, err := tok.ApplyChatTemplate(c.Messages, c.AddGen)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.Text {
			t.Errorf("%s gen=%v:\n got %q\nwant %q", c.Name, c.AddGen, got, c.Text)
		}
	}
}

// Qwen3: the reference JS Jinja engine cannot run this template, so these
// expectations are derived by hand from the template text in
// data/qwen3/tokenizer_config.json.gz (reproduced in the comments).
func TestChatTemplateQwen3(t *testing.T) {
	tok := refTokenizer(t, "qwen3")
	if got := tok.ChatTemplateName(); got != "qwen3" {
		t.Fatalf("template recognised as %q", got)
	}
	u := func(s string) Message { return Message{"user", s} }
	a := func(s string) Message { return Message{"assistant", s} }
	s := func(s string) Message { return Message{"system", s} }
	tool := func(s string) Message { return Message{"tool", s} }
	cases := []struct {
		name string
		msgs []Message
		gen  bool
		want string
	}{
		// No system message: no system block (Qwen3 has no default system prompt).
		{"user", []Message{u("Hello!")}, true,
			"<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
		{"user-nogen", []Message{u("Hello!")}, false,
			"<|im_start|>user\nHello!<|im_end|>\n"},
		// messages[0].role == 'system' -> '<|im_start|>system\n' + content + '<|im_end|>\n'
		{"system", []Message{s("You are terse."), u("Hi")}, true,
			"<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		// Assistant turns before the last user query: plain content, reasoning dropped.
		{"history-drops-think", []Message{u("Q1"), a("<think>\nr1\n</think>\n\nA1"), u("Q2")}, true,
			"<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"},
		// The last assistant turn after the last query always gets a think block.
		{"final-assistant-empty-think", []Message{u("Say hi"), a("hi")}, false,
			"<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhi<|im_end|>\n"},
		{"final-assistant-think", []Message{u("Q"), a("<think>\n\nsteps\n\n</think>\n\n\nA")}, false,
			"<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nsteps\n</think>\n\nA<|im_end|>\n"},
		// An assistant turn after the query that is not last keeps reasoning only if it has some.
		{"tool-loop", []Message{u("weather?"), a("calling"), tool("sunny"), tool("22C"), a("<think>x</think>done")}, true,
			"<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\ncalling<|im_end|>\n" +
				"<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response><|im_end|>\n" +
				"<|im_start|>assistant\n<think>\nx\n</think>\n\ndone<|im_end|>\n<|im_start|>assistant\n"},
		// A user message that is a wrapped tool response is not a query.
		{"tool-response-user", []Message{u("q"), a("<think>t</think>a1"), u("<tool_response>r</tool_response>"), a("a2")}, false,
			"<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nt\n</think>\n\na1<|im_end|>\n" +
				"<|im_start|>user\n<tool_response>r</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na2<|im_end|>\n"},
		// A system message after the first is rendered in place.
		{"late-system", []Message{u("a"), s("b"), u("c")}, false,
			"<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"},
		{"empty", []Message{u("")}, true, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"},
	}
	for _, c := range cases {
		got, err := tok.ApplyChatTemplate(c.msgs, c.gen)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
	// enable_thinking=false appends an empty think block to the prompt.
	got, err := tok.ApplyChatTemplateOptions([]Message{u("Hi")}, ChatOptions{AddGenerationPrompt: true, DisableThinking: true})
	if want := "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"; got != want || err != nil {
		t.Errorf("thinking disabled: got %q, %v want %q", got, err, want)
	}
	// The rendered prompt tokenizes with the control tokens as single ids.
	p, _ := tok.ApplyChatTemplate([]Message{u("Hi")}, true)
	ids := tok.Encode(p, EncodeOptions{ParseSpecial: true})
	if ids[0] != 151644 || ids[len(ids)-1] != 198 || !tok.IsEOG(151645) || !tok.IsControl(151644) || tok.IsControl(198) {
		t.Errorf("chat prompt ids %v", ids)
	}
}

func TestChatTemplateOtherFamilies(t *testing.T) {
	mk := func(tpl string) *Tokenizer {
		c := tinyBPEConfig()
		c.ChatTemplate = tpl
		tok, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	qwen2 := "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
	qwen25 := "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}" + qwen2
	chatml := "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
	msgs := []Message{{"user", "x"}}
	for _, c := range []struct{ tpl, name, want string }{
		{qwen2, "qwen2", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"},
		{qwen25, "qwen2.5", "<|im_start|>system\n" + qwen25System + "<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"},
		{chatml, "chatml", "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"},
	} {
		tok := mk(c.tpl)
		if tok.ChatTemplateName() != c.name {
			t.Errorf("%s recognised as %q", c.name, tok.ChatTemplateName())
		}
		got, err := tok.ApplyChatTemplate(msgs, true)
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v want %q", c.name, got, err, c.want)
		}
		// With a system message, no default system block.
		got, _ = tok.ApplyChatTemplate([]Message{{"system", "S"}, {"user", "x"}}, false)
		if want := "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"; got != want {
			t.Errorf("%s with system: got %q want %q", c.name, got, want)
		}
	}
	for _, tpl := range []string{"", "{{ messages }}", "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"} {
		_, err := mk(tpl).ApplyChatTemplate(msgs, true)
		if !errors.Is(err, ErrNoChatTemplate) {
			t.Errorf("template %q: err %v, want ErrNoChatTemplate", tpl, err)
		}
		if err != nil && strings.Contains(err.Error(), "messages") && tpl != "" {
			t.Errorf("error leaks template text: %v", err)
		}
	}
}

func TestChatTemplateLlama31(t *testing.T) {
	c := tinyBPEConfig()
	c.Tokens = append(c.Tokens, "<|begin_of_text|>")
	c.Types = append(c.Types, TypeControl)
	c.BOS = int32(len(c.Tokens) - 1)
	c.ChatTemplate = `{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}{{- "Cutting Knowledge Date: December 2023\n" }}{{- "Today Date: " + date_string + "\n\n" }}{{- system_message }}{{- "<|eot_id|>" }}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}`
	tok, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tok.ApplyChatTemplate([]Message{{"system", " Be brief. "}, {"user", "Hi\n"}}, true)
	want := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	if err != nil || got != want {
		t.Errorf("got %q, %v\nwant %q", got, err, want)
	}
}

// tinyBPEConfig is a minimal byte-level vocabulary (the 256 byte tokens and
// ChatML control tokens), cheap to build.
func tinyBPEConfig() Config {
	c := Config{Model: ModelGPT2, Pre: PreQwen2, BOS: -1, EOS: -1, EOT: -1, PAD: -1, UNK: -1}
	for b := range 256 {
		c.Tokens = append(c.Tokens, string(byteToRune[b]))
		c.Types = append(c.Types, TypeNormal)
	}
	for _, s := range []string{"<|im_start|>", "<|im_end|>"} {
		c.Tokens = append(c.Tokens, s)
		c.Types = append(c.Types, TypeControl)
	}
	return c
}
