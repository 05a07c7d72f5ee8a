package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// A set-backends call the admin API refuses (a bad body, the wrong
// method) changes nothing: in particular it leaves no pool behind, as a
// typo in the pool's name of a bad call would otherwise be listed by
// /sluice/pools for the life of the process.
func TestAdminRefusedSetBackendsCreatesNoPool(t *testing.T) {
	usePoolsDir(t)
	a := &AdminAPI{log: zap.NewNop()}
	mux := http.NewServeMux()
	for _, rt := range a.Routes() {
		h := rt.Handler
		mux.HandleFunc(rt.Pattern, func(w http.ResponseWriter, r *http.Request) { _ = h.ServeHTTP(w, r) })
	}
	call := func(method, path, body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		return rec
	}
	for _, c := range []struct {
		method, body string
		status       int
	}{
		{http.MethodPost, `{"backends": ["ftp://10.0.0.1:80"]}`, http.StatusBadRequest},
		{http.MethodPost, `not json`, http.StatusBadRequest},
		{http.MethodGet, ``, http.StatusMethodNotAllowed},
	} {
		name := freshPoolName("admin-refused-set")
		if rec := call(c.method, "/sluice/pools/"+name+"/set-backends", c.body); rec.Code != c.status {
			t.Fatalf("%s %q: %d %s, want %d", c.method, c.body, rec.Code, rec.Body, c.status)
		}
		var list struct{ Pools []string }
		if err := json.Unmarshal(call(http.MethodGet, "/sluice/pools", "").Body.Bytes(), &list); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(list.Pools, name) {
			t.Errorf("%s %q refused, yet /sluice/pools lists %s", c.method, c.body, name)
		}
	}
}
