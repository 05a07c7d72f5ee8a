package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

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
