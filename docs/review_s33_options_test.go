package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// optionPages are the module pages with option tables and the modules
// whose options they document (the Caddyfile option names are the JSON
// field names: caddymodule/caddyfile_options.go).
var optionPages = map[string][]string{
	"queued_least_latency.md": {"http.reverse_proxy.selection_policies.queued_least_latency"},
	"cache_aware.md":          {"http.reverse_proxy.selection_policies.cache_aware"},
	"load_aware.md":           {"http.reverse_proxy.selection_policies.load_aware"},
	"global_redis_least.md":   {"http.reverse_proxy.selection_policies.global_redis_least"},
	"flow_control.md":         {"http.handlers.flow_control"},
	"custom_router.md":        {"http.handlers.custom_router"},
	"inference_sim.md":        {"http.handlers.inference_sim"},
}

// cellOption is an option a row of an option table names: the first word
// of each code span of its first cell (`band <priority> { … }` names band;
// `username`, `password` names both).
var cellOption = regexp.MustCompile("`([a-z_][a-z0-9_]*)")

// optionTableRows calls row with the cells of each row of the page's
// tables whose header line matches header (outside code fences; "\|"
// inside a cell read as "/"), the table's index among those and the line.
func optionTableRows(t *testing.T, path string, header *regexp.Regexp, row func(table, line int, cells []string)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, in, fenced := -1, false, false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		switch {
		case fenced || !strings.HasPrefix(line, "|"):
			in = false
		case header.MatchString(line):
			in = true
			table++
		case in:
			row(table, n, strings.Split(strings.ReplaceAll(line, `\|`, "/"), "|"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// anyOptionTable is the header of an option table: its first column is
// "option".
var anyOptionTable = regexp.MustCompile(`^\|\s*option\s*\|`)

// documentedOptions are the options the page's option tables name, with
// the line of each.
func documentedOptions(t *testing.T, path string) map[string]int {
	t.Helper()
	out := map[string]int{}
	optionTableRows(t, path, anyOptionTable, func(_, line int, cells []string) {
		if len(cells) < 3 {
			return
		}
		for _, m := range cellOption.FindAllStringSubmatch(cells[1], -1) {
			if _, dup := out[m[1]]; !dup {
				out[m[1]] = line
			}
		}
	})
	return out
}

// jsonOptions are the JSON field names of a module's config: its own, its
// embedded option groups', and those of the objects and lists of objects
// it holds (a band's options, a Redis block's), as encoding/json sees them.
func jsonOptions(typ reflect.Type, into map[string]bool, seen map[reflect.Type]bool) {
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map || typ.Kind() == reflect.Array {
		typ = typ.Elem()
	}
	if typ.Kind() != reflect.Struct || seen[typ] || typ.PkgPath() == "github.com/caddyserver/caddy/v2" {
		return
	}
	seen[typ] = true
	for i := 0; i < typ.NumField(); i++ {
		sf := typ.Field(i)
		tag := sf.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if sf.Anonymous && name == "" {
			jsonOptions(sf.Type, into, seen)
			continue
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		into[name] = true
		jsonOptions(sf.Type, into, seen)
	}
}

// acceptsOption reports whether the module's Caddyfile parser knows opt
// (written with no value: any error but "unknown option" means it does).
func acceptsOption(t *testing.T, id, opt string) bool {
	t.Helper()
	info, err := caddy.GetModule(id)
	if err != nil {
		t.Fatal(err)
	}
	u, ok := info.New().(caddyfile.Unmarshaler)
	if !ok {
		t.Fatalf("%s has no Caddyfile parser", id)
	}
	name := id[strings.LastIndex(id, ".")+1:]
	err = u.UnmarshalCaddyfile(caddyfile.NewTestDispenser(name + " {\n" + opt + "\n}\n"))
	if err == nil {
		return true
	}
	msg := err.Error()
	return !strings.Contains(msg, `unknown option "`+opt+`"`) && !strings.Contains(msg, `unrecognized subdirective '`+opt+`'`)
}

// jsonSectionNames are the names the page's "Caddy JSON" section spells
// out: in code spans of its prose and as keys of its examples (a Caddyfile
// line that becomes a differently named JSON field is documented there).
func jsonSectionNames(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Caddy JSON")
	if !ok {
		return nil
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	out := map[string]bool{}
	for _, m := range cellOption.FindAllStringSubmatch(section, -1) {
		out[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`"([a-z_][a-z0-9_]*)"\s*:`).FindAllStringSubmatch(section, -1) {
		out[m[1]] = true
	}
	return out
}

// undocumentedOK are JSON fields a page's option table need not list,
// each with why.
var undocumentedOK = map[string]string{
	"handler": "Caddy's own field naming the handler module",
}

// TestOptionTablesMatchTheModules: every option a module page's tables
// name is one the module accepts (its JSON field, or an option its
// Caddyfile parser takes), and every JSON field of the module is in the
// page's tables.
func TestOptionTablesMatchTheModules(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for page, ids := range optionPages {
		t.Run(strings.TrimSuffix(page, ".md"), func(t *testing.T) {
			path := filepath.Join(root, "docs", "policies", page)
			documented := documentedOptions(t, path)
			if len(documented) < 5 {
				t.Fatalf("docs/policies/%s: found %d options in its tables (%v): the table parse broke", page, len(documented), documented)
			}
			fields := map[string]bool{}
			for _, id := range ids {
				info, err := caddy.GetModule(id)
				if err != nil {
					t.Fatal(err)
				}
				jsonOptions(reflect.TypeOf(info.New()), fields, map[reflect.Type]bool{})
			}
			var names []string
			for n := range documented {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, opt := range names {
				if fields[opt] {
					continue
				}
				known := false
				for _, id := range ids {
					known = known || acceptsOption(t, id, opt)
				}
				if !known {
					t.Errorf("docs/policies/%s:%d: the table documents `%s`, which %v neither has as a JSON field nor accepts in a Caddyfile", page, documented[opt], opt, ids)
				}
			}
			inJSON := jsonSectionNames(t, path)
			var missing []string
			for f := range fields {
				if _, ok := documented[f]; !ok && !inJSON[f] && undocumentedOK[f] == "" {
					missing = append(missing, f)
				}
			}
			sort.Strings(missing)
			for _, f := range missing {
				t.Errorf("docs/policies/%s: %v has the JSON field %q, which neither an option table nor the Caddy JSON section of the page documents", page, ids, f)
			}
		})
	}
}

// caddyfileReceivers are the Go types whose UnmarshalCaddyfile parses each
// page's module.
var caddyfileReceivers = map[string]string{
	"queued_least_latency.md": "QueuedLeastLatency",
	"cache_aware.md":          "CacheAware",
	"load_aware.md":           "LoadAware",
	"global_redis_least.md":   "GlobalRedisLeast",
	"flow_control.md":         "FlowControl",
	"custom_router.md":        "CustomRouter",
	"inference_sim.md":        "InferenceSim",
}

// parserOptions are the option names a module's UnmarshalCaddyfile (and
// the hook it hands parseModule) takes itself, beyond its JSON fields:
// the string cases of a switch on opt or sub, and the strings opt or sub
// is compared with.
func parserOptions(t *testing.T, receiver string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join("..", "caddymodule", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	found := false
	isOpt := func(e ast.Expr) bool {
		id, ok := e.(*ast.Ident)
		return ok && (id.Name == "opt" || id.Name == "sub")
	}
	lit := func(e ast.Expr) {
		if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
			if s, err := strconv.Unquote(b.Value); err == nil {
				out[s] = true
			}
		}
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "UnmarshalCaddyfile" || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
			if !ok {
				continue
			}
			if id, ok := star.X.(*ast.Ident); !ok || id.Name != receiver {
				continue
			}
			found = true
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SwitchStmt:
					if n.Tag != nil && isOpt(n.Tag) {
						for _, c := range n.Body.List {
							for _, e := range c.(*ast.CaseClause).List {
								lit(e)
							}
						}
					}
				case *ast.BinaryExpr:
					if n.Op == token.EQL && isOpt(n.X) {
						lit(n.Y)
					}
				}
				return true
			})
		}
	}
	if !found {
		t.Fatalf("no (*%s).UnmarshalCaddyfile in caddymodule", receiver)
	}
	return out
}

// TestCaddyfileOnlyOptionsAreDocumented: every option a module's
// Caddyfile parser takes by name (not through its JSON field) is in the
// page's option tables.
func TestCaddyfileOnlyOptionsAreDocumented(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for page, receiver := range caddyfileReceivers {
		documented := documentedOptions(t, filepath.Join(root, "docs", "policies", page))
		opts := parserOptions(t, receiver)
		total += len(opts)
		var names []string
		for o := range opts {
			names = append(names, o)
		}
		sort.Strings(names)
		for _, o := range names {
			if _, ok := documented[o]; !ok {
				t.Errorf("docs/policies/%s: (*%s).UnmarshalCaddyfile takes the option %q, which no option table of the page documents", page, receiver, o)
			}
		}
	}
	// inference_sim alone parses some twenty options by name; fewer found
	// means the source walk broke.
	if total < 20 {
		t.Fatalf("found %d options parsed by name in all the modules' UnmarshalCaddyfile, want at least 20", total)
	}
}
