package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
)

// proxyOnPool is a reverse_proxy with a Sluice policy on pool, its
// upstreams static (dials) or from src.
func proxyOnPool(pool string, src reverseproxy.UpstreamSource, dials ...string) *reverseproxy.Handler {
	rp := &reverseproxy.Handler{DynamicUpstreams: src, LoadBalancing: &reverseproxy.LoadBalancing{
		SelectionPolicy: &QueuedLeastLatency{selector: selector{pool: lb.GetPool(pool)}}}}
	for _, d := range dials {
		rp.Upstreams = append(rp.Upstreams, &reverseproxy.Upstream{Dial: d})
	}
	return rp
}

// httpApp is one server per handler, each a site on its own port.
func httpApp(handlers ...*reverseproxy.Handler) *caddyhttp.App {
	app := &caddyhttp.App{Servers: map[string]*caddyhttp.Server{}}
	for i, h := range handlers {
		app.Servers[string(rune('a'+i))] = &caddyhttp.Server{Listen: []string{":" + string(rune('1'+i))},
			Routes: caddyhttp.RouteList{{Handlers: []caddyhttp.MiddlewareHandler{&caddyhttp.Subroute{
				Routes: caddyhttp.RouteList{{Handlers: []caddyhttp.MiddlewareHandler{h}}}}}}}}
	}
	return app
}

func TestPoolUpstreamsMustAgree(t *testing.T) {
	set := func(pool string) reverseproxy.UpstreamSource { return &CustomRouterUpstreams{Pool: pool} }
	cases := []struct {
		name    string
		app     *caddyhttp.App
		refused bool
	}{
		{"the same static upstreams, in any order",
			httpApp(proxyOnPool("p", nil, "a:1", "b:1"), proxyOnPool("p", nil, "b:1", "a:1")), false},
		{"different static upstreams", httpApp(proxyOnPool("p", nil, "a:1"), proxyOnPool("p", nil, "b:1")), true},
		{"different static upstreams on different pools",
			httpApp(proxyOnPool("p", nil, "a:1"), proxyOnPool("q", nil, "b:1")), false},
		{"the pool's backend set twice", httpApp(proxyOnPool("p", set("p")), proxyOnPool("p", set("p"))), false},
		{"the backend set and static upstreams", httpApp(proxyOnPool("p", set("p")), proxyOnPool("p", nil, "a:1")), true},
		{"two pools' backend sets", httpApp(proxyOnPool("p", set("p")), proxyOnPool("p", set("q"))), true},
		{"another dynamic source", httpApp(proxyOnPool("p", &reverseproxy.AUpstreams{Name: "x"}), proxyOnPool("p", nil, "a:1")), true},
		{"one handler alone", httpApp(proxyOnPool("p", &reverseproxy.AUpstreams{Name: "x"})), false},
	}
	for _, tc := range cases {
		err := checkPoolUpstreams(tc.app)
		if (err != nil) != tc.refused {
			t.Errorf("%s: %v, want refused %t", tc.name, err, tc.refused)
		}
		if err != nil && (!strings.Contains(err.Error(), `pool "p"`) || !strings.Contains(err.Error(), "site :1") ||
			!strings.Contains(err.Error(), "site :2")) {
			t.Errorf("%s: %v does not name the pool and both sites", tc.name, err)
		}
	}
}

// A site with host names is named by them.
func TestPoolUpstreamsNameSitesByHost(t *testing.T) {
	app := httpApp(proxyOnPool("p", nil, "a:1"), proxyOnPool("p", nil, "b:1"))
	host := caddyhttp.MatchHost{"llm.example"}
	app.Servers["a"].Routes[0].MatcherSets = caddyhttp.MatcherSets{{&host}}
	err := checkPoolUpstreams(app)
	if err == nil || !strings.Contains(err.Error(), "site llm.example (upstreams a:1)") || !strings.Contains(err.Error(), "site :2 (upstreams b:1)") {
		t.Fatalf("refusal %v, want the sites named llm.example and :2", err)
	}
}
