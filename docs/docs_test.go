// Package docs holds Sluice's reference documentation. Its test adapts
// every Caddyfile snippet in README.md and docs/, so the docs cannot
// drift from the Caddyfile syntax Sluice accepts.
package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sluice-router/sluice"
)

type snippet struct {
	file string
	line int
	text string
}

// snippets returns every ```caddyfile block of the Markdown file at path.
func snippets(t *testing.T, path string) []snippet {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []snippet
	var cur *snippet
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```caddyfile":
			cur = &snippet{file: path, line: n}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: unterminated ```caddyfile block", path, cur.line)
	}
	return out
}

// complete turns a snippet into a Caddyfile: a whole Caddyfile (it has a
// site block or global options) stays as it is; an lb_policy block goes
// into a reverse_proxy; any other directive into a site.
func complete(text string) string {
	first := strings.Fields(text)[0]
	switch {
	case first == "{" || strings.HasPrefix(first, ":") || strings.HasPrefix(first, "http"):
		return text
	case first == "lb_policy":
		return ":8080 {\n\treverse_proxy 127.0.0.1:1 {\n" + text + "\t}\n}\n"
	default:
		return ":8080 {\n" + text + "}\n"
	}
}

func TestEveryCaddyfileSnippetAdapts(t *testing.T) {
	files := []string{"../README.md"}
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	total := 0
	for _, f := range files {
		found := snippets(t, f)
		if strings.HasPrefix(f, "policies/") && len(found) == 0 {
			t.Errorf("%s: a module's reference without a Caddyfile example", f)
		}
		for _, s := range found {
			total++
			if _, _, err := adapter.Adapt([]byte(complete(s.text)), nil); err != nil {
				t.Errorf("%s:%d: this Caddyfile snippet does not adapt: %v", s.file, s.line, err)
			}
		}
	}
	// A walk that finds few means the test lost its files, not that the
	// docs are right.
	if total < 7 {
		t.Fatalf("found only %d Caddyfile snippets in %v", total, files)
	}
	t.Logf("adapted %d Caddyfile snippets from %d files", total, len(files))
}
