package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// decisionSite is a site that shows Sluice's routing decision the two
// ways docs/api.md#routing-decisions recommends: response headers (with
// `defer`, so they are set once the decision is made) and access-log
// fields (log_append, evaluated when the log is written).
func decisionSite(port int, logFile, body string) string {
	return fmt.Sprintf(`
:%d {
	log {
		output file %s
		format json
	}
	log_append sluice_replica {http.vars.sluice.replica}
	log_append sluice_reason {http.vars.sluice.reason}
	log_append sluice_queue_wait {http.vars.sluice.queue_wait}
	log_append sluice_tenant {http.vars.sluice.tenant}
	log_append sluice_band {http.vars.sluice.band}
	log_append sluice_attempt {http.vars.sluice.attempt}
	header {
		defer
		X-Sluice-Replica {http.vars.sluice.replica}
		X-Sluice-Reason {http.vars.sluice.reason}
		X-Sluice-Queue-Wait {http.vars.sluice.queue_wait}
		X-Sluice-Tenant {http.vars.sluice.tenant}
		X-Sluice-Band {http.vars.sluice.band}
	}
%s
}
`, port, logFile, body)
}

// decisionGlobals are the tests' global options plus the docs' debug
// log of Sluice's decisions, written to debugLog.
func decisionGlobals(debugLog string) string {
	return fmt.Sprintf(`{
	admin localhost:2999
	http_port 9080
	https_port 9443
	persist_config off
	log sluice_decisions {
		output file %s
		format json
		include http.reverse_proxy.selection_policies http.handlers.flow_control
		level DEBUG
	}
}
`, debugLog)
}

// decision is what one request's headers said.
type decision struct {
	status                              int
	replica, reason, wait, tenant, band string
}

func decide(t *testing.T, url, prompt string, hdr map[string]string) decision {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions",
		strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":4}`, prompt)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := resp.Header
	return decision{resp.StatusCode, h.Get("X-Sluice-Replica"), h.Get("X-Sluice-Reason"),
		h.Get("X-Sluice-Queue-Wait"), h.Get("X-Sluice-Tenant"), h.Get("X-Sluice-Band")}
}

// accessLog returns the access log's entries of completions once it has
// n.
func accessLog(t *testing.T, file string, n int) []map[string]any {
	t.Helper()
	return logEntries(t, file, n, func(e map[string]any) bool {
		req, _ := e["request"].(map[string]any)
		return e["msg"] == "handled request" && req["uri"] == "/v1/completions"
	})
}

// logEntries returns the JSON log's entries that keep, once it has n.
func logEntries(t *testing.T, file string, n int, keep func(map[string]any) bool) []map[string]any {
	t.Helper()
	var entries []map[string]any
	eventually(t, fmt.Sprintf("%d log entries in %s", n, file), func() bool {
		f, err := os.Open(file)
		if err != nil {
			return false
		}
		defer f.Close()
		entries = entries[:0]
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e map[string]any
			if json.Unmarshal(sc.Bytes(), &e) == nil && keep(e) {
				entries = append(entries, e)
			}
		}
		return len(entries) >= n
	})
	return entries
}

