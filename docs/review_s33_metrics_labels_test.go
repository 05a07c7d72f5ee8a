package docs

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/flow/redisgate"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/cacheaware/share"
	"github.com/sluice-router/sluice/lb/kvevents"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/qll"
	"github.com/sluice-router/sluice/lb/redisleast"
)

// describedLabels are the label names of every metric the collectors
// caddymodule registers (one per module state kind: see its
// registerCollectors calls) describe, read from their Desc.
func describedLabels(t *testing.T) map[string][]string {
	t.Helper()
	collectors := []prometheus.Collector{
		qll.NewCollector(func() map[string]*qll.State { return nil }),
		cacheaware.NewCollector(func() map[string]*cacheaware.Router { return nil }),
		share.NewCollector(func() map[string]*share.Sharer { return nil }),
		kvevents.NewCollector(func() map[string][]kvevents.Source { return nil }),
		flow.NewCollector(func() map[string]*flow.Controller { return nil }),
		redisgate.NewCollector(func() map[string]*redisgate.Gate { return nil }),
		redisleast.NewCollector(func() map[string]*redisleast.Store { return nil }),
		modelmetrics.NewCollector(func() map[string]*modelmetrics.Scraper { return nil }),
	}
	ch := make(chan *prometheus.Desc, 512)
	go func() {
		for _, c := range collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	labels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		s := d.String()
		n, l := name.FindStringSubmatch(s), labels.FindStringSubmatch(s)
		if n == nil || l == nil {
			t.Fatalf("cannot read a Desc: %s", s)
		}
		var ls []string
		for _, x := range strings.Split(l[1], ",") {
			if x = strings.TrimSpace(x); x != "" {
				ls = append(ls, x)
			}
		}
		sort.Strings(ls)
		out[n[1]] = ls
	}
	return out
}

// TestMetricsDocLabelsMatchTheCollectors: the labels column of every row
// of docs/metrics.md names exactly the labels the metric is described
// with (values in parentheses aside; "—": none).
func TestMetricsDocLabelsMatchTheCollectors(t *testing.T) {
	described := describedLabels(t)
	known := registered(t)
	for n := range known {
		if _, ok := described[n]; !ok {
			t.Errorf("metric %s is registered by caddymodule, but no collector this test builds describes it: add its collector to describedLabels", n)
		}
	}
	data, err := os.ReadFile("metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	paren := regexp.MustCompile(`\([^)]*\)`)
	rows := 0
	for i, line := range strings.Split(string(data), "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 6 {
			continue
		}
		m := codeSpan.FindStringSubmatch(cells[1])
		if m == nil || !metricName.MatchString(m[1]) {
			continue
		}
		want, ok := described[m[1]]
		if !ok {
			continue // TestMetricsDocMatchesRegisteredMetrics reports it
		}
		rows++
		var doc []string
		if c := strings.TrimSpace(paren.ReplaceAllString(cells[3], "")); c != "—" && c != "" {
			for _, x := range strings.Split(c, ",") {
				doc = append(doc, strings.Trim(strings.TrimSpace(x), "`"))
			}
		}
		sort.Strings(doc)
		if strings.Join(doc, ",") != strings.Join(want, ",") {
			t.Errorf("docs/metrics.md:%d: %s has labels %v, the table says %v", i+1, m[1], want, doc)
		}
	}
	if rows < len(known)/2 {
		t.Fatalf("checked the labels of %d rows of docs/metrics.md for %d metrics: the table parse broke", rows, len(known))
	}
}
