package caddymodule

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// GET /sluice/pools lists "the pools a running config uses or that hold a
// backend set" (docs/api.md). A pool that a reload dropped, with no set,
// is neither: a script walking the list (posting sets, reading health)
// must not keep finding it for the rest of the process.
func TestReviewS34AdminPoolsForgetsAPoolAReloadDropped(t *testing.T) {
	goldenTempDirs(t)
	usePoolsDir(t)
	a := &AdminAPI{log: zap.NewNop()}
	listed := func() []string {
		t.Helper()
		rec := adminCall(t, a, http.MethodGet, "/sluice/pools")
		var body struct{ Pools []string }
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("GET /sluice/pools: %d %s (%v)", rec.Code, rec.Body, err)
		}
		return body.Pools
	}
	old, renamed := freshPoolName("admin-s34-old"), freshPoolName("admin-s34-new")
	t.Cleanup(func() { _ = caddy.Stop() })
	if err := caddy.Load(poolReloadConfig(t, old, false), true); err != nil {
		t.Fatal(err)
	}
	if got := listed(); !slices.Contains(got, old) {
		t.Fatalf("the running config's pool %q is not listed: %v", old, got)
	}
	if err := caddy.Load(poolReloadConfig(t, renamed, false), true); err != nil {
		t.Fatal(err)
	}
	got := listed()
	if !slices.Contains(got, renamed) {
		t.Fatalf("the running config's pool %q is not listed: %v", renamed, got)
	}
	if slices.Contains(got, old) {
		t.Fatalf("after a reload that dropped pool %q (no set), /sluice/pools still lists it: %v", old, got)
	}
}