// The chosen replica, the reason, the queue wait, the tenant and the band
// reach a response header and the access log, for flow_control in front
// of queued_least_latency, for cache_aware, and for a refusal; and the
// debug log of decisions has one line per decision.
func TestRoutingDecisionsReachHeadersAndTheAccessLog(t *testing.T) {
	dir := t.TempDir()
	flowLog, cacheLog, debugLog := filepath.Join(dir, "flow.log"), filepath.Join(dir, "cache.log"), filepath.Join(dir, "debug.log")
	startCaddy(t, decisionGlobals(debugLog)+decisionSite(9170, flowLog, `
	custom_router dec-qll
	flow_control {
		pool dec-qll
		trusted_sources 127.0.0.1
		objective premium 10
		band 10 {
			name interactive
		}
	}
	reverse_proxy {
		dynamic custom_router dec-qll
		lb_policy queued_least_latency {
			pool dec-qll
		}
	}`)+decisionSite(9173, cacheLog, `
	reverse_proxy 127.0.0.1:9174 127.0.0.1:9175 {
		lb_policy cache_aware {
			pool dec-cache
		}
	}`)+sims(9171, 9174, 9175))
	flowURL, cacheURL := "http://127.0.0.1:9170", "http://127.0.0.1:9173"
	tenant := map[string]string{"X-Gateway-Inference-Fairness-Id": "acme", "X-Gateway-Inference-Objective": "premium"}

	// A refusal: no backends. flow_control admitted it (tenant, band), the
	// policy refused it. (A pool's set outlives configs in this process:
	// an earlier run's, under -count, is cleared first.)
	setBackends(t, flowURL)
	got := decide(t, flowURL, "hello", tenant)
	if got.status != 503 || got.replica != "" || got.reason != "refused:no_backends" || got.tenant != "acme" || got.band != "interactive" {
		t.Fatalf("refused request: %+v", got)
	}
	setBackends(t, flowURL, "http://127.0.0.1:9171")
	got = decide(t, flowURL, "hello", tenant)
	if got.status != 200 || got.replica != "127.0.0.1:9171" || got.reason != "least_latency" ||
		got.tenant != "acme" || got.band != "interactive" || got.wait == "" {
		t.Fatalf("flow_control + queued_least_latency: %+v", got)
	}
	// An untrusted tenant cannot be asserted: this one comes from a
	// trusted source, so a client without the headers is the shared flow.
	got = decide(t, flowURL, "hello", nil)
	if got.status != 200 || got.tenant != "" || got.band != "priority-0" {
		t.Fatalf("request without flow headers: %+v", got)
	}

	// A prompt of this run's own: the pool's prefix tree outlives configs
	// in this process (an earlier run's, under -count, matched it).
	prompt := fmt.Sprintf("run %d: ", time.Now().UnixNano()) + strings.Repeat("a long shared system prompt ", 8)
	first := decide(t, cacheURL, prompt+"first question", nil)
	second := decide(t, cacheURL, prompt+"second question", nil)
	if first.status != 200 || first.reason != "least_load" || second.status != 200 ||
		second.reason != "prefix_match" || second.replica != first.replica || second.tenant != "" {
		t.Fatalf("cache_aware: first %+v, second %+v", first, second)
	}

	want := []struct{ replica, reason, tenant, band string }{
		{"", "refused:no_backends", "acme", "interactive"},
		{"127.0.0.1:9171", "least_latency", "acme", "interactive"},
		{"127.0.0.1:9171", "least_latency", "", "priority-0"},
	}
	for i, e := range accessLog(t, flowLog, len(want)) {
		w := want[i]
		replica, _ := e["sluice_replica"].(string) // null when refused
		wait, isNumber := e["sluice_queue_wait"].(float64)
		if replica != w.replica || e["sluice_reason"] != w.reason || e["sluice_tenant"] != w.tenant ||
			e["sluice_band"] != w.band || !isNumber || wait < 0 || e["sluice_attempt"] != float64(1) {
			t.Fatalf("flow access-log entry %d: %v, want %+v and queue_wait in seconds", i, e, w)
		}
	}
	entries := accessLog(t, cacheLog, 2)
	for i, reason := range []string{"least_load", "prefix_match"} {
		if e := entries[i]; e["sluice_reason"] != reason || e["sluice_replica"] != first.replica {
			t.Fatalf("cache access-log entry %d: %v, want %s on %s", i, e, reason, first.replica)
		}
	}

	lines := logEntries(t, debugLog, 5, func(e map[string]any) bool { return e["msg"] == "routing decision" })
	for i, w := range []struct{ logger, reason, tenant string }{
		{"queued_least_latency", "refused:no_backends", "acme"},
		{"queued_least_latency", "least_latency", "acme"},
		{"queued_least_latency", "least_latency", ""},
		{"cache_aware", "least_load", ""},
		{"cache_aware", "prefix_match", ""},
	} {
		e := lines[i]
		if e["logger"] != "http.reverse_proxy.selection_policies."+w.logger || e["reason"] != w.reason ||
			e["tenant"] != w.tenant || e["attempt"] != float64(1) || e["pool"] == nil || e["queue_wait"] == nil {
			t.Fatalf("debug line %d: %v, want %+v", i, e, w)
		}
	}
}
