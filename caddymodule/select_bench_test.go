package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb/loadaware"
)

// benchWriter is a ResponseWriter that keeps nothing but its header.
type benchWriter struct{ h http.Header }

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *benchWriter) WriteHeader(int)             {}

// BenchmarkSelect is the per-request cost of each policy's Select on a tiny
// completion over 4 static upstreams, the attempt's end included (the
// request context ends, as when the handler chain returns), against
// Caddy's round_robin on the same requests. The request carries what
// Caddy's server and reverse_proxy put in its variables and placeholders
// (a vars map that grows past 8 entries costs ~1 µs and 4 allocations):
//
//	go test -run '^$' -bench Select -benchmem ./caddymodule/
func BenchmarkSelect(b *testing.B) {
	dir := b.TempDir()
	b.Setenv("XDG_DATA_HOME", dir)
	b.Setenv("XDG_CONFIG_HOME", dir)
	cctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	pool := make(reverseproxy.UpstreamPool, 4)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Dial: fmt.Sprintf("127.0.0.1:%d", 19100+i), Host: new(reverseproxy.Host)}
	}
	type sel interface {
		Select(reverseproxy.UpstreamPool, *http.Request, http.ResponseWriter) *reverseproxy.Upstream
	}
	policies := []struct {
		name string
		p    sel
	}{
		{"caddy_round_robin", &reverseproxy.RoundRobinSelection{}},
		{"queued_least_latency", &QueuedLeastLatency{Pool: "bench-qll"}},
		{"cache_aware", &CacheAware{Pool: "bench-ca"}},
		{"load_aware", &LoadAware{Pool: "bench-la"}},
	}
	for _, pc := range policies {
		if pv, ok := pc.p.(caddy.Provisioner); ok {
			if err := pv.Provision(cctx); err != nil {
				b.Fatalf("%s: %v", pc.name, err)
			}
		}
		// A context without a config logs at debug level; Caddy's default
		// is info, where load_aware's per-pick score log is off.
		if la, ok := pc.p.(*LoadAware); ok {
			quietScores(la.state.picker.(*loadaware.Picker))
		}
		// Likewise the line per routing decision.
		switch p := pc.p.(type) {
		case *QueuedLeastLatency:
			p.log = atInfo(p.log)
		case *CacheAware:
			p.log = atInfo(p.log)
		case *LoadAware:
			p.log = atInfo(p.log)
		}
		start := any(time.Now())
		proxyInfo := any(struct{ port int }{})
		upstreamKeys := []string{"http.reverse_proxy.upstream.address", "http.reverse_proxy.upstream.hostport",
			"http.reverse_proxy.upstream.host", "http.reverse_proxy.upstream.port", "http.reverse_proxy.upstream.requests",
			"http.reverse_proxy.upstream.max_requests", "http.reverse_proxy.upstream.fails"}
		b.Run(pc.name, func(b *testing.B) {
			w := &benchWriter{h: http.Header{}}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				repl := caddy.NewReplacer()
				ctx, end := context.WithCancel(context.Background())
				ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, repl)
				// The variables Caddy's server sets on every request
				// before its handlers run.
				ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{
					caddyhttp.TrustedProxyVarKey: false, caddyhttp.ClientIPVarKey: "127.0.0.1", "start_time": start,
				})
				r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/v1/completions",
					strings.NewReader(`{"prompt":"x","max_tokens":1}`))
				up := pc.p.Select(pool, r, w)
				if up == nil {
					b.Fatal("no upstream")
				}
				// What reverse_proxy sets once it has the upstream.
				caddyhttp.SetVar(ctx, "reverse_proxy.proxy_protocol_info", proxyInfo)
				for _, k := range upstreamKeys {
					repl.Set(k, up.Dial)
				}
				end()
			}
		})
		if cu, ok := pc.p.(caddy.CleanerUpper); ok {
			cu.Cleanup()
		}
	}
}

// atInfo is log at Caddy's default level.
func atInfo(log *zap.Logger) *zap.Logger { return log.WithOptions(zap.IncreaseLevel(zap.InfoLevel)) }

// quietScores makes the score log what it is at info level.
func quietScores(pk *loadaware.Picker) {
	pk.Explain = func(e loadaware.Explanation) { logScores(zap.NewNop(), "bench", e) }
	pk.Explaining = func() bool { return false }
}
