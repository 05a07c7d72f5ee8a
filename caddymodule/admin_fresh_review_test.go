package caddymodule

import (
	"encoding/json"
	"net/http"
	"testing"

	"go.uber.org/zap"
)

// The admin API's read-only endpoints answer GET (and HEAD) only: any
// other method is 405 naming the methods allowed, with the JSON error
// every other Sluice endpoint answers. Before, POST, PUT and DELETE of
// /sluice/pools and /sluice/metrics answered 200 with the list or the
// metrics, so a script that sent a change to the wrong path (a POST of a
// backend set to /sluice/pools) was told it succeeded.
func TestAdminReadOnlyEndpointsRefuseOtherMethods(t *testing.T) {
	a := &AdminAPI{log: zap.NewNop()}
	for _, path := range []string{"/sluice/pools", "/sluice/metrics"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			rec := adminCall(t, a, method, path)
			var body struct {
				Error struct{ Type, Message string } `json:"error"`
			}
			if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: %d Allow %q, want 405 Allow \"GET, HEAD\"", method, path, rec.Code, rec.Header().Get("Allow"))
				continue
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Type != "method_not_allowed" || body.Error.Message == "" {
				t.Errorf("%s %s: body %q (%v), want the JSON error method_not_allowed", method, path, rec.Body, err)
			}
		}
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			if rec := adminCall(t, a, method, path); rec.Code != http.StatusOK {
				t.Errorf("%s %s: %d %.200s, want 200", method, path, rec.Code, rec.Body)
			}
		}
	}
}
