package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
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

// A trusted source's fairness id that is not valid UTF-8 used to panic in
// the metrics' label code after its slot was admitted: the slot leaked
// and the pool stayed saturated. It is refused with 400 now, nothing is
// held, and a flood of distinct tenant ids is bounded in the metrics.
func TestFlowControlRefusesBadFairnessIDsAndBoundsTenantLabels(t *testing.T) {
	startCaddy(t, globals+`
:9881 {
	bind 127.0.0.1
	route {
		flow_control labels {
			trusted_sources 127.0.0.1/32
			max_concurrency 1
		}
		respond "ok"
	}
}
`)
	url := "http://127.0.0.1:9881/"
	send := func(id string) int {
		req, _ := http.NewRequest("POST", url, nil)
		req.Header["X-Gateway-Inference-Fairness-Id"] = []string{id}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; i < 6; i++ {
		if got := send("tenant-\xff\xfe"); got != 400 {
			t.Fatalf("invalid UTF-8 fairness id: %d, want 400", got)
		}
	}
	for i := 0; i < 1100; i++ {
		if got := send(fmt.Sprint("tenant-", i)); got != 200 {
			t.Fatalf("request %d after the bad ones: %d (a slot leaked?)", i, got)
		}
	}
	resp, err := client.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ids := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if i := strings.Index(line, `fairness_id="`); i >= 0 && strings.HasPrefix(line, "inference_extension_flow_control_request_queue_duration_seconds_count") {
			rest := line[i+len(`fairness_id="`):]
			ids[rest[:strings.Index(rest, `"`)]] = true
		}
	}
	if len(ids) == 0 || len(ids) > 1001 {
		t.Fatalf("%d distinct fairness_id label values, want 1..1001 (bounded)", len(ids))
	}
}

// Behind a trusted proxy that appends to X-Forwarded-For, Caddy's
// (non-strict) client IP is the left-most entry, which the client wrote:
// flow control must not let it assert a trusted source.
func TestTrustedSourcesCannotBeSpoofedThroughXForwardedFor(t *testing.T) {
	startCaddy(t, `{
	admin localhost:2999
	http_port 9080
	https_port 9443
	persist_config off
	servers {
		trusted_proxies static 127.0.0.1/32
	}
}
:9885 {
	bind 127.0.0.1
	route {
		flow_control spoof {
			trusted_sources 10.1.1.1/32
		}
		respond "tenant={header.X-Gateway-Inference-Fairness-Id}"
	}
}
`)
	get := func(xff string) string {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:9885/", nil)
		req.Header.Set("X-Gateway-Inference-Fairness-Id", "premium-tenant")
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// The client wrote 10.1.1.1; the trusted proxy appended the address it saw.
	if got := get("10.1.1.1, 203.0.113.9"); got != "tenant=" {
		t.Fatalf("a spoofed left-most X-Forwarded-For was trusted: %q", got)
	}
	// The trusted proxy saw the trusted source itself.
	if got := get("203.0.113.9, 10.1.1.1"); got != "tenant=premium-tenant" {
		t.Fatalf("the trusted source, as the proxy saw it, was not trusted: %q", got)
	}
}

// allowed_backends narrows where a backend set may point: addresses
// outside it, and host names (unverifiable), get 400 and the set stays.
func TestAllowedBackendsNarrowTheSet(t *testing.T) {
	startCaddy(t, globals+`
:9905 {
	bind 127.0.0.1
	route {
		custom_router narrow {
			allowed_backends 127.0.0.0/8
			backends http://127.0.0.1:9906
		}
		respond "proxied"
	}
}
`)
	url := "http://127.0.0.1:9905"
	for body, want := range map[string]int{
		`{"backends":["http://10.1.2.3:8000"]}`:         400,
		`{"backends":["http://replica.internal:8000"]}`: 400,
		`{"backends":["http://127.0.0.1:9907"]}`:        200,
	} {
		resp, err := client.Post(url+"/_custom_router/set-backends", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", body, resp.StatusCode, want)
		}
	}
	resp, err := client.Post(url+"/add_worker?url=http://10.9.9.9:8000", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("add_worker outside allowed_backends: %d, want 400", resp.StatusCode)
	}
}

// A reload that narrows allowed_backends applies to the set already
// live: a replica the new config forbids leaves the set (it used to keep
// receiving traffic until the next set-backends). A refused config
// changes nothing, and a seed the config's own allowed_backends forbids
// refuses the config, naming the directive.
func TestANarrowedAllowedBackendsAppliesToTheLiveSet(t *testing.T) {
	config := func(allowed, seed, tail string) string {
		return globals + fmt.Sprintf(`
:9908 {
	bind 127.0.0.1
	route {
		custom_router narrowed {
			%s
			backends %s
		}
		respond "proxied"
		%s
	}
}
`, allowed, seed, tail)
	}
	startCaddy(t, config("", "http://127.0.0.1:9909", ""))
	url := "http://127.0.0.1:9908"
	setBackends(t, url, "http://127.0.0.1:9909", "http://127.0.0.2:9910")
	workers := func() []string { t.Helper(); return listWorkers(t, url) }
	both := []string{"http://127.0.0.1:9909", "http://127.0.0.2:9910"}
	if got := workers(); !slices.Equal(got, both) {
		t.Fatalf("set before the reload: %v, want %v", got, both)
	}

	loadRefused(t, config("allowed_backends 127.0.0.1/32", "http://127.0.0.1:9909", failingModule), "", "")
	if got := workers(); !slices.Equal(got, both) {
		t.Fatalf("a refused config changed the live set: %v, want %v", got, both)
	}

	status, body := load(t, adapt(t, config("allowed_backends 127.0.0.1/32", "http://127.0.0.2:9910", "")))
	if status == 200 || !strings.Contains(body, "allowed_backends") {
		t.Fatalf("a seed outside allowed_backends: %d %s, want refused naming allowed_backends", status, body)
	}
	if got := workers(); !slices.Equal(got, both) {
		t.Fatalf("a refused config changed the live set: %v, want %v", got, both)
	}

	reload(t, config("allowed_backends 127.0.0.1/32", "http://127.0.0.1:9909", ""))
	if got, want := workers(), []string{"http://127.0.0.1:9909"}; !slices.Equal(got, want) {
		t.Fatalf("after a reload that narrowed allowed_backends to 127.0.0.1/32 the set is %v, want %v", got, want)
	}
}
