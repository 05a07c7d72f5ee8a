package bench

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// overheadRequest is what the overhead scenarios send: by default a tiny
// completion, the proxy's fixed cost per request; the chat kinds are the
// sizes users send, where a policy that reads the prompt (cache_aware,
// load_aware) pays in proportion to it and a fixed cost weighs less.
type overheadRequest struct {
	path   string
	rate   float64 // req/s over the run, across the proxies it feeds
	tokens int     // output tokens (streamed when > 1)
	system string  // the system prompt: "" for the tiny completion
	about  string
}

var overheadRequests = map[string]overheadRequest{
	"tiny": {path: "/v1/completions", rate: 2000, tokens: 1,
		about: `tiny completions ({"prompt":"x","max_tokens":1})`},
	"chat1k": {path: "/v1/chat/completions", rate: 800, tokens: 16, system: systemPromptOf(1024),
		about: "streamed chats: a 1 KB system prompt shared by all, a user turn of its own, 16 tokens out"},
	"chat4k": {path: "/v1/chat/completions", rate: 320, tokens: 64, system: systemPromptOf(4096),
		about: "streamed chats: a 4 KB system prompt shared by all, a user turn of its own, 64 tokens out"},
}

// overheadRequestKinds lists the kinds -overhead-request takes.
func overheadRequestKinds() []string { return slices.Sorted(maps.Keys(overheadRequests)) }

// overheadRequestOf is the named kind ("" is tiny).
func overheadRequestOf(name string) (overheadRequest, error) {
	if name == "" {
		name = "tiny"
	}
	req, ok := overheadRequests[name]
	if !ok {
		return req, fmt.Errorf("unknown overhead request %q (have: %s)", name, strings.Join(overheadRequestKinds(), ", "))
	}
	return req, nil
}

// systemPromptOf is English-like text of n bytes.
func systemPromptOf(n int) string {
	const s = "You are a careful assistant for a support desk. Answer from the manual, cite the section, and say when you do not know. "
	return strings.Repeat(s, n/len(s)+1)[:n]
}

// build is request n of the run, to the proxy at base.
func (o overheadRequest) build(base string, n int) *http.Request {
	var body string
	if o.system == "" {
		body = `{"prompt":"x","max_tokens":1}`
	} else {
		b, _ := json.Marshal(map[string]any{
			"model": "sim-model", "stream": true, "max_tokens": o.tokens,
			"messages": []map[string]string{
				{"role": "system", "content": o.system},
				{"role": "user", "content": fmt.Sprintf("Ticket %d: my order has not arrived; what should I do next?", n)},
			},
		})
		body = string(b)
	}
	req, _ := http.NewRequest(http.MethodPost, base+o.path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return req
}
