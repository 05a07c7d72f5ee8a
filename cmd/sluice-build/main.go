// Command sluice-build builds a custom Caddy binary with the Sluice plugin
// from the pinned recipe in xcaddy.json, using the xcaddy version pinned as a
// Go tool in the separate module build/tools (`go tool
// -modfile=build/tools/go.mod xcaddy`), so that xcaddy never enters the
// module graph of those who require Sluice. The Dockerfile runs this same
// command, so the versions live in one place.
//
// Usage (from the repository root):
//
//	go run ./cmd/sluice-build                  # build ./sluice-caddy (recipe "output")
//	go run ./cmd/sluice-build -o /out/caddy    # build to another path
//	go run ./cmd/sluice-build -print           # only print the command
//
// It runs
//
//	CGO_ENABLED=0 go tool -modfile=build/tools/go.mod xcaddy build <caddy_version> \
//	    --with <module>=<replacement> [--with <plugin>]... --output <output>
//
// in the directory that holds the recipe (the module root, whose
// build/tools/go.mod declares the xcaddy tool), streaming xcaddy's output. CGO_ENABLED defaults
// to 0 (a static binary for small base images); set CGO_ENABLED in the
// environment to override it. Other xcaddy settings (XCADDY_GO_BUILD_FLAGS,
// XCADDY_DEBUG, ...) pass through the environment unchanged.
//
// The recipe is a JSON object with these fields (unknown fields are errors):
//
//	caddy_version  required  the Caddy version to build, e.g. "v2.11.9"; it
//	                         must equal the github.com/caddyserver/caddy/v2
//	                         requirement in go.mod (a test checks this)
//	module         required  the plugin's module path,
//	                         "github.com/sluice-router/sluice"
//	replacement    optional  a local directory that replaces module, relative
//	                         to the recipe's directory ("." = the repo root);
//	                         empty = fetch module at its published version
//	output         optional  the binary to write, relative to the recipe's
//	                         directory (default "caddy"); -o overrides it,
//	                         relative to the current directory
//	plugins        optional  extra xcaddy --with arguments, each
//	                         "module[@version][=replacement]"
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Recipe is the content of xcaddy.json.
type Recipe struct {
	CaddyVersion string   `json:"caddy_version"`
	Module       string   `json:"module"`
	Replacement  string   `json:"replacement,omitempty"`
	Output       string   `json:"output,omitempty"`
	Plugins      []string `json:"plugins,omitempty"`
}

// zeroPseudoVersion is the version Go uses to require a module that is only
// available through a replace directive.
const zeroPseudoVersion = "v0.0.0-00010101000000-000000000000"

// toolsModFile is the go.mod, relative to the recipe's directory, that pins
// xcaddy as a Go tool. It is its own module so that xcaddy and its
// dependencies stay out of the main module's graph (and so out of the
// graphs of builds that require github.com/sluice-router/sluice).
const toolsModFile = "build/tools/go.mod"

// defaultOutput is the binary name used when the recipe has no output.
const defaultOutput = "caddy"

// ParseRecipe decodes and validates a recipe. Errors name the offending field.
func ParseRecipe(data []byte) (Recipe, error) {
	var r Recipe
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return Recipe{}, fmt.Errorf("invalid JSON at byte %d: %v", syn.Offset, err)
		case errors.As(err, &typ):
			return Recipe{}, fmt.Errorf("field %q: must be a %s, got JSON %s", typ.Field, typ.Type, typ.Value)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return Recipe{}, errors.New("invalid JSON: unexpected end of input (unclosed object or string?)")
		case errors.Is(err, io.EOF):
			return Recipe{}, errors.New("empty recipe: expected a JSON object")
		default:
			// Unknown fields come back as `json: unknown field "x"`.
			return Recipe{}, fmt.Errorf("invalid recipe: %v", err)
		}
	}
	if dec.More() {
		return Recipe{}, errors.New("invalid JSON: trailing data after the recipe object")
	}
	if err := r.validate(); err != nil {
		return Recipe{}, err
	}
	if r.Output == "" {
		r.Output = defaultOutput
	}
	return r, nil
}

