package docs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/caddymodule"
)

// metricName matches the metric names Sluice registers (its own and the
// reference names it keeps) in markdown or PromQL.
var metricName = regexp.MustCompile(`\b(?:sluice|custom_router|inference_extension)_[a-z0-9_]*[a-z0-9]\b`)

// registered is the set of metric names Sluice's collectors describe.
func registered(t *testing.T) map[string]bool {
	t.Helper()
	names := caddymodule.MetricNames()
	if len(names) < 40 {
		t.Fatalf("caddymodule.MetricNames() gave %d names: %v", len(names), names)
	}
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	return set
}

// seriesName maps a series name to the metric that exposes it: a
// histogram's _bucket, _sum and _count series belong to its base name.
func seriesName(name string, known map[string]bool) string {
	if known[name] {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && known[base] {
			return base
		}
	}
	return name
}

// TestMetricsDocMatchesRegisteredMetrics: docs/metrics.md lists exactly
// the metrics Sluice registers.
func TestMetricsDocMatchesRegisteredMetrics(t *testing.T) {
	known := registered(t)
	data, err := os.ReadFile("metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z0-9_]+)`").FindAllStringSubmatch(string(data), -1) {
		if metricName.MatchString(m[1]) && metricName.FindString(m[1]) == m[1] {
			documented[m[1]] = true
		}
	}
	for n := range known {
		if !documented[n] {
			t.Errorf("metric %s is registered but not in docs/metrics.md", n)
		}
	}
	for n := range documented {
		if !known[seriesName(n, known)] {
			t.Errorf("docs/metrics.md lists %s, which Sluice does not register", n)
		}
	}
}

// TestGrafanaDashboardUsesRealMetrics: every metric name in the
// dashboard's PromQL (panel targets and template queries) is one Sluice
// registers, and the dashboard covers what an operator watches.
func TestGrafanaDashboardUsesRealMetrics(t *testing.T) {
	known := registered(t)
	data, err := os.ReadFile(filepath.Join("grafana", "sluice-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string          `json:"title"`
		UID    string          `json:"uid"`
		Panels []dashboardItem `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("docs/grafana/sluice-dashboard.json: %v", err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("dashboard without title or uid")
	}
	var exprs []string
	var walk func([]dashboardItem)
	walk = func(items []dashboardItem) {
		for _, p := range items {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q: a target without expr", p.Title)
				}
				exprs = append(exprs, tg.Expr)
				if err := balanced(tg.Expr); err != "" {
					t.Errorf("panel %q: %s in %s", p.Title, err, tg.Expr)
				}
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	if len(exprs) < 20 {
		t.Fatalf("found %d PromQL expressions in the dashboard, want at least 20", len(exprs))
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			base := seriesName(n, known)
			if !known[base] {
				t.Errorf("the dashboard queries %s, which Sluice does not register (in %s)", n, e)
			}
			used[base] = true
		}
	}
	// What the dashboard is for: queue depth and wait, refusals, replicas'
	// in-flight and latency, prefix hits, bands and tenants, Redis health.
	for _, must := range []string{
		"custom_router_queue_depth", "sluice_queue_wait_seconds",
		"custom_router_requests_evicted_total", "custom_router_requests_timeout_total", "sluice_requests_refused_total",
		"sluice_redis_shed_total", "sluice_flow_control_requests_total",
		"custom_router_backend_inflight_requests", "custom_router_backend_ewma_latency_seconds",
		"sluice_cache_aware_decisions_total",
		"inference_extension_flow_control_queue_size", "inference_extension_flow_control_request_queue_duration_seconds",
		"sluice_redis_breaker_open", "sluice_redis_errors_total", "sluice_flow_control_global_fallback",
	} {
		if !used[must] {
			t.Errorf("the dashboard does not chart %s", must)
		}
	}
	var unused []string
	for n := range known {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	t.Logf("%d queries over %d of %d metrics; not charted: %v", len(exprs), len(used), len(known), unused)
}

type dashboardItem struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardItem `json:"panels"`
}

// balanced reports unbalanced brackets or quotes in a PromQL expression.
func balanced(expr string) string {
	var stack []rune
	inQuote := false
	for _, c := range expr {
		switch {
		case c == '"':
			inQuote = !inQuote
		case inQuote:
		case c == '(' || c == '{' || c == '[':
			stack = append(stack, c)
		case c == ')' || c == '}' || c == ']':
			open := map[rune]rune{')': '(', '}': '{', ']': '['}[c]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				return "unbalanced " + string(c)
			}
			stack = stack[:len(stack)-1]
		}
	}
	if inQuote {
		return "unclosed quote"
	}
	if len(stack) > 0 {
		return "unclosed " + string(stack[len(stack)-1])
	}
	return ""
}
