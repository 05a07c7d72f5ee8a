package integration

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
)

// A token taken from an unset environment variable must not silently
// turn authentication off: the config is refused, naming the directive.
func TestTokenFromAnUnsetVariableRefusesTheConfig(t *testing.T) {
	startCaddy(t, globals+`
:9861 {
	bind 127.0.0.1
	respond "up"
}
`)
	loadRefused(t, globals+`
:9861 {
	bind 127.0.0.1
	custom_router sec {
		token {env.SLUICE_TEST_SURELY_UNSET_TOKEN}
	}
	respond "up"
}
`, "", "")
	resp, err := client.Get("http://127.0.0.1:9861/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the running config changed: %v %v", resp, err)
	}
	resp.Body.Close()
}

// The contract's endpoints answer only allowed sources (the connection's
// peer): changes need an allowed source (and the token when set); reads
// that reveal the topology need an allowed source or the token.
func TestContractEndpointsAnswerOnlyAllowedSources(t *testing.T) {
	startCaddy(t, globals+`
:9862 {
	bind 127.0.0.1
	route {
		custom_router sec2 {
			token s3cret
			allowed_sources 10.99.0.0/16
			backends http://127.0.0.1:9863
		}
		respond "proxied"
	}
}
`)
	url := "http://127.0.0.1:9862"
	do := func(method, path, token string) int {
		req, _ := http.NewRequest(method, url+path, bytes.NewReader([]byte(`{"backends":["http://127.0.0.1:9864"]}`)))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		method, path, token string
		want                int
	}{
		{"POST", "/_custom_router/set-backends", "s3cret", 403}, // not an allowed source, token or not
		{"POST", "/add_worker?url=http://127.0.0.1:9865", "s3cret", 403},
		{"POST", "/remove_worker?url=http://127.0.0.1:9863", "s3cret", 403},
		{"GET", "/_custom_router/health", "", 401},
		{"GET", "/_custom_router/metrics", "", 401},
		{"GET", "/list_workers", "wrong", 401},
		{"GET", "/_custom_router/health", "s3cret", 200},
		{"GET", "/list_workers", "s3cret", 200},
		{"GET", "/anything-else", "", 200},
	} {
		if got := do(c.method, c.path, c.token); got != c.want {
			t.Errorf("%s %s (token %q): %d, want %d", c.method, c.path, c.token, got, c.want)
		}
	}
	h := getHealthWithToken(t, url, "s3cret")
	if len(h.Backends) != 1 || h.Backends[0].Addr != "127.0.0.1:9863" {
		t.Fatalf("the backend set changed: %+v", h.Backends)
	}
}

func getHealthWithToken(t *testing.T, url, token string) health {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/_custom_router/health", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h health
	if err := decodeJSON(resp, &h); err != nil {
		t.Fatal(fmt.Errorf("health: %v", err))
	}
	return h
}
