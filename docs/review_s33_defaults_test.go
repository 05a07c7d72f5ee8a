package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/caddymodule"
	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/flow/redisgate"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/kvevents"
	"github.com/sluice-router/sluice/lb/loadaware"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/qll"
	"github.com/sluice-router/sluice/lb/redisleast"
	"github.com/sluice-router/sluice/sim"
)

// optionDefaults are the default cells of a page's option tables: one map
// (option → cell) per table, in the page's order.
func optionDefaults(t *testing.T, path string) []map[string]string {
	t.Helper()
	var tables []map[string]string
	optionTableRows(t, path, defaultsTable, func(table, _ int, cells []string) {
		for len(tables) <= table {
			tables = append(tables, map[string]string{})
		}
		if len(cells) < 4 {
			return
		}
		if m := cellOption.FindAllStringSubmatch(cells[1], -1); len(m) == 1 {
			tables[table][m[0][1]] = strings.TrimSpace(cells[2])
		}
	})
	return tables
}

// defaultsTable is the header of an option table with defaults.
var defaultsTable = regexp.MustCompile(`^\|\s*option\s*\|\s*default\s*\|`)

// codeSpan is the first `…` of a cell.
var codeSpan = regexp.MustCompile("`([^`]+)`")

// sameDefault reports whether a documented default cell states want: its
// first code span read as want's kind (a Caddy duration, a number or a
// quantity, a string).
func sameDefault(cell string, want any) (bool, string) {
	m := codeSpan.FindStringSubmatch(cell)
	if m == nil {
		return false, "no `value` in the cell"
	}
	doc := m[1]
	switch w := want.(type) {
	case time.Duration:
		d, err := caddy.ParseDuration(doc)
		if err != nil {
			return false, fmt.Sprintf("%q is not a duration", doc)
		}
		return d == w, d.String()
	case string:
		return doc == w, doc
	default:
		x, err := strconv.ParseFloat(doc, 64)
		if err != nil {
			q, qerr := flow.ParseQuantity(doc)
			if qerr != nil {
				return false, fmt.Sprintf("%q is not a number", doc)
			}
			x = float64(q)
		}
		var wf float64
		switch w := w.(type) {
		case int:
			wf = float64(w)
		case int64:
			wf = float64(w)
		case float64:
			wf = w
		default:
			panic(fmt.Sprintf("sameDefault: %T", want))
		}
		return x == wf, strconv.FormatFloat(x, 'g', -1, 64)
	}
}

