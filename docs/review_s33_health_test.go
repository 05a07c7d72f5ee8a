package docs

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// healthStructs are the types caddymodule/health.go encodes as the health
// report: the report, a backend, its engine metrics, the global queue.
var healthStructs = []string{"healthReport", "backendHealth", "replicaMetrics", "globalQueueHealth"}

// healthJSONNames are the JSON names of the health report's fields, read
// from the struct tags in caddymodule/health.go.
func healthJSONNames(t *testing.T) map[string]string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "caddymodule", "health.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{} // JSON name → struct
	found := map[string]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || !contains(healthStructs, ts.Name.Name) {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return true
		}
		found[ts.Name.Name] = true
		for _, f := range st.Fields.List {
			if f.Tag == nil {
				continue
			}
			tag := reflect.StructTag(strings.Trim(f.Tag.Value, "`")).Get("json")
			if name, _, _ := strings.Cut(tag, ","); name != "" && name != "-" {
				out[name] = ts.Name.Name
			}
		}
		return false
	})
	for _, s := range healthStructs {
		if !found[s] {
			t.Fatalf("caddymodule/health.go has no struct %s", s)
		}
	}
	return out
}

// TestHealthDocMatchesTheReport: every field of the health report is
// explained in docs/api.md's Health section, and every key of its example
// (outside settings, whose keys are each module's own) is a field of the
// report.
func TestHealthDocMatchesTheReport(t *testing.T) {
	names := healthJSONNames(t)
	if len(names) < 20 {
		t.Fatalf("read %d JSON fields from the health structs: %v", len(names), names)
	}
	data, err := os.ReadFile("api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Health\n")
	if !ok {
		t.Fatal("docs/api.md has no ## Health section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	mentioned := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z_]+)").FindAllStringSubmatch(section, -1) {
		mentioned[m[1]] = true
	}
	var example any
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/api.md's Health section has no ```json example")
	}
	if err := json.Unmarshal([]byte(blocks[0][1]), &example); err != nil {
		t.Fatalf("docs/api.md's health example: %v", err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				mentioned[k] = true
				if _, ok := names[k]; !ok {
					t.Errorf("docs/api.md's health example has the key %q, which the health report does not have", k)
				}
				if k != "settings" {
					walk(x)
				}
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(example)
	var missing []string
	for n, s := range names {
		if !mentioned[n] {
			missing = append(missing, s+"."+n)
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("docs/api.md's Health section does not mention the report's field %s", m)
	}
}
