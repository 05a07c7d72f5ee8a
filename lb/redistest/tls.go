package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// TLSServer is a private redis-server that speaks TLS only (--port 0),
// with a certificate of a CA made for the test (nothing committed).
type TLSServer struct {
	*Server
	// CAFile is the PEM of the CA that signed the server's certificate
	// (for 127.0.0.1 and localhost): redisconn's ca_file.
	CAFile string
}

// Conn is a TLS connection config for the server (no user yet).
func (s *TLSServer) Conn() redisconn.Config {
	return redisconn.Config{Addrs: []string{s.Addr}, TLS: true, CAFile: s.CAFile}
}

// StartTLS starts a TLS-only redis-server of the test's own, with
// --tls-auth-clients no (clients show no certificate) and the extra
// arguments; killed at the end of the test. It skips (fails under
// CI=true) without redis-server, and fails when the redis-server found
// was built without TLS.
func StartTLS(t *testing.T, args ...string) *TLSServer {
	t.Helper()
	Addr(t) // same skip rules
	if _, err := exec.LookPath("redis-server"); err != nil {
		need(t, "this test needs redis-server on PATH")
	}
	dir := t.TempDir()
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	if err := writeCerts(ca, cert, key); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(ca)
	pool.AppendCertsFromPEM(caPEM)
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	s, err := start(addr, func(addr string) bool {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, tc)
		if err != nil {
			return false
		}
		return ping(c)
	}, append([]string{"--port", "0", "--tls-port", port, "--tls-cert-file", cert, "--tls-key-file", key,
		"--tls-ca-cert-file", ca, "--tls-auth-clients", "no"}, args...))
	if err != nil {
		t.Fatalf("%v (is redis-server built with TLS? `redis-server --tls-port` needs BUILD_TLS)", err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(s.Kill) })
	return &TLSServer{Server: s, CAFile: ca}
}

// writeCerts makes a CA and a server certificate for 127.0.0.1 and
// localhost signed by it, valid for a day, and writes them as PEM.
func writeCerts(caFile, certFile, keyFile string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{caFile, "CERTIFICATE", caDER}, {certFile, "CERTIFICATE", srvDER}, {keyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return err
		}
	}
	return nil
}
