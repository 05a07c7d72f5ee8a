package redisleast

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// conn is the member's Redis client. Started without Redis (unreachable
// at New), it is a placeholder until the probe connects and swaps in a
// real one (provisional until then). A read_timeout raised beyond what
// its connection allows swaps in a new one too (fit); opt is the current
// client's options. mu orders swaps and close.
type conn struct {
	cl          atomic.Pointer[clientRef]
	provisional atomic.Bool
	mu          sync.Mutex
	opt         rueidis.ClientOption
	retired     map[rueidis.Client]bool // swapped out, closed after a grace period
	closed      bool
}

type clientRef struct{ rueidis.Client }

// rc is the current Redis client.
func (c *conn) rc() rueidis.Client { return c.cl.Load().Client }

// dial makes the first client. When Redis can't be reached it keeps a
// placeholder instead — a single-node client that fails every call until
// the probe replaces it (reconnect) — and returns why as unreachable.
func (c *conn) dial(opt rueidis.ClientOption, addrs []string) (unreachable, err error) {
	c.opt = opt
	client, err := rueidis.NewClient(opt)
	if err == nil {
		c.cl.Store(&clientRef{client})
		return nil, nil
	}
	if !transportErr(err) {
		return nil, fmt.Errorf("redis %v: %w", addrs, err)
	}
	single := opt
	single.ForceSingleClient = true
	placeholder, _ := rueidis.NewClient(single) // a client even though the dial failed
	if placeholder == nil {
		return nil, fmt.Errorf("redis %v: %w", addrs, err)
	}
	c.provisional.Store(true)
	c.cl.Store(&clientRef{placeholder})
	return err, nil
}

// options are the current client's options.
func (c *conn) options() rueidis.ClientOption {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opt
}

// reconnect replaces the placeholder client by a real one (with cluster
// discovery) once Redis answers. No call uses the placeholder meanwhile:
// the breaker has been open throughout.
func (c *conn) reconnect(readTimeout time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	opt := c.opt
	opt.ConnWriteTimeout = max(opt.ConnWriteTimeout, redisconn.ConnTimeout(readTimeout))
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return false
	}
	c.opt = opt
	old := c.cl.Swap(&clientRef{client})
	c.provisional.Store(false)
	old.Close()
	return true
}

// fit gives the member a new client when read_timeout was raised beyond
// what the current connection allows: rueidis's ConnWriteTimeout, fixed
// per client, drops a connection whose reply takes longer, which would
// cap the read timeout silently. Same options otherwise, same identity:
// nothing recorded in Redis changes hands. The old client is closed after
// a grace period, so a call that had just loaded it still runs (Close
// lets queued commands finish anyway). Redis unreachable: the error, and
// the loop tries again at its next round.
func (c *conn) fit(readTimeout time.Duration) error {
	want := redisconn.ConnTimeout(readTimeout)
	c.mu.Lock()
	defer c.mu.Unlock()
	if want <= c.opt.ConnWriteTimeout || c.provisional.Load() || c.closed {
		return nil
	}
	opt := c.opt
	opt.ConnWriteTimeout = want
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return err
	}
	grace := c.opt.ConnWriteTimeout
	c.opt = opt
	old := c.cl.Swap(&clientRef{client}).Client
	if c.retired == nil {
		c.retired = map[rueidis.Client]bool{}
	}
	c.retired[old] = true
	time.AfterFunc(grace, func() {
		c.mu.Lock()
		mine := c.retired[old]
		delete(c.retired, old)
		c.mu.Unlock()
		if mine { // else close took it
			old.Close()
		}
	})
	return nil
}

// writeTimeout is the current client's connection-level deadline.
func (c *conn) writeTimeout() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opt.ConnWriteTimeout
}

// close closes the client and the retired ones still in their grace
// period.
func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	retired := c.retired
	c.retired = nil
	c.mu.Unlock()
	for cl := range retired {
		cl.Close()
	}
	c.rc().Close()
}
