package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// session_header names the response header that hands the client its
// session token and the request header it comes back in. A name that is
// no HTTP header name (a space, a colon) is dropped by Go's server from
// every response, and a framing header (Content-Length, ...) is dropped
// or misread: the config loaded and session affinity silently never
// worked. Such a name refuses the config, naming session_header.
func TestSessionHeaderThatHTTPCannotCarryIsRefused(t *testing.T) {
	goldenTempDirs(t)
	for _, bad := range []string{"X Session Token", "X-Session:Token", "X-Séssion", "Content-Length", "transfer-encoding", "Connection", "Host"} {
		p := &LoadAware{Scorers: map[string]float64{"session_affinity": 1}, SessionHeader: bad}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "session_header") {
			t.Errorf("session_header %q: Validate() = %v, want an error naming session_header", bad, err)
		}
	}
	for _, good := range []string{"", "X-Session-Token", "x-my_session.v2", "Session~Id!"} {
		p := &LoadAware{Scorers: map[string]float64{"session_affinity": 1}, SessionHeader: good}
		if err := p.Validate(); err != nil {
			t.Errorf("session_header %q: %v", good, err)
		}
	}
	// The same from a Caddyfile.
	out, _, err := goldenAdapt(t, "Caddyfile", caddyfile.Format([]byte(goldenLoadAware(`session_header "X Session"`))))
	if err == nil {
		err = goldenValidateSluice(t, out, true)
	}
	if err == nil || !strings.Contains(err.Error(), "session_header") {
		t.Fatalf(`Caddyfile session_header "X Session": error %v, want one naming session_header`, err)
	}
}
