package reqerr

import (
	"fmt"
	"strings"
	"testing"
)

func TestKindOf(t *testing.T) {
	tests := []struct {
		err  error
		want Kind
	}{
		{&ContextLengthError{Prompt: 10, MaxTokens: 5, Limit: 12}, KindContextLength},
		{fmt.Errorf("wrapped: %w", &ContextLengthError{}), KindContextLength},
		{New(KindIntegrity, "fence mismatch on page %d", 3), KindIntegrity},
		{fmt.Errorf("room x: %w", New(KindPeerLost, "")), KindPeerLost},
		{fmt.Errorf("plain"), KindUnknown},
		{nil, KindUnknown},
	}
	for _, tt := range tests {
		if got := KindOf(tt.err); got != tt.want {
			t.Errorf("KindOf(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestContextLengthErrorNamesBothNumbers(t *testing.T) {
	msg := (&ContextLengthError{Prompt: 5000, MaxTokens: 100, Limit: 4096}).Error()
	for _, want := range []string{"4096", "5000", "100", "5100"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %s", msg, want)
		}
	}
}

func TestKindNamesStable(t *testing.T) {
	// Names are OpenAI error codes and metric labels: changing one breaks clients.
	if KindContextLength.String() != "context_length_exceeded" || KindIntegrity.String() != "kv_integrity_error" {
		t.Fatal("stable kind names changed")
	}
	if Kind(200).Valid() || !KindInternal.Valid() {
		t.Fatal("Valid is wrong")
	}
}
