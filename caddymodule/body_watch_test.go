package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// The watched writer must stay a streaming writer: reverse_proxy flushes
// each SSE chunk through http.ResponseController, which reaches the
// client's writer through Unwrap. A second Sluice handler on the same
// request keeps the first one's watch.
func TestTheBodyWatchFlushesAndIsInstalledOnce(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
	rec := httptest.NewRecorder()
	w := watchBody(rec, r)
	if w == http.ResponseWriter(rec) {
		t.Fatal("the writer was not watched")
	}
	if again := watchBody(w, r); again != w {
		t.Fatal("a second handler wrapped the watch again")
	}
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte("data: {}\n\n")); err != nil {
		t.Fatal(err)
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		t.Fatalf("flush through the watch: %v", err)
	}
	if !rec.Flushed || rec.Body.String() != "data: {}\n\n" {
		t.Fatalf("flushed %v, body %q", rec.Flushed, rec.Body.String())
	}
	rs, _ := requestStateFor(r)
	if !rs.out.began {
		t.Fatal("the first body write was not noted")
	}
}
