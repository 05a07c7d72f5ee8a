package bench

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb/reqtext"
)

// The chat kinds are what their names say to a policy that parses them:
// a streamed chat with the stated system prompt size and output tokens,
// each request its own user turn (cache_aware inserts, not only matches).
func TestOverheadChatRequestsAreTheSizesTheyName(t *testing.T) {
	for name, size := range map[string]int{"chat1k": 1024, "chat4k": 4096} {
		kind, err := overheadRequestOf(name)
		if err != nil {
			t.Fatal(err)
		}
		var texts []string
		for n := range 2 {
			req := kind.build("http://127.0.0.1:9", n)
			body, _ := io.ReadAll(req.Body)
			got, err := reqtext.Extract(req.URL.Path, body)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !got.Stream || got.MaxTokens != kind.tokens || got.Kind != reqtext.KindChat {
				t.Fatalf("%s: stream %v, max_tokens %d, kind %q; want a streamed chat of %d tokens", name, got.Stream, got.MaxTokens, got.Kind, kind.tokens)
			}
			if !strings.Contains(got.Text, kind.system) || len(kind.system) != size {
				t.Fatalf("%s: system prompt of %d bytes, want %d, in the text", name, len(kind.system), size)
			}
			texts = append(texts, got.Text)
		}
		if texts[0] == texts[1] {
			t.Fatalf("%s: two requests with the same prompt", name)
		}
	}
}

// An unknown kind is refused before anything starts or is written.
func TestUnknownOverheadRequestIsRefusedUpFront(t *testing.T) {
	dir := t.TempDir()
	_, err := Run(context.Background(), Options{Scenario: "overhead", OverheadRequest: "huge", OutDir: dir, CaddyBin: "/nonexistent", Log: io.Discard})
	if err == nil || !strings.Contains(err.Error(), `"huge"`) || !strings.Contains(err.Error(), "chat4k") {
		t.Fatalf("err %v, want one naming the kind and the kinds there are", err)
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Fatalf("wrote %d files", len(files))
	}
}
