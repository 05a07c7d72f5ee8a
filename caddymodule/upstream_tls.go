package caddymodule

import (
	"crypto/tls"
	"strings"
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
	forEachChain(app.(*caddyhttp.App), func(chain []caddyhttp.MiddlewareHandler, _ chainKind) {
		for i, mh := range chain {
			if fc, ok := mh.(*FlowControl); ok && fc == h && rp == nil {
				rp = nextProxy(chain[i+1:])
			}
		}
	})
	return rp
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
