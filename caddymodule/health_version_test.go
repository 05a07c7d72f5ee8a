package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/internal/version"
)

// The health answer reports Sluice's release version, a semantic version
// without "v", the one written in internal/version.
func TestHealthReportsVersion(t *testing.T) {
	if !regexp.MustCompile(`^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(version.Version) {
		t.Fatalf("version.Version %q is not a semantic version without a leading v", version.Version)
	}
	rec := httptest.NewRecorder()
	serveHealth(rec, httptest.NewRequest(http.MethodGet, "/_custom_router/health", nil), "health-version")
	if rec.Code != http.StatusOK {
		t.Fatalf("health: %d %s", rec.Code, rec.Body)
	}
	var body struct {
		OK      bool   `json:"ok"`
		Pool    string `json:"pool"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("health body %q: %v", rec.Body, err)
	}
	if !body.OK || body.Pool != "health-version" || body.Version != version.Version {
		t.Fatalf("health = %+v, want ok, pool health-version, version %q", body, version.Version)
	}
}

// An answer that cannot be encoded (a Sluice bug: a func among a
// policy's settings once made every health answer 200 with an empty
// body) is a 500 that says why.
func TestAnAnswerThatCannotBeEncodedIsA500(t *testing.T) {
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, map[string]any{"settings": struct{ F func() }{}})
	var body struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusInternalServerError ||
		body.Error.Type != "internal" || !strings.Contains(body.Error.Message, "unsupported type") {
		t.Fatalf("answer %d %q (%v), want 500 naming the encoding error", rec.Code, rec.Body, err)
	}
}

// Every policy's health answer encodes: its settings, health and engine
// metrics included (a policy provisioned as Caddy does, with defaults).
func TestEveryPolicysHealthAnswerEncodes(t *testing.T) {
	cctx := provisionContext(t)
	for _, p := range []struct {
		pool string
		mod  caddy.Provisioner
	}{
		{"health-qll", &QueuedLeastLatency{Pool: "health-qll"}},
		{"health-ca", &CacheAware{Pool: "health-ca"}},
		{"health-la", &LoadAware{Pool: "health-la"}},
	} {
		if err := p.mod.Provision(cctx); err != nil {
			t.Fatalf("%s: %v", p.pool, err)
		}
		rec := httptest.NewRecorder()
		serveHealth(rec, httptest.NewRequest(http.MethodGet, "/_custom_router/health", nil), p.pool)
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK || body["ok"] != true {
			t.Fatalf("%s: health %d %q (%v)", p.pool, rec.Code, rec.Body, err)
		}
		if cu, ok := p.mod.(caddy.CleanerUpper); ok {
			_ = cu.Cleanup()
		}
	}
}
