package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Caddy's admin endpoint (localhost:2019 without a config) is never a
// backend, however its port is spelled: Go dials "02019" as port 2019,
// so a set with it would put the writable admin API behind the public
// listener.
func TestSetBackendsRefusesTheAdminEndpointWithLeadingZerosInItsPort(t *testing.T) {
	for _, addr := range []string{"http://127.0.0.1:2019", "http://127.0.0.1:02019", "http://localhost:0002019"} {
		r := httptest.NewRequest(http.MethodPost, "/_custom_router/set-backends",
			strings.NewReader(`{"backends": ["`+addr+`"]}`))
		bs, status, err := readSetBackends(httptest.NewRecorder(), r, nil)
		if status != http.StatusBadRequest || err == nil || !strings.Contains(err.Error(), "admin endpoint") {
			t.Errorf("%s: status %d, backends %v, error %v; want 400 naming the admin endpoint", addr, status, urls(bs), err)
		}
	}
}
