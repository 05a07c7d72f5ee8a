package integration

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkProxyOverhead compares tiny requests sent straight to a replica,
// through Caddy's round_robin, and through Sluice's queued_least_latency
// (with the custom_router handler and the dynamic custom_router source, as
// users deploy it). Compare ns/op ratios from one run:
//
//	go test -run '^$' -bench ProxyOverhead -benchtime 3s -count 3 ./integration/
func BenchmarkProxyOverhead(b *testing.B) {
	startCaddy(b, globals+`
:9301 {
	bind 127.0.0.1
	respond "ok"
}

:9302 {
	reverse_proxy 127.0.0.1:9301 {
		lb_policy round_robin
	}
}

:9303 {
	custom_router overhead
	reverse_proxy {
		dynamic custom_router overhead
		lb_policy queued_least_latency {
			pool overhead
		}
	}
}

:9304 {
	reverse_proxy 127.0.0.1:9301 {
		lb_policy cache_aware {
			pool overhead-ca
		}
	}
}

:9305 {
	reverse_proxy 127.0.0.1:9301 {
		lb_policy load_aware {
			pool overhead-la
		}
	}
}
`)
	setBackends(b, "http://127.0.0.1:9303", "http://127.0.0.1:9301")
	tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for _, target := range []struct{ name, url string }{
		{"direct", "http://127.0.0.1:9301/"},
		{"caddy_round_robin", "http://127.0.0.1:9302/"},
		{"sluice_queued_least_latency", "http://127.0.0.1:9303/"},
		{"sluice_cache_aware", "http://127.0.0.1:9304/"},
		{"sluice_load_aware", "http://127.0.0.1:9305/"},
	} {
		b.Run(target.name, func(b *testing.B) {
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Get(target.url)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		})
	}
}