// TestDocumentedDefaultsAreApplied: the default an option table states is
// the one the module's configuration applies to a zero value (the
// WithDefaults of lb/*, flow, flow/redisgate, lb/kvevents and
// lb/modelmetrics, and the exported defaults of caddymodule and sim).
func TestDocumentedDefaultsAreApplied(t *testing.T) {
	q := qll.Config{}.WithDefaults()
	ca := cacheaware.Config{}.WithDefaults()
	kv := kvevents.EngineConfig{}.WithDefaults()
	la := loadaware.Config{}.WithDefaults()
	mm := modelmetrics.Config{}.WithDefaults()
	rl := redisleast.Config{}.WithDefaults()
	fc := flow.Config{Bands: []flow.BandConfig{{}}}.WithDefaults()
	band := fc.Bands[0]
	gate := redisgate.Config{}.WithDefaults()
	type want struct {
		table  int // which option table of the page
		option string
		value  any
	}
	pages := map[string][]want{
		"queued_least_latency.md": {
			{0, "ewma_alpha", q.EWMAAlpha}, {0, "queue_max_size", q.QueueMaxSize},
			{0, "queue_timeout", q.QueueTimeout}, {0, "max_concurrency", q.MaxConcurrency},
			{0, "max_fails", q.MaxFails}, {0, "fail_duration", q.FailDuration},
			{0, "metrics_interval", q.EngineMetrics.Interval}, {0, "metrics_path", q.EngineMetrics.Path},
		},
		"cache_aware.md": {
			{0, "cache_threshold", ca.CacheThreshold}, {0, "balance_abs_threshold", ca.BalanceAbsThreshold},
			{0, "balance_rel_threshold", ca.BalanceRelThreshold}, {0, "max_tree_size", ca.MaxTreeSize},
			{0, "eviction_interval", ca.EvictionInterval}, {0, "miss_policy", ca.MissPolicy},
			{0, "max_body_bytes", caddymodule.DefaultMaxBodyBytes},
			{0, "max_fails", q.MaxFails}, {0, "fail_duration", q.FailDuration},
			{0, "kv_events_tokenize_timeout", kv.Timeout}, {0, "kv_events_tokenize_cache", kv.MaxBytes},
			{0, "kv_events_tokenize_concurrency", kv.Concurrency},
		},
		"load_aware.md": {
			{0, "threshold", la.Threshold}, {0, "request_timeout", la.RequestTimeout},
			{0, "lru_size", la.LRUSize}, {0, "hot_prefix_chars", la.HotPrefixChars},
			{0, "max_num_endpoints", la.MaxNumEndpoints}, {0, "adaptive_step", la.AdaptiveStep},
			{0, "metrics_interval", mm.Interval}, {0, "metrics_staleness", mm.Staleness},
			{0, "metrics_path", mm.Path}, {0, "max_body_bytes", caddymodule.DefaultMaxBodyBytes},
		},
		"global_redis_least.md": {
			{0, "dial_timeout", rl.DialTimeout}, {0, "read_timeout", rl.ReadTimeout},
			{0, "max_inflight", rl.MaxInflight}, {0, "queue_timeout", rl.QueueTimeout},
			{0, "call_rate", rl.CallRate}, {0, "lease_ttl", rl.LeaseTTL},
			{0, "breaker_failures", rl.BreakerFailures}, {0, "breaker_backoff", rl.BreakerBackoff},
			{0, "max_fails", rl.MaxFails}, {0, "fail_duration", rl.FailDuration},
		},
		"flow_control.md": {
			{0, "max_requests", fc.MaxRequests}, {0, "default_ttl", fc.DefaultTTL},
			{0, "max_concurrency", fc.Detector.MaxConcurrency}, {0, "concurrency_mode", fc.Detector.ConcurrencyMode},
			{0, "max_token_concurrency", fc.Detector.MaxTokenConcurrency}, {0, "headroom", fc.Detector.Headroom},
			{0, "queue_depth_threshold", fc.Detector.QueueDepthThreshold}, {0, "kv_cache_threshold", fc.Detector.KVCacheThreshold},
			{0, "metrics_interval", mm.Interval}, {0, "max_body_bytes", caddymodule.DefaultMaxBodyBytes},
			{1, "max_bytes", band.MaxBytes},
			{1, "fairness", band.Fairness}, {1, "ordering", band.Ordering},
			{2, "lease_ttl", gate.LeaseTTL}, {2, "fallback_share", gate.FallbackShare},
		},
		"inference_sim.md": {
			{0, "name", sim.DefaultName}, {0, "model", sim.DefaultModel},
			{0, "kv_blocks", sim.DefaultEngineKVBlocks}, {0, "block_tokens", sim.DefaultEngineBlockTokens},
			{0, "max_batch_tokens", sim.DefaultEngineMaxBatchTokens}, {0, "max_tokens", sim.DefaultMaxTokens},
			{0, "max_body", sim.DefaultMaxBodyBytes}, {0, "error_status", sim.DefaultErrorStatus},
		},
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for page, wants := range pages {
		tables := optionDefaults(t, filepath.Join(root, "docs", "policies", page))
		for _, w := range wants {
			if w.table >= len(tables) {
				t.Errorf("docs/policies/%s: no option table #%d (found %d)", page, w.table+1, len(tables))
				continue
			}
			cell, ok := tables[w.table][w.option]
			if !ok {
				t.Errorf("docs/policies/%s: option table #%d has no row for `%s`", page, w.table+1, w.option)
				continue
			}
			checked++
			if same, got := sameDefault(cell, w.value); !same {
				t.Errorf("docs/policies/%s: `%s` defaults to %v in the code; the table says %s (read as %s)", page, w.option, w.value, cell, got)
			}
		}
	}
	if checked < 60 {
		t.Fatalf("checked %d documented defaults, want at least 60", checked)
	}
}

// TestLoadAwareScorerTableIsComplete: the scorer table of load_aware.md
// lists exactly the scorers the policy knows, and the default scorers
// and presets it states are the code's.
func TestLoadAwareScorerTableIsComplete(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("policies", "load_aware.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "| scorer | input |"):
			in = true
		case !strings.HasPrefix(line, "|"):
			in = false
		case in:
			if m := regexp.MustCompile("^\\| `([a-z_]+)`").FindStringSubmatch(line); m != nil {
				documented[m[1]] = true
			}
		}
	}
	for _, s := range loadaware.AllScorers {
		if !documented[s] {
			t.Errorf("docs/policies/load_aware.md: the scorer table has no row for %s", s)
		}
		delete(documented, s)
	}
	for s := range documented {
		t.Errorf("docs/policies/load_aware.md: the scorer table lists %s, which load_aware does not know", s)
	}
	var def []string
	for s, w := range loadaware.DefaultWeights() {
		if w != 1 {
			t.Errorf("default scorer %s has weight %v; the page says the defaults are at 1", s, w)
		}
		def = append(def, s)
	}
	sort.Strings(def)
	if want := "`" + strings.Join(def, "` + `") + "` at 1"; !strings.Contains(string(data), want) {
		t.Errorf("docs/policies/load_aware.md does not state the default scorers as %q", want)
	}
	for _, p := range loadaware.Presets {
		if !strings.Contains(string(data), "`preset "+p+"`") {
			t.Errorf("docs/policies/load_aware.md does not document the preset %s", p)
		}
	}
}
