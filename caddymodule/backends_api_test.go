package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A set-backends body is exactly one JSON object: anything after it is
// refused, a stray closing bracket or brace included (json.Decoder.More
// reports false for those, as if they ended an enclosing value).
func TestSetBackendsRefusesTrailingData(t *testing.T) {
	for _, body := range []string{
		`{"backends": []} trailing`,
		`{"backends": []}}`,
		`{"backends": []}]`,
		`{"backends": ["http://127.0.0.1:8001"]} ]}`,
		`{"backends": []} {}`,
	} {
		r := httptest.NewRequest(http.MethodPost, "/_custom_router/set-backends", strings.NewReader(body))
		bs, status, err := readSetBackends(httptest.NewRecorder(), r, nil)
		if err == nil || status != http.StatusBadRequest {
			t.Errorf("body %q accepted (status %d, backends %v)", body, status, urls(bs))
		}
	}
	for _, body := range []string{`{"backends": []}`, "{\"backends\": []}\r\n \t", `{"backends": ["http://127.0.0.1:8001"]}`} {
		r := httptest.NewRequest(http.MethodPost, "/_custom_router/set-backends", strings.NewReader(body))
		if _, status, err := readSetBackends(httptest.NewRecorder(), r, nil); err != nil || status != http.StatusOK {
			t.Errorf("body %q refused: %d %v", body, status, err)
		}
	}
}
