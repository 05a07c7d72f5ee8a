package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is the module root, relative to this package's directory.
const repoRoot = "../.."

func TestParseRecipeGood(t *testing.T) {
	r, err := ParseRecipe([]byte(`{
		"caddy_version": "v2.11.9",
		"module": "github.com/sluice-router/sluice",
		"replacement": ".",
		"output": "sluice-caddy",
		"plugins": ["github.com/example/plugin@v1.2.3", "github.com/example/local=../local"]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Recipe{
		CaddyVersion: "v2.11.9",
		Module:       "github.com/sluice-router/sluice",
		Replacement:  ".",
		Output:       "sluice-caddy",
		Plugins:      []string{"github.com/example/plugin@v1.2.3", "github.com/example/local=../local"},
	}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("got %+v, want %+v", r, want)
	}
}

func TestParseRecipeDefaults(t *testing.T) {
	r, err := ParseRecipe([]byte(`{"caddy_version": "v2.11.9", "module": "github.com/sluice-router/sluice"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Output != defaultOutput || r.Replacement != "" || len(r.Plugins) != 0 {
		t.Fatalf("defaults: got %+v", r)
	}
}

func TestParseRecipeBad(t *testing.T) {
	for _, tc := range []struct {
		name, json, want string
	}{
		{"empty", ``, "empty recipe"},
		{"not JSON", `caddy_version: v2`, "invalid JSON"},
		{"truncated", `{"caddy_version": "v2.11.9",`, "invalid"},
		{"trailing data", `{"caddy_version": "v2.11.9", "module": "m"} {}`, "trailing data"},
		{"missing caddy_version", `{"module": "github.com/sluice-router/sluice"}`, `"caddy_version": required`},
		{"empty caddy_version", `{"caddy_version": "", "module": "m"}`, `"caddy_version": required`},
		{"caddy_version with space", `{"caddy_version": "v2.11.9 ", "module": "m"}`, `"caddy_version"`},
		{"caddy_version flag", `{"caddy_version": "--help", "module": "m"}`, `"caddy_version"`},
		{"caddy_version not a string", `{"caddy_version": 2.11, "module": "m"}`, `"caddy_version": must be a string`},
		{"missing module", `{"caddy_version": "v2.11.9"}`, `"module": required`},
		{"module with version", `{"caddy_version": "v2.11.9", "module": "m@v1.0.0"}`, `"module"`},
		{"module with replacement", `{"caddy_version": "v2.11.9", "module": "m=."}`, `"module"`},
		{"unknown field", `{"caddy_version": "v2.11.9", "module": "m", "caddyVersion": "x"}`, `unknown field "caddyVersion"`},
		{"plugins not a list", `{"caddy_version": "v2.11.9", "module": "m", "plugins": "x"}`, `"plugins"`},
		{"empty plugin", `{"caddy_version": "v2.11.9", "module": "m", "plugins": ["a", ""]}`, `"plugins[1]": required`},
		{"plugin flag", `{"caddy_version": "v2.11.9", "module": "m", "plugins": ["--output=x"]}`, `"plugins[0]"`},
		{"output with space", `{"caddy_version": "v2.11.9", "module": "m", "output": "a b"}`, `"output"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRecipe([]byte(tc.json))
			if err == nil {
				t.Fatalf("accepted %s", tc.json)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestCommand(t *testing.T) {
	r := Recipe{
		CaddyVersion: "v2.11.9",
		Module:       "github.com/sluice-router/sluice",
		Replacement:  ".",
		Output:       "sluice-caddy",
		Plugins:      []string{"github.com/example/plugin@v1.2.3"},
	}
	got := r.Command("/repo", "/out/caddy")
	want := []string{
		"go", "tool", "-modfile=build/tools/go.mod", "xcaddy", "build", "v2.11.9",
		"--with", "github.com/sluice-router/sluice@" + zeroPseudoVersion + "=/repo",
		"--with", "github.com/example/plugin@v1.2.3",
		"--output", "/out/caddy",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}

	r.Replacement, r.Plugins = "", nil
	got = r.Command("/repo", "/out/caddy")
	want = []string{"go", "tool", "-modfile=build/tools/go.mod", "xcaddy", "build", "v2.11.9", "--with", "github.com/sluice-router/sluice", "--output", "/out/caddy"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("no replacement: got %q, want %q", got, want)
	}
}

func TestBuildEnv(t *testing.T) {
	env, extra := buildEnv([]string{"PATH=/bin"})
	if !reflect.DeepEqual(extra, []string{"CGO_ENABLED=0"}) || env[len(env)-1] != "CGO_ENABLED=0" {
		t.Fatalf("default: env %q extra %q", env, extra)
	}
	env, extra = buildEnv([]string{"PATH=/bin", "CGO_ENABLED=1"})
	if extra != nil || !reflect.DeepEqual(env, []string{"PATH=/bin", "CGO_ENABLED=1"}) {
		t.Fatalf("override: env %q extra %q", env, extra)
	}
}

func TestRunPrintAndBadRecipe(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "xcaddy.json")
	if err := os.WriteFile(good, []byte(`{"caddy_version": "v2.11.9", "module": "github.com/sluice-router/sluice", "replacement": ".", "output": "bin/caddy"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"-recipe", good, "-print"}, &out, &errb); code != 0 {
		t.Fatalf("-print: exit %d, stderr %s", code, errb.String())
	}
	line := out.String()
	for _, want := range []string{
		"go tool -modfile=build/tools/go.mod xcaddy build v2.11.9",
		"--with github.com/sluice-router/sluice@" + zeroPseudoVersion + "=" + dir,
		"--output " + filepath.Join(dir, "bin/caddy"),
	} {
		if !strings.Contains(line, want) {
			t.Errorf("-print output %q does not contain %q", line, want)
		}
	}

	out.Reset()
	errb.Reset()
	o := filepath.Join(dir, "elsewhere", "caddy")
	if code := run([]string{"-recipe", good, "-print", "-o", o}, &out, &errb); code != 0 {
		t.Fatalf("-print -o: exit %d, stderr %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "--output "+o) {
		t.Errorf("-o not honoured: %q", out.String())
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"module": "github.com/sluice-router/sluice"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"-recipe", bad, "-print"}, &out, &errb); code == 0 {
		t.Fatal("bad recipe: exit 0")
	}
	if !strings.Contains(errb.String(), "caddy_version") {
		t.Errorf("bad recipe message does not name the field: %q", errb.String())
	}
}

// goMod returns go.mod's go directive and its github.com/caddyserver/caddy/v2
// requirement.
func goMod(t *testing.T) (goVersion, caddyVersion string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		switch {
		case len(f) >= 2 && f[0] == "go":
			goVersion = f[1]
		case len(f) >= 2 && f[0] == "github.com/caddyserver/caddy/v2":
			caddyVersion = f[1]
		}
	}
	if goVersion == "" || caddyVersion == "" {
		t.Fatalf("go.mod: go directive %q, caddy requirement %q: not found", goVersion, caddyVersion)
	}
	return goVersion, caddyVersion
}

// TestRepoRecipe checks the repository's xcaddy.json, and that it builds the
// same Caddy that go.mod (and so `go run ./cmd/caddy` and the tests) uses.
func TestRepoRecipe(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "xcaddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRecipe(data)
	if err != nil {
		t.Fatalf("xcaddy.json: %v", err)
	}
	if r.Module != "github.com/sluice-router/sluice" || r.Replacement != "." {
		t.Errorf("xcaddy.json must build this repository: module %q replacement %q", r.Module, r.Replacement)
	}
	_, caddy := goMod(t)
	if r.CaddyVersion != caddy {
		t.Errorf("Caddy versions differ: xcaddy.json caddy_version is %q but go.mod requires github.com/caddyserver/caddy/v2 %s.\n"+
			"To bump Caddy, change both: edit caddy_version in xcaddy.json and run `go get github.com/caddyserver/caddy/v2@<version>`; "+
			"to undo an accidental change, set the one you did not mean to change back to the other.", r.CaddyVersion, caddy)
	}
	tools, err := os.ReadFile(filepath.Join(repoRoot, toolsModFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(tools), "tool github.com/caddyserver/xcaddy/cmd/xcaddy") {
		t.Errorf("%s does not declare the xcaddy tool; run `cd build/tools && go get -tool github.com/caddyserver/xcaddy/cmd/xcaddy@<version>`", toolsModFile)
	}
}

// TestXcaddyOutOfTheModuleGraph: those who require Sluice (xcaddy's
// temporary module, a user's own Caddy build) get Sluice's go.mod
// requirements; xcaddy is a build tool and must not be among them.
func TestXcaddyOutOfTheModuleGraph(t *testing.T) {
	gm, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(gm), "caddyserver/xcaddy") {
		t.Errorf("go.mod mentions xcaddy: pin it in %s instead (`cd build/tools && go get -tool github.com/caddyserver/xcaddy/cmd/xcaddy@<version>`), then `go mod tidy` at the root", toolsModFile)
	}
}

// TestGoDirectiveNotAboveCaddys: go.mod's go directive is the oldest Go
// that builds Sluice, and with GOTOOLCHAIN=local (stock builder images) a
// newer one than the Caddy release's own fails `xcaddy build` on every
// Go in between. Keep it at most Caddy's (a toolchain line may ask for a
// newer Go for this repository's own work).
func TestGoDirectiveNotAboveCaddys(t *testing.T) {
	modGo, caddyVersion := goMod(t)
	out, err := exec.Command("go", "list", "-m", "-f", "{{.GoVersion}}", "github.com/caddyserver/caddy/v2@"+caddyVersion).Output()
	if err != nil {
		t.Skipf("cannot read Caddy %s's go directive: %v", caddyVersion, err)
	}
	caddyGo := strings.TrimSpace(string(out))
	if goNewer(modGo, caddyGo) {
		t.Errorf("go.mod says `go %s` but Caddy %s says `go %s`: builds with GOTOOLCHAIN=local on Go %s..%s would fail; set `go %s` (and `toolchain go%s` if this repository needs the newer one)",
			modGo, caddyVersion, caddyGo, caddyGo, modGo, caddyGo, modGo)
	}
}

// goNewer reports whether Go version a (e.g. "1.26.8") is newer than b.
func goNewer(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < 3; i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x > y
		}
	}
	return false
}

// dockerStage is one FROM ... stage of a Dockerfile: its FROM arguments and
// its instructions (continuation lines joined, comments dropped).
type dockerStage struct {
	from         string
	instructions []string
}

func parseDockerfile(data string) (args map[string]string, stages []dockerStage) {
	args = map[string]string{}
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		if s := strings.TrimSpace(cur.String()); s != "" {
			logical = append(logical, s)
		}
		cur.Reset()
	}
	for _, l := range logical {
		kw, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(kw) {
		case "FROM":
			stages = append(stages, dockerStage{from: rest})
		case "ARG":
			if len(stages) == 0 {
				k, v, _ := strings.Cut(rest, "=")
				args[k] = v
			}
			fallthrough
		default:
			if len(stages) > 0 {
				s := &stages[len(stages)-1]
				s.instructions = append(s.instructions, strings.ToUpper(kw)+" "+rest)
			}
		}
	}
	return args, stages
}

