package docs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestQuotedConfigErrorsAreSluices: the configuration errors the docs
// quote are what Sluice answers for the configs that cause them (the
// Caddyfile is adapted and provisioned as caddy validate does).
func TestQuotedConfigErrorsAreSluices(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", filepath.Join(t.TempDir(), "data"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(t.TempDir(), "config"))
	t.Setenv("SLUICE_DOCS_UNSET_TOKEN", "")
	const head = "{\n\tadmin off\n\tpersist_config off\n}\n"
	for _, c := range []struct {
		doc, quote, caddyfile string
	}{
		{"api.md", `queued_least_latency: latency_measure: must be auto, last_byte or first_byte, got "bogus"`,
			":8080 {\n\treverse_proxy 127.0.0.1:9 {\n\t\tlb_policy queued_least_latency {\n\t\t\tlatency_measure bogus\n\t\t}\n\t}\n}\n"},
		{"api.md", `queued_least_latency: pool "llm" is configured twice in this config with different queued_least_latency settings; give one of them another pool`,
			":8080 {\n\treverse_proxy 127.0.0.1:9 {\n\t\tlb_policy queued_least_latency {\n\t\t\tpool llm\n\t\t}\n\t}\n}\n" +
				":8081 {\n\treverse_proxy 127.0.0.1:9 {\n\t\tlb_policy queued_least_latency {\n\t\t\tpool llm\n\t\t\tqueue_max_size 5\n\t\t}\n\t}\n}\n"},
		{"../README.md", "custom_router: token: resolves to an empty value",
			":8080 {\n\tcustom_router llm {\n\t\ttoken {env.SLUICE_DOCS_UNSET_TOKEN}\n\t}\n}\n"},
	} {
		doc, err := os.ReadFile(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(unwrap(string(doc)), c.quote) {
			t.Errorf("%s no longer quotes %q: update this test with the docs", c.doc, c.quote)
			continue
		}
		cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(head+c.caddyfile), nil)
		if err != nil {
			t.Errorf("%s: %v", c.quote, err)
			continue
		}
		var cfg caddy.Config
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			t.Fatal(err)
		}
		err = caddy.Validate(&cfg)
		if err == nil || !strings.Contains(err.Error(), c.quote) {
			t.Errorf("%s quotes %q, but Sluice answers: %v", c.doc, c.quote, err)
		}
	}
}

// unwrap joins a markdown file's lines as its text reads (a quote may be
// wrapped across lines).
func unwrap(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
