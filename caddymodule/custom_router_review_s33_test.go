package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// s33Router provisions a custom_router for a fresh pool holding the set
// 10.0.0.1:80, and returns it with a function that serves one call from
// an allowed source.
func s33Router(t *testing.T, prefix string) (*CustomRouter, func(*http.Request) *httptest.ResponseRecorder) {
	t.Helper()
	usePoolsDir(t)
	h := &CustomRouter{Pool: freshPoolName(prefix)}
	if err := h.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	first, _ := lb.ParseBackends([]string{"http://10.0.0.1:80"})
	applyBackends(h.name, first, zap.NewNop())
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		t.Errorf("%s %s reached the next handler", r.Method, r.URL.Path)
		return nil
	})
	return h, func(r *http.Request) *httptest.ResponseRecorder {
		r.RemoteAddr = "127.0.0.1:40000"
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, r, next); err != nil {
			t.Fatal(err)
		}
		return rec
	}
}

func s33Dials(name string) []string {
	set, _ := lb.GetPool(name).Backends()
	return lb.Dials(set)
}

// The checks of a set (is a backend Caddy's admin endpoint, its own
// listener?) resolve host names under the call's context: once the client
// has gone, a lookup fails at once, and a name that does not resolve
// passed as "reaches nothing now". A client that hung up after sending
// its body so got a set with the admin endpoint, spelled as a name,
// applied unchecked. A call whose client left before its set was checked
// now changes nothing, set-backends and add_worker alike.
func TestASetWhoseClientLeftBeforeItWasCheckedIsNotApplied(t *testing.T) {
	h, serve := s33Router(t, "review-s33-gone")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodPost, "/_custom_router/set-backends",
			strings.NewReader(`{"backends": ["http://10.0.0.2:80"]}`)).WithContext(gone),
		httptest.NewRequest(http.MethodPost, "/add_worker?url=http://10.0.0.3:80", nil).WithContext(gone),
	} {
		rec := serve(r)
		if got := s33Dials(h.name); rec.Code == http.StatusOK || !slices.Equal(got, []string{"10.0.0.1:80"}) {
			t.Errorf("%s with the client gone: %d %s, set %v; want refused and the set [10.0.0.1:80] kept",
				r.URL.Path, rec.Code, strings.TrimSpace(rec.Body.String()), got)
		}
	}
}

// Every change of a set holds setsMu (applyBackends): the config's seed
// too. It checked that the pool had no set, then set it, outside the
// lock: a set-backends landing in between was overwritten by the seed,
// though a posted set always wins.
func TestASeedNeverLandsInsideASetChange(t *testing.T) {
	usePoolsDir(t)
	name := freshPoolName("review-s33-seed")
	seed, _ := lb.ParseBackends([]string{"http://10.0.0.9:80"})
	posted, _ := lb.ParseBackends([]string{"http://10.0.0.1:80"})
	seededInside := ranWhileSetsMuHeld(func() { seedPool(name, seed, zap.NewNop()) },
		func() { applyBackendsLocked(name, posted, zap.NewNop()) })
	if seededInside {
		t.Error("the seed changed the set while a set-backends held setsMu")
	}
	if got := s33Dials(name); !slices.Equal(got, []string{"10.0.0.1:80"}) {
		t.Errorf("set %v after a seed raced a set-backends; want the posted [10.0.0.1:80]", got)
	}
}

// Worker changes racing each other and set-backends lose nothing: every
// add_worker lands (none read a set another was replacing).
func TestConcurrentWorkerChangesAllLand(t *testing.T) {
	h, serve := s33Router(t, "review-s33-race")
	const n = 32
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			rec := serve(httptest.NewRequest(http.MethodPost, fmt.Sprintf("/add_worker?url=http://10.1.0.%d:80", i+1), nil))
			if rec.Code != http.StatusOK {
				t.Errorf("add_worker %d: %d %s", i, rec.Code, rec.Body)
			}
		}()
		go func() {
			defer wg.Done()
			serve(httptest.NewRequest(http.MethodGet, "/list_workers", nil))
		}()
	}
	wg.Wait()
	got := s33Dials(h.name)
	if len(got) != n+1 {
		t.Fatalf("%d workers after %d concurrent add_worker on a set of 1: %v", len(got), n, got)
	}
	rec := serve(httptest.NewRequest(http.MethodPost, "/remove_worker?url=http://10.1.0.1:80", nil))
	if rec.Code != http.StatusOK || slices.Contains(s33Dials(h.name), "10.1.0.1:80") {
		t.Fatalf("remove_worker: %d, set %v", rec.Code, s33Dials(h.name))
	}
}

