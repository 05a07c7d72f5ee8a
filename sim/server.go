package sim

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server is a Replica listening on its own HTTP server, for tests and
// benchmarks. Create it with Start or StartOn; stop it with Close.
type Server struct {
	replica *Replica
	srv     *http.Server
	ln      net.Listener
	served  chan struct{} // closed when Serve has returned

	closeOnce sync.Once
	closeErr  error
}

// Start starts a replica on a free port of 127.0.0.1.
func Start(cfg Config) (*Server, error) {
	return StartOn("127.0.0.1:0", cfg)
}

// StartOn starts a replica listening on addr (host:port; port 0 picks a
// free one).
func StartOn(addr string, cfg Config) (*Server, error) {
	rp, err := New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{
		replica: rp,
		ln:      ln,
		served:  make(chan struct{}),
		srv: &http.Server{
			Handler:           rp,
			ReadHeaderTimeout: 30 * time.Second,
		},
	}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL returns the server's base URL, e.g. "http://127.0.0.1:41234".
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Addr returns the listening address (host:port).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Replica returns the served replica (for Stats, SetFaults, ...).
func (s *Server) Replica() *Replica { return s.replica }

// Close closes the replica (ending queued and running requests), the
// listener and all connections, and waits until every handler and the
// server goroutine have returned, so that nothing of the server is left
// running. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		_ = s.replica.Close()
		err := s.srv.Close()
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		<-s.served
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if werr := s.replica.waitDrained(ctx); werr != nil && err == nil {
			err = errors.New("sim: handlers still running 10s after Close")
		}
		s.closeErr = err
	})
	return s.closeErr
}
