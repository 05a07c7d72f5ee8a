package bench

import (
	"io"
	"net"
	"sync"
)

// tcpFront forwards a loopback port to a target it can be switched to, as
// a virtual IP (or Sentinel-aware proxy) in front of a Redis primary does
// at failover: clients keep one address, their connections are cut, and
// they reconnect to the new primary.
type tcpFront struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func startTCPFront(target string) (*tcpFront, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &tcpFront{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Addr is the address clients use.
func (f *tcpFront) Addr() string { return f.ln.Addr().String() }

func (f *tcpFront) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		target := f.target
		f.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		if !f.track(c, up) {
			return
		}
		f.wg.Add(2)
		go f.pipe(c, up)
		go f.pipe(up, c)
	}
}

// track registers a client's pair of connections; false once closed.
func (f *tcpFront) track(c, up net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		up.Close()
		return false
	}
	f.conns[c], f.conns[up] = struct{}{}, struct{}{}
	return true
}

// pipe copies one way; when either side ends, both are closed.
func (f *tcpFront) pipe(dst, src net.Conn) {
	defer f.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	f.mu.Lock()
	delete(f.conns, dst)
	delete(f.conns, src)
	f.mu.Unlock()
}

// switchTo sends new connections to target and cuts the current ones.
func (f *tcpFront) switchTo(target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target = target
	for c := range f.conns {
		c.Close()
	}
}

// Close stops accepting, cuts every connection and waits for the pipes.
func (f *tcpFront) Close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ln.Close()
	f.wg.Wait()
}