func (r Recipe) validate() error {
	check := func(field, v string, required bool) error {
		if v == "" {
			if required {
				return fmt.Errorf("field %q: required, missing or empty", field)
			}
			return nil
		}
		if strings.TrimSpace(v) != v || strings.ContainsAny(v, " \t\r\n") {
			return fmt.Errorf("field %q: %q must not contain white space", field, v)
		}
		return nil
	}
	if err := check("caddy_version", r.CaddyVersion, true); err != nil {
		return err
	}
	if strings.HasPrefix(r.CaddyVersion, "-") {
		return fmt.Errorf("field %q: %q is not a version", "caddy_version", r.CaddyVersion)
	}
	if err := check("module", r.Module, true); err != nil {
		return err
	}
	if strings.ContainsAny(r.Module, "@=") {
		return fmt.Errorf("field %q: %q must be a bare module path (no @version or =replacement; use the replacement field)", "module", r.Module)
	}
	if err := check("replacement", r.Replacement, false); err != nil {
		return err
	}
	if err := check("output", r.Output, false); err != nil {
		return err
	}
	for i, p := range r.Plugins {
		field := fmt.Sprintf("plugins[%d]", i)
		if err := check(field, p, true); err != nil {
			return err
		}
		if strings.HasPrefix(p, "-") || strings.HasPrefix(p, "@") || strings.HasPrefix(p, "=") {
			return fmt.Errorf("field %q: %q must be module[@version][=replacement]", field, p)
		}
	}
	return nil
}

// Command returns the argv (starting with "go") that builds the recipe.
// dir is the recipe's directory: a relative replacement is resolved against
// it, since xcaddy builds in a temporary module elsewhere. output is the
// binary path to pass to xcaddy.
func (r Recipe) Command(dir, output string) []string {
	args := []string{"go", "tool", "-modfile=" + toolsModFile, "xcaddy", "build", r.CaddyVersion}
	with := r.Module
	if r.Replacement != "" {
		repl := r.Replacement
		if !filepath.IsAbs(repl) {
			repl = filepath.Join(dir, repl)
		}
		// Without a version, xcaddy's `go get <module>` asks the module proxy
		// for the latest version even though the module is replaced, which
		// fails for an unpublished (or private) module unless the proxy
		// answers exactly "not found". Requiring the zero pseudo-version, as
		// `go mod tidy` does for replaced-only modules, needs no lookup.
		with += "@" + zeroPseudoVersion + "=" + repl
	}
	args = append(args, "--with", with)
	for _, p := range r.Plugins {
		args = append(args, "--with", p)
	}
	return append(args, "--output", output)
}

// buildEnv returns the environment for xcaddy: the current one, with
// CGO_ENABLED=0 unless the caller set CGO_ENABLED.
func buildEnv(environ []string) (env []string, extra []string) {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "CGO_ENABLED=") {
			return environ, nil
		}
	}
	extra = []string{"CGO_ENABLED=0"}
	return append(append([]string(nil), environ...), extra...), extra
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./:=@+,", c))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice-build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	recipePath := fs.String("recipe", "xcaddy.json", "path of the build recipe")
	out := fs.String("o", "", "output binary (default: the recipe's output, relative to the recipe's directory)")
	printOnly := fs.Bool("print", false, "print the command that would run, and exit")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sluice-build [-recipe xcaddy.json] [-o output] [-print]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice-build: unexpected arguments: %q\n", fs.Args())
		return 2
	}

	data, err := os.ReadFile(*recipePath)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-build: %v\n", err)
		return 1
	}
	recipe, err := ParseRecipe(data)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-build: bad recipe %s: %v\n", *recipePath, err)
		return 1
	}
	dir, err := filepath.Abs(filepath.Dir(*recipePath))
	if err != nil {
		fmt.Fprintf(stderr, "sluice-build: %v\n", err)
		return 1
	}
	output := filepath.Join(dir, recipe.Output)
	if filepath.IsAbs(recipe.Output) {
		output = recipe.Output
	}
	if *out != "" {
		if output, err = filepath.Abs(*out); err != nil {
			fmt.Fprintf(stderr, "sluice-build: %v\n", err)
			return 1
		}
	}

	args := recipe.Command(dir, output)
	env, extra := buildEnv(os.Environ())
	var line []string
	for _, a := range append(extra, args...) {
		line = append(line, shellQuote(a))
	}
	if *printOnly {
		fmt.Fprintf(stdout, "cd %s && %s\n", shellQuote(dir), strings.Join(line, " "))
		return 0
	}
	fmt.Fprintf(stderr, "sluice-build: in %s: %s\n", dir, strings.Join(line, " "))

	if err := os.MkdirAll(filepath.Dir(output), 0o755); err != nil {
		fmt.Fprintf(stderr, "sluice-build: %v\n", err)
		return 1
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() > 0 {
			fmt.Fprintf(stderr, "sluice-build: xcaddy build failed: %v\n", err)
			return exit.ExitCode()
		}
		fmt.Fprintf(stderr, "sluice-build: running xcaddy: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "sluice-build: wrote %s\n", output)
	return 0
}
