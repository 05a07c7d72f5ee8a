package integration

import (
	"fmt"
	"path/filepath"
	"testing"
)

// A pool's state outlives a reload; its own log lines (queued_least_
// latency's state line, load_aware's debug scores) must follow the new
// config's logging like every other setting. They kept the logger of the
// config that first built the state: a reload that moved the log to
// another file, or turned on debug, never showed them.
func TestAReloadAppliesLoggingToThePoolsOwnLines(t *testing.T) {
	dir := t.TempDir()
	config := func(logFile, level string) string {
		return fmt.Sprintf(`{
	admin localhost:2999
	http_port 9080
	https_port 9443
	persist_config off
	log sluice_pools {
		output file %s
		format json
		include http.reverse_proxy.selection_policies
		level %s
	}
}
:9917 {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:9919 {
		lb_policy queued_least_latency {
			pool log-reload-qll
			state_log_interval 100ms
		}
	}
}
:9918 {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:9919 {
		lb_policy load_aware {
			pool log-reload-la
		}
	}
}
`, logFile, level) + sims(9919)
	}
	first, second := filepath.Join(dir, "first.log"), filepath.Join(dir, "second.log")
	startCaddy(t, config(first, "INFO"))
	stateLine := func(e map[string]any) bool { return e["msg"] == "queued_least_latency state" }
	logEntries(t, first, 1, stateLine)

	reload(t, config(second, "DEBUG"))
	if o := complete("http://127.0.0.1:9918"); o.status != 200 {
		t.Fatalf("load_aware site: %+v", o)
	}
	logEntries(t, second, 1, stateLine)
	logEntries(t, second, 1, func(e map[string]any) bool { return e["msg"] == "load_aware scores" })
}
