package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The listener port's reads answer a change (POST, PUT, DELETE) 405 with
// the methods allowed, as the admin API's do: a backend set POSTed to
// list_workers must not be told it succeeded.
func TestListenerReadsRefuseOtherMethods(t *testing.T) {
	h := &CustomRouter{Pool: freshPoolName("review-methods")}
	if err := h.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		t.Errorf("%s %s reached the next handler", r.Method, r.URL.Path)
		return nil
	})
	for _, path := range []string{"/_custom_router/health", "/_custom_router/metrics", "/list_workers"} {
		for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete} {
			r := httptest.NewRequest(method, path, nil)
			r.RemoteAddr = "127.0.0.1:40000" // an allowed source
			rec := httptest.NewRecorder()
			if err := h.ServeHTTP(rec, r, next); err != nil {
				t.Fatal(err)
			}
			read := method == http.MethodGet || method == http.MethodHead
			switch {
			case read && rec.Code != http.StatusOK:
				t.Errorf("%s %s: %d, want 200", method, path, rec.Code)
			case !read && (rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD"):
				t.Errorf("%s %s: %d Allow %q, want 405 Allow \"GET, HEAD\"", method, path, rec.Code, rec.Header().Get("Allow"))
			}
		}
	}
}
