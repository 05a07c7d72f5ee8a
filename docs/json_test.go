package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// jsonExamples are the module IDs each module page's Caddy JSON examples
// must configure between them.
var jsonExamples = map[string][]string{
	"queued_least_latency.md": {"http.reverse_proxy.selection_policies.queued_least_latency", "http.reverse_proxy.upstreams.custom_router"},
	"cache_aware.md":          {"http.reverse_proxy.selection_policies.cache_aware"},
	"load_aware.md":           {"http.reverse_proxy.selection_policies.load_aware"},
	"global_redis_least.md":   {"http.reverse_proxy.selection_policies.global_redis_least"},
	"flow_control.md":         {"http.handlers.flow_control"},
	"custom_router.md":        {"http.handlers.custom_router", "http.reverse_proxy.upstreams.custom_router"},
	"inference_sim.md":        {"http.handlers.inference_sim"},
}

// TestEveryModulePageHasAJSONExample decodes every ```json example of the
// module pages (docs/policies) into its modules as Caddy would (unknown
// fields refused) and runs their validation; the examples that need no
// Redis are also loaded as a whole Caddy config and provisioned
// (caddy.Validate: provisioned, then cleaned up; nothing listens).
func TestEveryModulePageHasAJSONExample(t *testing.T) {
	// The examples read these placeholders (an unset token refuses the load).
	t.Setenv("CUSTOM_ROUTER_TOKEN", "docs-test-token")
	t.Setenv("SLUICE_SESSION_KEY", "docs-test-session-key")
	t.Setenv("REDIS_PASSWORD", "docs-test-password")
	t.Setenv("XDG_DATA_HOME", filepath.Join(t.TempDir(), "data"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(t.TempDir(), "config"))
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "policies", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, page := range pages {
		name := filepath.Base(page)
		seen[name] = true
		want, ok := jsonExamples[name]
		if !ok {
			t.Errorf("docs/policies/%s: a module page this test does not know; add its module IDs to jsonExamples", name)
			continue
		}
		t.Run(strings.TrimSuffix(name, ".md"), func(t *testing.T) {
			blocks, err := fencedBlocks(page, "json")
			if err != nil {
				t.Fatal(err)
			}
			if len(blocks) == 0 {
				t.Fatalf("docs/policies/%s: no ```json example", name)
			}
			configured := map[string]bool{}
			for _, b := range blocks {
				where := fmt.Sprintf("docs/policies/%s:%d", name, b.line)
				var v any
				dec := json.NewDecoder(strings.NewReader(b.text))
				dec.UseNumber()
				if err := dec.Decode(&v); err != nil {
					t.Errorf("%s: not JSON: %v", where, err)
					continue
				}
				handlers, ok := asHandlers(v)
				if !ok {
					continue // another kind of JSON (an API answer, a recipe)
				}
				for _, id := range moduleIDs(v) {
					configured[id] = true
				}
				if err := validateSluiceModules([]byte(b.text)); err != nil {
					t.Errorf("%s: the JSON example is refused: %v", where, err)
					continue
				}
				if strings.Contains(b.text, `"redis"`) {
					continue // provisioning would dial Redis
				}
				if err := provisionHandlers(handlers); err != nil {
					t.Errorf("%s: the JSON example does not provision in Caddy: %v", where, err)
				}
			}
			for _, id := range want {
				if !configured[id] {
					t.Errorf("docs/policies/%s: no JSON example configures %s (found %v)", name, id, sortedKeys(configured))
				}
			}
		})
	}
	for name := range jsonExamples {
		if !seen[name] {
			t.Errorf("docs/policies/%s is missing", name)
		}
	}
}

// asHandlers returns a JSON example as a list of HTTP handlers: an object
// with "handler", or a list of them.
func asHandlers(v any) ([]any, bool) {
	switch x := v.(type) {
	case map[string]any:
		if _, ok := x["handler"]; ok {
			return []any{x}, true
		}
	case []any:
		for _, e := range x {
			m, ok := e.(map[string]any)
			if !ok || m["handler"] == nil {
				return nil, false
			}
		}
		return x, len(x) > 0
	}
	return nil, false
}

// moduleIDs lists the module IDs a JSON example names (handlers,
// selection policies, upstream sources).
func moduleIDs(v any) []string {
	var ids []string
	walkJSON(v, func(m map[string]any) {
		for key, ns := range map[string]string{
			"handler": "http.handlers.",
			"policy":  "http.reverse_proxy.selection_policies.",
			"source":  "http.reverse_proxy.upstreams.",
		} {
			if name, ok := m[key].(string); ok {
				ids = append(ids, ns+name)
			}
		}
	})
	return ids
}

// provisionHandlers loads handlers as the one route of a Caddy config and
// provisions it without starting it.
func provisionHandlers(handlers []any) error {
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"docs": map[string]any{
			"listen": []any{"127.0.0.1:0"},
			"routes": []any{map[string]any{"handle": handlers}},
		}}}},
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	var c caddy.Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return err
	}
	return caddy.Validate(&c)
}

// block is one fenced code block of a markdown file.
type block struct {
	line int // line of the block's first line of text
	text string
}

// fencedBlocks returns the ```<lang> blocks of a markdown file.
func fencedBlocks(path, lang string) ([]block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out   []block
		cur   *block
		lines []string
		n     int
		inAny bool
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		trimmed := strings.TrimSpace(sc.Text())
		switch {
		case !inAny && strings.HasPrefix(trimmed, "```"):
			inAny = true
			if strings.EqualFold(strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), lang) {
				cur = &block{line: n + 1}
				lines = nil
			}
		case inAny && trimmed == "```":
			inAny = false
			if cur != nil {
				cur.text = strings.Join(lines, "\n") + "\n"
				out = append(out, *cur)
				cur = nil
			}
		case cur != nil:
			lines = append(lines, sc.Text())
		}
	}
	return out, sc.Err()
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
