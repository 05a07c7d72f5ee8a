//go:build linux

package modelmetrics

import (
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// fullBacklogListener is a loopback listener whose accept queue holds one
// connection, already taken by a client nobody accepts: the kernel drops
// the next client's SYN, so that client's dial lasts until its SYN is
// sent again (about a second) and the queue has room. accept starts
// serving h (which takes the queued connections).
func fullBacklogListener(t *testing.T, h http.Handler) (addr string, accept func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "backlog-0")
	ln, err := net.FileListener(f) // dups fd
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	filler, err := net.Dial("tcp", ln.Addr().String()) // fills the queue
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	t.Cleanup(func() { srv.Close(); ln.Close(); filler.Close() })
	return ln.Addr().String(), func() { go srv.Serve(ln) }
}

// The dial of a scrape is bounded by the timeout in force, not by the one
// given to New: a reload raising timeout (a replica whose accept queue is
// full under load) still dialled with the first, shorter one, and every
// such scrape failed at it.
func TestAConfiguredTimeoutAppliesToTheDial(t *testing.T) {
	addr, accept := fullBacklogListener(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("vllm:num_requests_waiting 2\n"))
	}))
	s := New(Config{Interval: time.Hour, Timeout: 20 * time.Millisecond})
	defer s.own.CloseIdleConnections()
	s.Configure(Config{Interval: time.Hour, Timeout: 30 * time.Second})
	s.SetTargets(map[string]string{"r": addr})
	done := make(chan struct{})
	go func() {
		defer close(done)
		scrapeOnce(s)
	}()
	// Room in the queue only later: the dial waits for the SYN sent again.
	time.Sleep(100 * time.Millisecond)
	accept()
	<-done
	if v, fr := s.Get("r"); fr != Fresh || v.Waiting != 2 {
		t.Fatalf("a slow dial under a 30s timeout: got %v %+v (err %v), want fresh, waiting 2", fr, v, v.Err)
	}
}
