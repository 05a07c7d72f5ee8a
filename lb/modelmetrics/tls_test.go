package modelmetrics

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// tlsReplica is a TLS replica serving vLLM metrics; its certificate's CA
// pool (httptest's certificate is its own CA, for 127.0.0.1 and
// example.com). conns counts its connections that are open.
type tlsReplica struct {
	*httptest.Server
	pool  *x509.CertPool
	conns atomic.Int64
}

func newTLSReplica(t *testing.T, h http.HandlerFunc) *tlsReplica {
	t.Helper()
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(vllmBody(2, 1, 0.5))) }
	}
	r := &tlsReplica{}
	r.Server = httptest.NewUnstartedServer(h)
	r.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			r.conns.Add(1)
		case http.StateClosed, http.StateHijacked:
			r.conns.Add(-1)
		}
	}
	r.StartTLS()
	t.Cleanup(r.Close)
	r.pool = x509.NewCertPool()
	r.pool.AddCert(r.Certificate())
	return r
}

// The TLS settings given are those of the scrapes of https:// targets: a
// private CA, a server name, skipping verification; without them the
// system's roots do not trust a private replica.
func TestScrapesUseTheConfiguredTLS(t *testing.T) {
	r := newTLSReplica(t, nil)
	other := otherCAPool(t)
	for _, tc := range []struct {
		name    string
		tls     *tls.Config
		wantErr string // "" : a fresh sample
	}{
		{"system roots", nil, "certificate"},
		{"its CA", &tls.Config{RootCAs: r.pool}, ""},
		{"another CA", &tls.Config{RootCAs: other}, "certificate"},
		{"its CA, the certificate's other name", &tls.Config{RootCAs: r.pool, ServerName: "example.com"}, ""},
		{"its CA, a name not in the certificate", &tls.Config{RootCAs: r.pool, ServerName: "other.test"}, "other.test"},
		{"no verification", &tls.Config{InsecureSkipVerify: true}, ""},
	} {
		s := New(Config{Interval: time.Hour, TLS: tc.tls})
		s.SetTargets(map[string]string{"r": r.URL})
		scrapeOnce(s)
		s.own.CloseIdleConnections()
		v, fr := s.Get("r")
		switch {
		case tc.wantErr == "" && (fr != Fresh || v.Waiting != 2):
			t.Errorf("%s: got %v %+v, want fresh, waiting 2", tc.name, fr, v)
		case tc.wantErr != "" && (fr != Stale || v.Err == nil || !strings.Contains(v.Err.Error(), tc.wantErr)):
			t.Errorf("%s: got %v %+v, want stale with an error naming %q", tc.name, fr, v, tc.wantErr)
		}
	}
}

// A reload that changes the TLS settings reaches a running scraper: the
// next scrapes use the new ones, a target backing off after failures met
// under the old ones is scraped again at once (not after its back-off),
// and the old transport's connections are closed. A Configure with the
// same config changes nothing.
func TestConfigureAppliesNewTLSLive(t *testing.T) {
	r := newTLSReplica(t, nil)
	s := New(Config{Interval: time.Hour, MaxBackoff: time.Hour})
	s.SetTargets(map[string]string{"r": r.URL})
	stop := run(t, s)
	waitFor(t, "a failed first scrape", func() bool { v, _ := s.Get("r"); return v.Err != nil })
	if v, _ := s.Get("r"); !strings.Contains(v.Err.Error(), "certificate") {
		t.Fatalf("under the system roots: %v, want a certificate error", v.Err)
	}

	trust := &tls.Config{RootCAs: r.pool}
	s.Configure(Config{Interval: time.Hour, MaxBackoff: time.Hour, TLS: trust})
	waitFor(t, "a fresh sample after the CA was given", func() bool { _, fr := s.Get("r"); return fr == Fresh })
	waitFor(t, "the connection open", func() bool { return r.conns.Load() == 1 })

	s.Configure(Config{Interval: time.Hour, MaxBackoff: time.Hour, TLS: trust})
	if s.own.cur.Load().tls != trust || r.conns.Load() != 1 {
		t.Fatalf("the same TLS config again: a new transport, or its connection closed (%d open)", r.conns.Load())
	}
	s.Configure(Config{Interval: time.Hour, MaxBackoff: time.Hour, TLS: &tls.Config{RootCAs: r.pool}})
	waitFor(t, "the old transport's idle connection closed", func() bool { return r.conns.Load() == 0 })
	stop()
}

// A scrape in flight when the TLS settings change ends on the old
// transport, whose connection is then closed rather than left idle where
// no request will reuse it.
func TestAScrapeInFlightAcrossATLSChangeLeavesNoIdleConnection(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var r *tlsReplica
	r = newTLSReplica(t, func(w http.ResponseWriter, req *http.Request) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		w.Write([]byte(vllmBody(2, 1, 0.5)))
	})
	s := New(Config{Interval: time.Hour, Timeout: time.Minute, TLS: &tls.Config{RootCAs: r.pool}})
	s.SetTargets(map[string]string{"r": r.URL})
	done := make(chan struct{})
	go func() {
		defer close(done)
		scrapeOnce(s)
	}()
	<-entered
	s.Configure(Config{Interval: time.Hour, Timeout: time.Minute, TLS: &tls.Config{RootCAs: r.pool}})
	close(release)
	<-done
	if _, fr := s.Get("r"); fr != Fresh {
		t.Fatalf("the scrape in flight: %v, want fresh", fr)
	}
	waitFor(t, "the retired transport's connection closed", func() bool { return r.conns.Load() == 0 })
}

// otherCAPool holds a CA of its own, which signed no replica's
// certificate (httptest's servers all share one).
func otherCAPool(t *testing.T) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool
}
