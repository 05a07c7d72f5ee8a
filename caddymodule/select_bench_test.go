package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
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
// completion over 4 static upstreams, the attempt's end included, against
// Caddy's round_robin on the same requests. The attempt ends as it does
// behind a replica that answers: the transport reports the first response
// byte and the body read to its end (the trace Select attached), then
// the request context ends, as when the handler chain returns. The request carries what
// Caddy's server and reverse_proxy put in its variables and placeholders
// (a vars map that grows past 8 entries costs ~1 µs and 4 allocations):
//
//	go test -run '^$' -bench Select -benchmem ./caddymodule/
func BenchmarkSelect(b *testing.B) {
	cctx := provisionContext(b)
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
		responseKeys := []string{keyStatus, "http.reverse_proxy.status_text", "http.reverse_proxy.upstream.latency",
			"http.reverse_proxy.upstream.latency_ms", "http.reverse_proxy.header.Content-Type",
			"http.reverse_proxy.header.Content-Length", "http.reverse_proxy.header.Date",
			"http.reverse_proxy.header.X-Sim-Replica", "http.reverse_proxy.header.X-Sim-Seq"}
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
				// What the transport reports, and reverse_proxy sets,
				// once the replica answers (Caddy's Replacer holds ~20
				// entries by the request's end, so Sluice's one does not
				// make its map grow; here too).
				tr := httptrace.ContextClientTrace(r.Context())
				// The transport's own context for the round trip
				// (net/http's Transport.roundTrip), which it waits on,
				// cancelled once the response is done.
				tctx, tcancel := context.WithCancelCause(r.Context())
				_ = tctx.Done()
				if tr != nil && tr.GetConn != nil {
					tr.GetConn(up.Dial)
				}
				if tr != nil && tr.WroteRequest != nil {
					tr.WroteRequest(httptrace.WroteRequestInfo{})
				}
				if tr != nil && tr.GotFirstResponseByte != nil {
					tr.GotFirstResponseByte()
				}
				for _, k := range responseKeys {
					repl.Set(k, 1)
				}
				if tr != nil && tr.PutIdleConn != nil {
					tr.PutIdleConn(nil)
				}
				tcancel(nil)
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

// provisionContext is a Caddy context to provision modules in, with its
// data and config directories in a temporary one; it ends with tb.
func provisionContext(tb testing.TB) caddy.Context {
	dir := tb.TempDir()
	tb.Setenv("XDG_DATA_HOME", dir)
	tb.Setenv("XDG_CONFIG_HOME", dir)
	cctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	return cctx
}
