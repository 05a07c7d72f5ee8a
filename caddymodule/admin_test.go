package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"go.uber.org/zap"
)

// adminCall serves one request through the admin module's routes, as
// Caddy's admin endpoint dispatches them (longest pattern first).
func adminCall(t *testing.T, a *AdminAPI, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	mux := http.NewServeMux()
	for _, rt := range a.Routes() {
		h := rt.Handler
		mux.HandleFunc(rt.Pattern, func(w http.ResponseWriter, r *http.Request) {
			if err := h.ServeHTTP(w, r); err != nil {
				t.Errorf("%s %s: %v", method, path, err)
			}
		})
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

// Asking the admin API for the health of a pool that does not exist (a
// typo, a probe walking names) answers an empty report and creates
// nothing: the pool does not join the list of pools, and a process
// answering such requests does not grow one pool per name asked.
func TestAdminHealthOfAnUnknownPoolCreatesNoPool(t *testing.T) {
	a := &AdminAPI{log: zap.NewNop()}
	name := freshPoolName("admin-health-typo")

	rec := adminCall(t, a, http.MethodGet, "/sluice/pools/"+name+"/health")
	if rec.Code != http.StatusOK {
		t.Fatalf("health: %d %s", rec.Code, rec.Body)
	}
	var rep healthReport
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil || rep.Pool != name || rep.Managed || len(rep.Backends) != 0 {
		t.Fatalf("health of an unknown pool = %s (%v), want an empty report", rec.Body, err)
	}

	rec = adminCall(t, a, http.MethodGet, "/sluice/pools")
	var list struct{ Pools []string }
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil {
		t.Fatalf("pools: %s (%v)", rec.Body, err)
	}
	if slices.Contains(list.Pools, name) {
		t.Fatalf("GET /sluice/pools/%s/health created the pool: /sluice/pools = %v", name, list.Pools)
	}
}