// TestDockerfile keeps the Dockerfile on the recipe: it must build with
// cmd/sluice-build (so it reads xcaddy.json), run as a numeric non-root
// uid:gid, listen on
// :3000, and use a Go image that satisfies go.mod.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	modGo, _ := goMod(t)
	for _, p := range dockerfileProblems(string(data), modGo) {
		t.Error(p)
	}
}

// TestDockerfileProblems checks that the Dockerfile check catches drift.
func TestDockerfileProblems(t *testing.T) {
	const good = `ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
# RUN go run ./cmd/sluice-build in a comment does not count
RUN go run ./cmd/sluice-build \
    -o /out/caddy
FROM scratch
COPY --from=build /out/caddy /usr/bin/caddy
COPY Caddyfile.hf /etc/sluice/Caddyfile
USER 65532:65532
EXPOSE 3000
ENTRYPOINT ["/usr/bin/caddy"]
`
	if p := dockerfileProblems(good, "1.26.8"); len(p) != 0 {
		t.Fatalf("good Dockerfile: %q", p)
	}
	for _, tc := range []struct{ name, old, new, want string }{
		{"no recipe build", "RUN go run ./cmd/sluice-build \\\n", "RUN go tool xcaddy build v2.11.9 \\\n", "go run ./cmd/sluice-build"},
		{"single stage", "FROM scratch\n", "", "multi-stage"},
		{"root user", "USER 65532:65532", "USER root", "non-root"},
		{"uid 0", "USER 65532:65532", "USER 0:0", "non-root"},
		{"gid 0", "USER 65532:65532", "USER 65532:0", "non-root"},
		{"no user", "USER 65532:65532\n", "", "non-root"},
		{"named user", "USER 65532:65532", "USER sluice:sluice", "numeric"},
		{"named group", "USER 65532:65532", "USER 65532:sluice", "numeric"},
		{"wrong port", "EXPOSE 3000", "EXPOSE 8080", "EXPOSE 3000"},
		{"old go", "GO_VERSION=1.26.8", "GO_VERSION=1.25.3", "GO_VERSION"},
		{"no Caddyfile", "COPY Caddyfile.hf /etc/sluice/Caddyfile\n", "", "Caddyfile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(good, tc.old, tc.new, 1)
			if bad == good {
				t.Fatalf("test case did not change the Dockerfile")
			}
			problems := dockerfileProblems(bad, "1.26.8")
			if !strings.Contains(strings.Join(problems, "\n"), tc.want) {
				t.Fatalf("problems %q do not mention %q", problems, tc.want)
			}
		})
	}
}

