package caddymodule

import (
	"crypto/tls"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// upstreamTLS is the TLS client config h's HTTP transport built for its
// upstreams (its tls block: trusted CAs, client certificate, server name,
// insecure_skip_verify); nil without one, or with another transport (the
// system's roots and Go's defaults). The engine reads of the replicas
// behind h (their metrics, /tokenize) use it, cloned: with only the
// system's roots, every read of a replica with a private CA failed. A
// server name with placeholders is resolved with the global ones alone
// (a read has no request).
func upstreamTLS(h *reverseproxy.Handler) *tls.Config {
	if h == nil {
		return nil
	}
	t, ok := h.Transport.(*reverseproxy.HTTPTransport)
	if !ok || t.TLS == nil || t.Transport == nil || t.Transport.TLSClientConfig == nil {
		return nil
	}
	c := t.Transport.TLSClientConfig
	if strings.Contains(c.ServerName, "{") {
		c = c.Clone()
		c.ServerName = caddy.NewReplacer().ReplaceAll(c.ServerName, "")
	}
	return c
}

// guardedProxy is the reverse_proxy a flow_control handler guards: the
// first one after it in its route (as findReplicas finds it); nil if none
// or without an HTTP app. Call it once the config is provisioned.
func (h *FlowControl) guardedProxy() *reverseproxy.Handler {
	app, err := h.ctx.AppIfConfigured("http")
	if err != nil {
		return nil
	}
	var rp *reverseproxy.Handler
	forEachChain(app.(*caddyhttp.App), func(chain []caddyhttp.MiddlewareHandler, _ []string, _ chainKind) {
		for i, mh := range chain {
			if fc, ok := mh.(*FlowControl); ok && fc == h && rp == nil {
				rp = nextProxy(chain[i+1:])
			}
		}
	})
	return rp
}

// upstreamTLSFollowers are the engine readers of a policy's state that
// its picker's own config does not reach (cache_aware's KV cache size
// scraper and engine tokenizer), by the state's picker: the selector
// hands them its proxy's TLS config when its config starts, so a reload
// that changes the tls block reaches them and a refused one does not.
var upstreamTLSFollowers = struct {
	mu sync.Mutex
	m  map[any][]*tlsFollower
}{m: map[any][]*tlsFollower{}}

type tlsFollower struct{ apply func(*tls.Config) }

// followUpstreamTLS makes apply receive the TLS configs handed to
// picker's state from now on; stop ends it.
func followUpstreamTLS(picker any, apply func(*tls.Config)) (stop func()) {
	f := &tlsFollower{apply: apply}
	fs := &upstreamTLSFollowers
	fs.mu.Lock()
	fs.m[picker] = append(fs.m[picker], f)
	fs.mu.Unlock()
	return func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		if rest := slices.DeleteFunc(fs.m[picker], func(g *tlsFollower) bool { return g == f }); len(rest) > 0 {
			fs.m[picker] = rest
		} else {
			delete(fs.m, picker)
		}
	}
}

// handUpstreamTLS gives c to the followers of picker's state.
func handUpstreamTLS(picker any, c *tls.Config) {
	fs := &upstreamTLSFollowers
	fs.mu.Lock()
	followers := slices.Clone(fs.m[picker])
	fs.mu.Unlock()
	for _, f := range followers {
		f.apply(c)
	}
}

// tokenizerTransport is the transport of cache_aware's engine tokenizer
// (/tokenize; nil with another tokenizer), bounded as the tokenizer's own
// default (its concurrency's idle connections per replica, kept 30s);
// kvEventsTLS gives it the proxy's TLS config.
func tokenizerTransport(o kvEventsOptions) *modelmetrics.Transport {
	if o.tokenizer() != kvTokenizerEngine {
		return nil
	}
	return modelmetrics.NewTransport(nil, modelmetrics.TransportOptions{
		MaxIdleConnsPerHost: o.engineConfig().WithDefaults().Concurrency, IdleConnTimeout: 30 * time.Second})
}

// kvEventsTLS hands the proxy's TLS config to cache_aware's engine reads
// with kv_events: its KV cache size scrapes and, if tokenizer is set, its
// /tokenize requests.
func kvEventsTLS(capacity kvCapacity, tokenizer *modelmetrics.Transport) func(*tls.Config) {
	return func(c *tls.Config) {
		capacity.setTLS(c)
		if tokenizer != nil {
			tokenizer.SetTLS(c)
		}
	}
}
