package modelmetrics

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Transport is an HTTP transport for reading replicas' engines (their
// /metrics here; the Caddy adapter hands one to the kv_events tokenizer
// for /tokenize): HTTP/1.1, no proxy from the environment (replicas are
// internal addresses), and the TLS client settings of the proxy in front
// of the replicas, which SetTLS replaces live (a config reload): later
// requests go through a new transport, and the old one's connections are
// closed as they come idle.
type Transport struct {
	opts TransportOptions
	mu   sync.Mutex // serializes SetTLS
	cur  atomic.Pointer[transportGen]
}

// TransportOptions bound a Transport's connections (zero: net/http's
// defaults).
type TransportOptions struct {
	MaxIdleConnsPerHost    int
	IdleConnTimeout        time.Duration
	MaxResponseHeaderBytes int64
}

// transportGen is the transport of one TLS config.
type transportGen struct {
	t       *http.Transport
	tls     *tls.Config // as given, to compare: SetTLS with it changes nothing
	retired atomic.Bool // replaced: its connections close once idle
}

// NewTransport returns a transport using tlsCfg (cloned; nil: the
// system's roots and Go's defaults) for https:// URLs.
func NewTransport(tlsCfg *tls.Config, o TransportOptions) *Transport {
	t := &Transport{opts: o}
	t.cur.Store(t.build(tlsCfg))
	return t
}

func (t *Transport) build(tlsCfg *tls.Config) *transportGen {
	tr := &http.Transport{
		// No dial timeout of its own: the request's context bounds the
		// dial, with the timeout in force when the request starts (a
		// timeout fixed here outlived a reload that raised it).
		DialContext:            (&net.Dialer{}).DialContext,
		MaxIdleConnsPerHost:    t.opts.MaxIdleConnsPerHost,
		IdleConnTimeout:        t.opts.IdleConnTimeout,
		MaxResponseHeaderBytes: t.opts.MaxResponseHeaderBytes,
	}
	if tlsCfg != nil {
		c := tlsCfg.Clone()
		// HTTP/1.1, as over plain HTTP: the proxy's config may offer h2
		// (ALPN), which this transport does not speak.
		c.NextProtos = nil
		tr.TLSClientConfig = c
	}
	return &transportGen{t: tr, tls: tlsCfg}
}

// SetTLS makes later requests use tlsCfg, and reports whether it differs
// from the config in use (compared by pointer: a config reload builds a
// new one, possibly from new certificate files).
func (t *Transport) SetTLS(tlsCfg *tls.Config) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.cur.Load()
	if old.tls == tlsCfg {
		return false
	}
	t.cur.Store(t.build(tlsCfg))
	old.retired.Store(true)
	old.t.CloseIdleConnections()
	return true
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	g := t.cur.Load()
	resp, err := g.t.RoundTrip(req)
	if err != nil {
		g.closeIfRetired()
		return nil, err
	}
	resp.Body = &genBody{ReadCloser: resp.Body, g: g}
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the transport in
// use (a retired one closes its own).
func (t *Transport) CloseIdleConnections() { t.cur.Load().t.CloseIdleConnections() }

// closeIfRetired closes g's idle connections if g was replaced. SetTLS's
// CloseIdleConnections also closes those of the requests then in flight
// as they come idle, but a request that took g just before the swap and
// reached it just after undoes that (net/http stops closing connections
// that come idle once a request queues for one): its connection would
// stay idle where nothing reuses it until IdleConnTimeout.
func (g *transportGen) closeIfRetired() {
	if g.retired.Load() {
		g.t.CloseIdleConnections()
	}
}

// genBody is a response body that, once closed, lets a retired transport
// close the connection it came on.
type genBody struct {
	io.ReadCloser
	g *transportGen
}

func (b *genBody) Close() error {
	err := b.ReadCloser.Close()
	b.g.closeIfRetired()
	return err
}