// dockerfileProblems returns what is wrong with a Dockerfile, given go.mod's
// go directive.
func dockerfileProblems(data, modGo string) []string {
	var problems []string
	args, stages := parseDockerfile(data)
	if len(stages) < 2 {
		return []string{fmt.Sprintf("Dockerfile has %d stages, want a multi-stage build", len(stages))}
	}
	builds, final := stages[:len(stages)-1], stages[len(stages)-1]

	var buildStage *dockerStage
	for i, s := range builds {
		for _, in := range s.instructions {
			if strings.HasPrefix(in, "RUN ") && strings.Contains(in, "go run ./cmd/sluice-build") {
				buildStage = &builds[i]
			}
		}
	}
	if buildStage == nil {
		problems = append(problems, "no build stage runs `go run ./cmd/sluice-build`: the Dockerfile must build through the xcaddy.json recipe")
	} else {
		// The build stage's Go must satisfy go.mod's go directive.
		from := buildStage.from
		for k, v := range args {
			from = strings.ReplaceAll(from, "${"+k+"}", v)
			from = strings.ReplaceAll(from, "$"+k, v)
		}
		image, _, _ := strings.Cut(from, " ")
		name, tag, _ := strings.Cut(image, ":")
		if !strings.HasSuffix(name, "golang") {
			problems = append(problems, fmt.Sprintf("build stage FROM %q: want a golang image", buildStage.from))
		}
		dockerGo, _, _ := strings.Cut(tag, "-")
		if !goSatisfies(dockerGo, modGo) {
			problems = append(problems, fmt.Sprintf("build stage Go %q (FROM %s) does not satisfy go.mod's `go %s`: set GO_VERSION in the Dockerfile to %s", dockerGo, buildStage.from, modGo, modGo))
		}
	}

	var user string
	var exposes3000 bool
	for _, in := range final.instructions {
		kw, rest, _ := strings.Cut(in, " ")
		switch kw {
		case "USER":
			user = rest
		case "EXPOSE":
			for _, p := range strings.Fields(rest) {
				if p == "3000" || p == "3000/tcp" {
					exposes3000 = true
				}
			}
		}
	}
	// USER must be numeric uid:gid, neither 0: Kubernetes' runAsNonRoot
	// can only check a numeric user, and a scratch image has no passwd.
	u, g, _ := strings.Cut(user, ":")
	switch {
	case u == "" || u == "root" || u == "0" || g == "0" || g == "root":
		problems = append(problems, fmt.Sprintf("runtime stage runs as %q: want a non-root USER uid:gid", user))
	case !isNumber(u) || !isNumber(g):
		problems = append(problems, fmt.Sprintf("runtime stage USER %q: want a numeric uid:gid (e.g. 65532:65532)", user))
	}
	if !exposes3000 {
		problems = append(problems, "runtime stage does not EXPOSE 3000")
	}
	for _, want := range []string{
		`ENTRYPOINT ["/usr/bin/caddy"]`,
		`COPY Caddyfile.hf /etc/sluice/Caddyfile`,
	} {
		found := false
		for _, in := range final.instructions {
			found = found || in == want
		}
		if !found {
			problems = append(problems, "runtime stage lacks "+want)
		}
	}
	return problems
}

