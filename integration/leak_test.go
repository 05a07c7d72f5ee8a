package integration

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Loading a config that uses every Sluice module, reloading it, then
// unloading it must leave no goroutine behind: scrapers, eviction loops,
// lease renewers and state logs all belong to a state that is destroyed
// when the last config using it goes away.
func TestNoGoroutineLeftAfterTheModulesAreUnloaded(t *testing.T) {
	addr := testRedis(t)
	minimal := globals + "\n:9890 {\n\trespond \"ok\"\n}\n"
	// Caddy skips a /load of an unchanged config: vary one value so every
	// iteration really provisions new module instances.
	full := func(i int) string {
		return globals + fmt.Sprintf(`
:9890 {
	respond "ok"
}
:9891 {
	custom_router leak
	flow_control leak {
		detector utilization
		metrics_interval 100ms
	}
	reverse_proxy {
		dynamic custom_router leak
		lb_policy queued_least_latency {
			pool leak
			state_log_interval %dms
		}
	}
}
:9892 {
	reverse_proxy 127.0.0.1:9895 {
		lb_policy cache_aware {
			pool leak-ca
			kv_events tcp://127.0.0.1:5566
			kv_events_tokenizer llmd_sim
			kv_events_fresh %ds
		}
	}
}
:9893 {
	reverse_proxy 127.0.0.1:9895 {
		lb_policy load_aware {
			pool leak-la
			metrics_interval 100ms
		}
	}
}
:9894 {
	reverse_proxy 127.0.0.1:9895 {
		lb_policy global_redis_least {
			pool leak-redis
			redis %s
			key_prefix leaktest
		}
	}
}
`, 1000+i, 30+i, addr) + sims(9895)
	}
	startCaddy(t, minimal)
	settle := func() int {
		n := 0
		for i := 0; i < 50; i++ {
			runtime.GC()
			n = runtime.NumGoroutine()
			if i > 5 && n <= baselineGoroutines+3 {
				break
			}
			sleepMS(100)
		}
		return n
	}
	baselineGoroutines = runtime.NumGoroutine()
	for i := 0; i < 8; i++ { // a leak of one goroutine per load shows as 8
		reload(t, full(i))
		setBackends(t, "http://127.0.0.1:9891", "http://127.0.0.1:9895")
		if o := complete("http://127.0.0.1:9892"); o.status != 200 {
			t.Fatalf("cache_aware site: %+v", o)
		}
		if o := complete("http://127.0.0.1:9893"); o.status != 200 {
			t.Fatalf("load_aware site: %+v", o)
		}
		if o := complete("http://127.0.0.1:9894"); o.status != 200 {
			t.Fatalf("global_redis_least site: %+v", o)
		}
	}
	reload(t, minimal)
	client.CloseIdleConnections()
	n := settle()
	t.Logf("goroutines: %d before loading the modules, %d after unloading", baselineGoroutines, n)
	if n > baselineGoroutines+3 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("goroutines: %d after unloading, %d before loading the modules\n%s", n, baselineGoroutines, buf)
	}
}

var baselineGoroutines int

func sleepMS(ms int) { time.Sleep(time.Duration(ms) * time.Millisecond) }
