package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
)

// Message is one chat turn. Role is "system", "user", "assistant" or
// "tool" (Qwen); other roles are rendered as the template renders them.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatKind is a chat template this package renders natively. Templates are
// Jinja programs; rather than interpret Jinja, the known templates are
// recognised by distinctive substrings and reimplemented exactly (for the
// no-tools case).
type chatKind uint8

const (
	chatNone    chatKind = iota
	chatQwen3            // ChatML with <think> handling (Qwen3)
	chatQwen25           // ChatML, default system "You are Qwen, created by Alibaba Cloud..."
	chatQwen2            // ChatML, default system "You are a helpful assistant."
	chatChatML           // plain ChatML
	chatLlama3           // Llama 3 header format
	chatLlama31          // Llama 3.1 header format with the dated system block
)

const (
	qwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
	qwen2System  = "You are a helpful assistant."
)

func recogniseChat(tpl string) chatKind {
	has := func(s ...string) bool {
		for _, x := range s {
			if !strings.Contains(tpl, x) {
				return false
			}
		}
		return true
	}
	switch {
	case tpl == "":
		return chatNone
	case has("<|im_start|>", "</think>", "last_query_index"):
		return chatQwen3
	case has("<|im_start|>", qwen25System):
		return chatQwen25
	case has("<|im_start|>", qwen2System):
		return chatQwen2
	case has("<|im_start|>", "<|im_end|>"):
		return chatChatML
	case has("<|start_header_id|>", "<|eot_id|>", "Cutting Knowledge Date", "26 Jul 2024"):
		return chatLlama31
	case has("<|start_header_id|>", "<|eot_id|>") && !has("Cutting Knowledge Date"):
		return chatLlama3
	}
	return chatNone
}

// ChatTemplateName names the recognised chat template ("" if none).
func (t *Tokenizer) ChatTemplateName() string {
	return [...]string{"", "qwen3", "qwen2.5", "qwen2", "chatml", "llama3", "llama3.1"}[recogniseChat(t.cfg.ChatTemplate)]
}

// ApplyChatTemplate renders msgs with the tokenizer's chat template, as the
// model's own Jinja template would (without tools). The result contains the
// template's special tokens as text — including BOS where the template
// writes it — so encode it with ParseSpecial and without AddSpecial.
// It returns an error wrapping ErrNoChatTemplate when the template is
// absent or not one this package knows.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.ApplyChatTemplateOptions(msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// ChatOptions are the template variables ApplyChatTemplateOptions honours.
type ChatOptions struct {
	AddGenerationPrompt bool
	// DisableThinking is Qwen3's enable_thinking=false: the generation
	// prompt gets an empty <think></think> block so the model answers
	// directly. Other templates ignore it.
	DisableThinking bool
}