func isNumber(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

// goSatisfies reports whether Go release have (e.g. "1.26.8" or "1.26")
// is the same major.minor as want and at least as new.
func goSatisfies(have, want string) bool {
	h, w := strings.Split(have, "."), strings.Split(want, ".")
	if len(h) < 2 || len(w) < 2 || h[0] != w[0] || h[1] != w[1] {
		return false
	}
	if len(w) < 3 {
		return true
	}
	if len(h) < 3 {
		// A floating tag like golang:1.26 is the newest 1.26.x.
		return true
	}
	hp, err1 := strconv.Atoi(h[2])
	wp, err2 := strconv.Atoi(w[2])
	return err1 == nil && err2 == nil && hp >= wp
}

func TestGoSatisfies(t *testing.T) {
	for _, tc := range []struct {
		have, want string
		ok         bool
	}{
		{"1.26.8", "1.26.8", true},
		{"1.26.9", "1.26.8", true},
		{"1.26", "1.26.8", true},
		{"1.26.7", "1.26.8", false},
		{"1.25.9", "1.26.0", false},
		{"1.27.0", "1.26.8", false},
		{"", "1.26.8", false},
	} {
		if got := goSatisfies(tc.have, tc.want); got != tc.ok {
			t.Errorf("goSatisfies(%q, %q) = %v, want %v", tc.have, tc.want, got, tc.ok)
		}
	}
}
