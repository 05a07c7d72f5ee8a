package caddymodule

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluice-router/sluice/lb/loadaware"
)

// adaptLoadAware adapts a load_aware block and returns the policy as Caddy
// would decode it.
func adaptLoadAware(t *testing.T, opts string) (LoadAware, []byte) {
	t.Helper()
	out, _, err := goldenAdapt(t, "Caddyfile", caddyfile.Format([]byte(goldenLoadAware(opts))))
	if err != nil {
		t.Fatalf("adapt %q: %v", opts, err)
	}
	var found []json.RawMessage
	for _, o := range jsonObjects(t, out) {
		if o["policy"] == "load_aware" {
			raw, _ := json.Marshal(o)
			found = append(found, raw)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one load_aware policy in the adapted JSON, got %d:\n%s", len(found), out)
	}
	var p LoadAware
	if err := goldenStrictUnmarshal(found[0], &p, "policy"); err != nil {
		t.Fatal(err)
	}
	return p, found[0]
}

func TestLoadAwarePresetCaddyfile(t *testing.T) {
	goldenTempDirs(t)
	for _, tc := range []struct {
		opts string
		json string // the adapted policy must contain it
		want map[string]float64
	}{
		{"pool la-default", `"pool":"la-default"`, loadaware.DefaultWeights()},
		{"preset heimdall", `"preset":"heimdall"`, loadaware.HeimdallWeights()},
		// Explicit scorers override the preset.
		{"preset heimdall\nscorer kv_cache 2", `"scorers":{"kv_cache":2}`, map[string]float64{loadaware.KVCache: 2}},
	} {
		p, raw := adaptLoadAware(t, tc.opts)
		if !strings.Contains(string(raw), tc.json) {
			t.Errorf("%q adapted to %s, want it to contain %s", tc.opts, raw, tc.json)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("%q: %v", tc.opts, err)
		}
		got := p.pickerConfig().Policy.WithDefaults().Weights
		if !maps.Equal(got, tc.want) {
			t.Errorf("%q: scorers %v, want %v", tc.opts, got, tc.want)
		}
	}
	if w := loadaware.HeimdallWeights(); len(w) != 5 {
		t.Fatalf("heimdall preset has %d scorers, want the seed's five", len(w))
	}
}

func TestLoadAwareUnknownPresetRefusedNamingPreset(t *testing.T) {
	goldenTempDirs(t)
	out, _, err := goldenAdapt(t, "Caddyfile", caddyfile.Format([]byte(goldenLoadAware("preset bogus"))))
	if err == nil {
		err = goldenValidateSluice(t, out, true)
	}
	if err == nil || !strings.Contains(err.Error(), "load_aware: preset") || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("preset bogus: error %v, want one naming load_aware's preset and the value", err)
	}
	// The same through JSON.
	var p LoadAware
	if err := json.Unmarshal([]byte(`{"preset":"bogus"}`), &p); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "preset") {
		t.Fatalf("JSON preset bogus: %v", err)
	}
}

// The session token steers a client only where a scorer reads it
// (session_affinity): with the default scorers a response carries none,
// rather than a token that claims an affinity nobody keeps. A reload that
// turns the scorer on hands them out from its first request.
func TestSessionTokenOnlyWhereSessionAffinityScores(t *testing.T) {
	cctx := provisionContext(t)
	pool := freshPoolName("la-session-token")
	defaults := &LoadAware{Pool: pool}
	if err := defaults.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer defaults.Cleanup()
	if tok := selectOnce(t, defaults, "127.0.0.1:20001", "127.0.0.1:20002").Get("X-Session-Token"); tok != "" {
		t.Fatalf("default scorers: the response carries session token %q, which steers nothing", tok)
	}
	sessions := &LoadAware{Pool: pool, Scorers: map[string]float64{"active_request": 1, "session_affinity": 1}}
	if err := sessions.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer sessions.Cleanup()
	tok := selectOnce(t, sessions, "127.0.0.1:20001", "127.0.0.1:20002").Get("X-Session-Token")
	if tok == "" || strings.Contains(tok, "127.0.0.1") {
		t.Fatalf("session_affinity on: session token %q, want an opaque token", tok)
	}
}
