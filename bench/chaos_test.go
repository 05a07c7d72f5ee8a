package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A failed chaos run prints what the proxies logged at error level: the
// last lines of it, in order, nothing at info level.
func TestLastLogErrorsKeepsTheLastErrorLines(t *testing.T) {
	var b strings.Builder
	for i := range 30 {
		level := "info"
		if i%2 == 1 {
			level = "error"
		}
		fmt.Fprintf(&b, `{"level":"%s","msg":"line %d"}`+"\n", level, i)
	}
	b.WriteString(`{"level":"error","msg":"` + strings.Repeat("x", 1000) + `"}` + "\n")
	path := filepath.Join(t.TempDir(), "caddy.log")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	got := lastLogErrors(path, 3)
	if len(got) != 3 {
		t.Fatalf("got %d lines, want 3: %q", len(got), got)
	}
	if !strings.Contains(got[0], "line 27") || !strings.Contains(got[1], "line 29") {
		t.Errorf("not the last error lines in order: %q", got)
	}
	if len(got[2]) != 600 {
		t.Errorf("a long line kept %d bytes, want it cut to 600", len(got[2]))
	}
	if lastLogErrors(filepath.Join(t.TempDir(), "none.log"), 3) != nil {
		t.Error("a missing log gave lines")
	}
}
