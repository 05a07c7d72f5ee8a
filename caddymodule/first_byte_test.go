package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A pool whose replicas keep changing (autoscaling, set-backends) keeps a
// first-byte record only for the replicas it has now: every address ever
// picked used to stay in the state's map for the life of the process.
func TestFirstByteRecordsOnlyForTheReplicasOfTheSet(t *testing.T) {
	cctx := provisionContext(t)
	p := &CacheAware{Pool: freshPoolName("first-byte-churn")}
	if err := p.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	for i := range 200 {
		selectOnce(t, p, fmt.Sprintf("127.0.0.1:%d", 20000+i), fmt.Sprintf("127.0.0.1:%d", 20000+i+1))
	}
	var kept []string
	p.state.firstByte.m.Range(func(k, _ any) bool { kept = append(kept, k.(string)); return true })
	if len(kept) > 2 {
		t.Fatalf("%d first-byte records after 200 sets of 2 replicas, want at most the current 2 (first: %v)", len(kept), kept[:3])
	}
}

// selectOnce runs p's Select for one tiny completion over static
// upstreams dials, ends the request, and returns the headers Select set
// on the response.
func selectOnce(t *testing.T, p reverseproxy.Selector, dials ...string) http.Header {
	t.Helper()
	pool := make(reverseproxy.UpstreamPool, len(dials))
	for i, d := range dials {
		pool[i] = &reverseproxy.Upstream{Dial: d, Host: new(reverseproxy.Host)}
	}
	repl := caddy.NewReplacer()
	ctx, end := context.WithCancel(context.WithValue(context.Background(), caddy.ReplacerCtxKey, repl))
	defer end()
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/v1/completions",
		strings.NewReader(`{"prompt":"x","max_tokens":1}`))
	w := &benchWriter{h: http.Header{}}
	if up := p.Select(pool, r, w); up == nil {
		t.Fatalf("no upstream among %v", dials)
	}
	return w.h
}