// Hostile set-backends bodies are refused with the reason, and the set
// in force stays.
func TestHostileSetBackendsBodiesKeepTheSet(t *testing.T) {
	h, serve := s33Router(t, "review-s33-hostile")
	many := make([]string, 100000)
	for i := range many {
		many[i] = fmt.Sprintf(`"http://10.%d.%d.%d:80"`, i>>16, (i>>8)&255, i&255)
	}
	for _, c := range []struct {
		body   string
		status int
		says   string
	}{
		{`{"backends": [` + strings.Join(many, ",") + `]}`, http.StatusRequestEntityTooLarge, "larger than"},
		{`{"backends": ` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, http.StatusBadRequest, "JSON"},
		{`{"backends": ["http://u:p@10.0.0.2:80"]}`, http.StatusBadRequest, "no user"},
		{`{"backends": ["http://10.0.0.2:80/v1?x#y"]}`, http.StatusBadRequest, "no user"},
		{`{"backends": ["http://10.0.0.2:65536"]}`, http.StatusBadRequest, "bad port"},
		{`{"backends": ["unix:///run/x.sock"]}`, http.StatusBadRequest, "scheme"},
		{`{"backends": ["http://[fe80::1%25eth0]:80"]}`, http.StatusBadRequest, "link-local"},
		{`{"backends": ["http://2852039166:80"]}`, http.StatusBadRequest, "IPv4"},
		{`{"backends": ["http://10.0.0.2:80"], "extra": 1}`, http.StatusBadRequest, "unknown field"},
		{`{"backends": [null]}`, http.StatusBadRequest, "empty address"},
	} {
		rec := serve(httptest.NewRequest(http.MethodPost, "/_custom_router/set-backends", strings.NewReader(c.body)))
		if rec.Code != c.status || !strings.Contains(rec.Body.String(), c.says) || !slices.Equal(s33Dials(h.name), []string{"10.0.0.1:80"}) {
			t.Errorf("body %.60q…: %d %.200s, set %v; want %d saying %q and the set kept",
				c.body, rec.Code, rec.Body, s33Dials(h.name), c.status, c.says)
		}
	}
}

// allowed_backends is checked on the address the backend dials, however
// it is spelled: an IPv4-mapped IPv6 address is its IPv4 one, and a host
// name (a trailing dot, a number standing for an address) is refused.
func TestAllowedBackendsSeeThroughSpellings(t *testing.T) {
	h := &CustomRouter{Pool: freshPoolName("review-s33-allowed"), AllowedBackends: []string{"10.0.0.0/8"}}
	if err := h.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]bool{
		"http://10.0.0.5:80":               true,
		"http://[::ffff:10.0.0.5]:80":      true,
		"http://[::FFFF:A00:5]:80":         true,
		"http://[::ffff:192.168.0.1]:80":   false,
		"http://10.0.0.5.:80":              false,
		"http://Replica.:80":               false,
		"http://[fd00::1%25eth0]:80":       false,
		"http://[64:ff9b::a00:5]:80":       false, // NAT64, not 10.0.0.5 here
		"http://[::10.0.0.5]:80":           false, // IPv4-compatible, deprecated
		"http://[2001:db8::10.0.0.5]:8000": false,
	} {
		b, err := lb.ParseBackend(raw)
		if err == nil {
			err = h.allowedBackend(b)
		}
		if (err == nil) != want {
			t.Errorf("%s: allowed %v (%v), want %v", raw, err == nil, err, want)
		}
	}
}

// The endpoints that change the set answer other methods 405 and change
// nothing.
func TestSetChangesRefuseOtherMethods(t *testing.T) {
	h, serve := s33Router(t, "review-s33-methods")
	for _, c := range []struct{ path, allow string }{
		{"/_custom_router/set-backends", "POST, PUT"},
		{"/add_worker?url=http://10.0.0.2:80", "POST"},
		{"/remove_worker?url=http://10.0.0.1:80", "POST"},
	} {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
			rec := serve(httptest.NewRequest(m, c.path, strings.NewReader(`{"backends": []}`)))
			if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != c.allow ||
				!slices.Equal(s33Dials(h.name), []string{"10.0.0.1:80"}) {
				t.Errorf("%s %s: %d Allow %q, set %v; want 405 Allow %q and the set kept",
					m, c.path, rec.Code, rec.Header().Get("Allow"), s33Dials(h.name), c.allow)
			}
		}
	}
}