// ApplyChatTemplateOptions is ApplyChatTemplate with template options.
func (t *Tokenizer) ApplyChatTemplateOptions(msgs []Message, opt ChatOptions) (string, error) {
	addGenerationPrompt := opt.AddGenerationPrompt
	kind := recogniseChat(t.cfg.ChatTemplate)
	if kind == chatNone {
		if t.cfg.ChatTemplate == "" {
			return "", fmt.Errorf("%w: the model has no tokenizer.chat_template", ErrNoChatTemplate)
		}
		return "", fmt.Errorf("%w: tokenizer.chat_template (%d bytes) is not one of the supported templates (qwen3, qwen2.5, qwen2, chatml, llama3, llama3.1)", ErrNoChatTemplate, len(t.cfg.ChatTemplate))
	}
	var b strings.Builder
	switch kind {
	case chatQwen3:
		if len(msgs) == 0 {
			return "", fmt.Errorf("tokenizer: the qwen3 chat template needs at least one message")
		}
		renderQwen3(&b, msgs, addGenerationPrompt)
		if addGenerationPrompt && opt.DisableThinking {
			b.WriteString("<think>\n\n</think>\n\n")
		}
	case chatQwen25, chatQwen2, chatChatML:
		renderChatML(&b, kind, msgs, addGenerationPrompt)
	case chatLlama3:
		bos := ""
		if t.cfg.BOS >= 0 {
			bos = t.cfg.Tokens[t.cfg.BOS]
		}
		for i, m := range msgs {
			if i == 0 {
				b.WriteString(bos)
			}
			b.WriteString("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + jinjaTrim(m.Content) + "<|eot_id|>")
		}
		// The original Llama 3 template always adds the prompt; later
		// revisions made it conditional.
		if addGenerationPrompt || !strings.Contains(t.cfg.ChatTemplate, "add_generation_prompt") {
			b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
		}
	case chatLlama31:
		if t.cfg.BOS >= 0 {
			b.WriteString(t.cfg.Tokens[t.cfg.BOS])
		}
		system := ""
		if len(msgs) > 0 && msgs[0].Role == "system" {
			system = jinjaTrim(msgs[0].Content)
			msgs = msgs[1:]
		}
		b.WriteString("<|start_header_id|>system<|end_header_id|>\n\n")
		b.WriteString("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n")
		b.WriteString(system + "<|eot_id|>")
		for _, m := range msgs {
			role := m.Role
			if role == "tool" {
				role = "ipython"
			}
			b.WriteString("<|start_header_id|>" + role + "<|end_header_id|>\n\n" + jinjaTrim(m.Content) + "<|eot_id|>")
		}
		if addGenerationPrompt {
			b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
		}
	}
	return b.String(), nil
}

func renderChatML(b *strings.Builder, kind chatKind, msgs []Message, gen bool) {
	if len(msgs) == 0 || msgs[0].Role != "system" {
		switch kind {
		case chatQwen25:
			b.WriteString("<|im_start|>system\n" + qwen25System + "<|im_end|>\n")
		case chatQwen2:
			b.WriteString("<|im_start|>system\n" + qwen2System + "<|im_end|>\n")
		}
	}
	for i, m := range msgs {
		if m.Role == "tool" && kind == chatQwen25 {
			renderQwenTool(b, msgs, i)
			continue
		}
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
	}
	if gen {
		b.WriteString("<|im_start|>assistant\n")
	}
}

// renderQwenTool writes a tool result the Qwen way: consecutive tool
// messages share one user turn.
func renderQwenTool(b *strings.Builder, msgs []Message, i int) {
	if i == 0 || msgs[i-1].Role != "tool" {
		b.WriteString("<|im_start|>user")
	}
	b.WriteString("\n<tool_response>\n" + msgs[i].Content + "\n</tool_response>")
	if i == len(msgs)-1 || msgs[i+1].Role != "tool" {
		b.WriteString("<|im_end|>\n")
	}
}

// renderQwen3 follows Qwen3's template: the system message only if given;
// assistant turns after the last real user query keep their reasoning in a
// <think> block (the final one always gets one, possibly empty), earlier
// ones lose it; tool results are grouped into user turns.
func renderQwen3(b *strings.Builder, msgs []Message, gen bool) {
	if msgs[0].Role == "system" {
		b.WriteString("<|im_start|>system\n" + msgs[0].Content + "<|im_end|>\n")
	}
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == "user" && !(strings.HasPrefix(m.Content, "<tool_response>") && strings.HasSuffix(m.Content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range msgs {
		switch {
		case m.Role == "user" || m.Role == "system" && i != 0:
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		case m.Role == "assistant":
			content, reasoning := m.Content, ""
			if strings.Contains(m.Content, "</think>") {
				parts := strings.Split(m.Content, "</think>")
				content = strings.TrimLeft(parts[len(parts)-1], "\n")
				r := strings.Split(strings.TrimRight(parts[0], "\n"), "<think>")
				reasoning = strings.TrimLeft(r[len(r)-1], "\n")
			}
			if i > lastQuery && (i == len(msgs)-1 || reasoning != "") {
				b.WriteString("<|im_start|>assistant\n<think>\n" + strings.Trim(reasoning, "\n") + "\n</think>\n\n" + strings.TrimLeft(content, "\n"))
			} else {
				b.WriteString("<|im_start|>assistant\n" + content)
			}
			b.WriteString("<|im_end|>\n")
		case m.Role == "tool":
			renderQwenTool(b, msgs, i)
		}
	}
	if gen {
		b.WriteString("<|im_start|>assistant\n")
	}
}

// jinjaTrim is Jinja's trim filter: Python's str.strip().
func jinjaTrim(s string) string {
	return strings.TrimFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r >= 0x1C && r <= 0x1F })
}
