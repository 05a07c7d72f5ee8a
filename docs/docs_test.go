// Package docs holds Sluice's reference documentation. Its test adapts
// every Caddyfile snippet in README.md and docs/**/*.md with the Caddyfile
// adapter of a Caddy that has the standard modules and Sluice, and runs
// the Validate of every Sluice module the snippet configures, so the docs
// cannot drift from the configuration Sluice accepts.
package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sluice-router/sluice"
)

// minSnippets is the fewest ```caddyfile blocks the walk must find: fewer
// means the extraction broke (or the snippets were dropped), and the test
// would otherwise pass by testing nothing.
const minSnippets = 18

// snippet is one ```caddyfile block: where it starts and its text.
type snippet struct {
	file string // relative to the repository root
	line int    // line of the first line of text inside the fence
	text string
}

func TestEveryCaddyfileSnippetAdapts(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(root, "README.md")}
	err = filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)

	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("no caddyfile adapter registered")
	}
	var all []snippet
	for _, f := range files {
		snips, err := extract(f, root)
		if err != nil {
			t.Fatal(err)
		}
		if rel, _ := filepath.Rel(root, f); strings.HasPrefix(rel, filepath.Join("docs", "policies")) && len(snips) == 0 {
			t.Errorf("%s: a module's reference without a Caddyfile example", rel)
		}
		all = append(all, snips...)
	}
	for _, s := range all {
		body, offset := wrap(s.text)
		cfg, warnings, err := adapter.Adapt([]byte(body), map[string]any{"filename": s.file})
		if err != nil {
			t.Errorf("%s:%d: caddyfile snippet does not adapt: %s\n--- adapted as ---\n%s",
				s.file, s.line, docLines(err.Error(), s, offset), body)
			continue
		}
		for _, w := range warnings {
			if !strings.Contains(w.Message, "not formatted") { // fragments are re-indented by wrap
				t.Logf("%s:%d: adapter warning: %s", s.file, s.line, docLines(w.String(), s, offset))
			}
		}
		if err := validateSluiceModules(cfg); err != nil {
			t.Errorf("%s:%d: caddyfile snippet adapts but a Sluice module refuses it: %v", s.file, s.line, err)
		}
	}
	t.Logf("%d caddyfile snippets checked from %d files", len(all), len(files))
	if len(all) < minSnippets {
		t.Errorf("found %d ```caddyfile blocks in README.md and docs/, want at least %d", len(all), minSnippets)
	}
}

// extract returns the ```caddyfile blocks of a markdown file.
func extract(path, root string) ([]snippet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rel, _ := filepath.Rel(root, path)
	var (
		out   []snippet
		cur   *snippet
		lines []string
		n     int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			lang := strings.ToLower(strings.TrimSpace(strings.TrimPrefix(trimmed, "```")))
			if lang == "caddyfile" {
				cur = &snippet{file: rel, line: n + 1}
				lines = nil
			} else {
				// Another fenced block: skip to its end so a ``` inside
				// it is not taken for an opening fence.
				for sc.Scan() {
					n++
					if strings.TrimSpace(sc.Text()) == "```" {
						break
					}
				}
			}
		case cur != nil && trimmed == "```":
			cur.text = strings.Join(lines, "\n") + "\n"
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return out, &unclosedErr{file: rel, line: cur.line - 1}
	}
	return out, nil
}

type unclosedErr struct {
	file string
	line int
}

func (e *unclosedErr) Error() string {
	return fmt.Sprintf("%s:%d: ```caddyfile block is never closed", e.file, e.line)
}

// wrap makes a snippet a complete Caddyfile: a complete one (global
// options or a site block first) adapts as is; a fragment starting with
// lb_policy goes inside a reverse_proxy of a site; any other fragment
// (directives) goes inside a site. offset is the number of lines wrap
// put before the snippet's first line.
func wrap(text string) (body string, offset int) {
	first := firstToken(text)
	switch {
	case first == "lb_policy":
		return ":8080 {\n\treverse_proxy 127.0.0.1:1 {\n" + text + "\t}\n}\n", 2
	case isSiteOrGlobal(first):
		return text, 0
	default:
		return ":8080 {\n" + text + "}\n", 1
	}
}

// docLines rewrites "<file>:<n>" positions in an adapter message (lines
// of the wrapped text) as lines of the markdown file.
func docLines(msg string, s snippet, offset int) string {
	re := regexp.MustCompile(regexp.QuoteMeta(s.file) + `:(\d+)`)
	return re.ReplaceAllStringFunc(msg, func(m string) string {
		n, err := strconv.Atoi(m[len(s.file)+1:])
		if err != nil {
			return m
		}
		return fmt.Sprintf("%s:%d", s.file, s.line+n-1-offset)
	})
}

// validateSluiceModules finds every Sluice module in an adapted JSON
// config (handlers, selection policies, upstream sources), decodes it as
// Caddy would and runs its Validate, if it has one: a snippet must not
// only parse but configure something Sluice accepts. Provisioning is not
// run (it would dial Redis, claim shared state and start replicas).
func validateSluiceModules(cfg []byte) error {
	var root any
	if err := json.Unmarshal(cfg, &root); err != nil {
		return err
	}
	var errs []error
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for key, ns := range map[string]string{
				"handler": "http.handlers.",
				"policy":  "http.reverse_proxy.selection_policies.",
				"source":  "http.reverse_proxy.upstreams.",
			} {
				name, ok := x[key].(string)
				if !ok {
					continue
				}
				if err := validateModule(ns+name, x, key); err != nil {
					errs = append(errs, err)
				}
			}
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(root)
	return errors.Join(errs...)
}

func validateModule(id string, raw map[string]any, inlineKey string) error {
	info, err := caddy.GetModule(id)
	if err != nil {
		return nil // not a module (or not ours): Caddy's own business
	}
	m := info.New()
	if !strings.HasPrefix(reflect.TypeOf(m).Elem().PkgPath(), "github.com/sluice-router/sluice") {
		return nil
	}
	fields := make(map[string]any, len(raw))
	for k, v := range raw {
		if k != inlineKey {
			fields[k] = v
		}
	}
	data, _ := json.Marshal(fields)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		return fmt.Errorf("%s: %v", id, err)
	}
	if v, ok := m.(caddy.Validator); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%s: %v", id, err)
		}
	}
	return nil
}

// firstToken is the first word of the snippet outside comments.
func firstToken(text string) string {
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if f := strings.Fields(line); len(f) > 0 {
			return f[0]
		}
	}
	return ""
}

// isSiteOrGlobal says whether tok opens a global options block ("{") or a
// site block (an address: ":3000", "localhost", "http://…", "example.com").
func isSiteOrGlobal(tok string) bool {
	switch {
	case tok == "{":
		return true
	case strings.HasPrefix(tok, ":"), strings.Contains(tok, "://"):
		return true
	case tok == "localhost", strings.HasPrefix(tok, "localhost:"):
		return true
	case strings.Contains(tok, ".") && !strings.HasPrefix(tok, "@"):
		return true // a host name such as example.com
	}
	return false
}
