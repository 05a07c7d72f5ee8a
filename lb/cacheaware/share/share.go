// Package share makes the cache_aware trees of many Sluice instances one
// view: each instance publishes the (model, prompt, replica) of its own
// routing decisions on a Redis stream per pool, and a reader applies the
// other instances' entries to its local Router. The pick stays local: no
// Redis call on the request path. Publishing is asynchronous through a
// bounded buffer that drops its oldest entry when Redis is slow or away;
// the reader resumes from the last entry it applied, or from the oldest
// one the stream still holds (MAXLEN ~ StreamLen), so a new instance and
// one back from a Redis outage catch up on the recent history.
package share

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// Defaults.
const (
	DefaultStreamLen = 10000
	DefaultBuffer    = 4096
	DefaultMaxText   = 32768
	defaultBatch     = 256
	blockMillis      = 1000
	maxBackoff       = 5 * time.Second
	firstBackoff     = 100 * time.Millisecond
)

// Config is one pool's sharing.
type Config struct {
	Conn redisconn.Config
	Pool string
	// Instance names this instance in the stream (its own entries are
	// skipped by its reader); random when empty.
	Instance string
	// StreamLen bounds the stream (approximately, XADD MAXLEN ~): the
	// history a new instance replays.
	StreamLen int64
	// Buffer bounds the entries waiting to be published.
	Buffer int
	// MaxText bounds the prompt characters (runes) of one entry.
	MaxText int
}

func (c Config) withDefaults() Config {
	c.Conn = c.Conn.WithDefaults()
	if c.StreamLen <= 0 {
		c.StreamLen = DefaultStreamLen
	}
	if c.Buffer <= 0 {
		c.Buffer = DefaultBuffer
	}
	if c.MaxText <= 0 {
		c.MaxText = DefaultMaxText
	}
	if c.Instance == "" {
		c.Instance = redisconn.InstanceID("")
	}
	return c
}

// Key is the pool's stream key; one hash tag, so a cluster works.
func Key(prefix, pool string) string {
	return redisconn.KeyTag(prefix, pool) + ":cache_tree"
}

// ApplyFunc records another instance's routing decision locally
// (cacheaware.Router.Insert).
type ApplyFunc func(model, text, addr string)

type entry struct{ model, text, addr string }

// Stats are the sharer's counters and state.
type Stats struct {
	Instance  string `json:"instance"`
	Connected bool   `json:"connected"`
	Published uint64 `json:"published"`
	Applied   uint64 `json:"applied"`
	Dropped   uint64 `json:"dropped"`
	Errors    uint64 `json:"errors"`
	Pending   int    `json:"pending"`
	// LagMillis: age of the last applied entry when it was applied.
	LagMillis int64  `json:"lag_ms"`
	LastID    string `json:"last_id"`
	LastError string `json:"last_error,omitempty"`
}

// Sharer publishes this instance's inserts and applies the others'.
type Sharer struct {
	cfg   Config
	key   string
	apply ApplyFunc

	mu      sync.Mutex
	buf     []entry // ring
	head, n int
	wake    chan struct{}

	cl      atomic.Pointer[rueidis.Client]
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closeMu sync.Once

	published, applied, dropped, errs atomic.Uint64
	lag                               atomic.Int64
	connected                         atomic.Bool
	lastID                            atomic.Pointer[string]
	lastErr                           atomic.Pointer[string]
}

// New starts sharing: a goroutine connects (retrying with back-off while
// Redis is away), then one publishes and one reads. Close stops them.
func New(cfg Config, apply ApplyFunc) *Sharer {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sharer{
		cfg: cfg, key: Key(cfg.Conn.KeyPrefix, cfg.Pool), apply: apply,
		buf: make([]entry, cfg.Buffer), wake: make(chan struct{}, 1),
		cancel: cancel,
	}
	first := "0-0" // replay the retained history first
	s.lastID.Store(&first)
	s.wg.Add(1)
	go s.run(ctx)
	return s
}

// Instance is this instance's id in the stream.
func (s *Sharer) Instance() string { return s.cfg.Instance }

// Publish queues one routing decision; it never blocks on Redis. A full
// buffer drops its oldest entry (counted in Dropped).
func (s *Sharer) Publish(model, text, addr string) {
	if text == "" {
		return
	}
	text = cut(text, s.cfg.MaxText)
	model = cutBytes(model, MaxModelBytes)
	s.mu.Lock()
	if s.n == len(s.buf) {
		s.buf[s.head] = entry{}
		s.head = (s.head + 1) % len(s.buf)
		s.n--
		s.dropped.Add(1)
	}
	s.buf[(s.head+s.n)%len(s.buf)] = entry{model, text, addr}
	s.n++
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// MaxModelBytes bounds the model name of a shared entry, as the local
// tree bounds its keys: the name comes from the client's body (up to
// max_body_bytes), and the stream lives in the Redis other features share.
const MaxModelBytes = 128

// cutBytes returns at most max bytes of s, cut on a rune boundary and
// copied when cut.
func cutBytes(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return strings.Clone(s[:i])
}

// cut returns the first max runes of s, copied when cut so the rest of a
// large body is not kept alive.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i, n := 0, 0
	for i < len(s) && n < max {
		_, w := utf8.DecodeRuneInString(s[i:])
		i += w
		n++
	}
	if i == len(s) {
		return s
	}
	return strings.Clone(s[:i])
}

func (s *Sharer) take(max int) []entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := min(s.n, max)
	out := make([]entry, k)
	for i := range k {
		j := (s.head + i) % len(s.buf)
		out[i] = s.buf[j]
		s.buf[j] = entry{}
	}
	s.head = (s.head + k) % len(s.buf)
	s.n -= k
	return out
}

// requeue puts back a batch that failed, ahead of newer entries, as far
// as the buffer has room (the rest counts as dropped).
func (s *Sharer) requeue(es []entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(es) - 1; i >= 0; i-- {
		if s.n == len(s.buf) {
			s.dropped.Add(uint64(i + 1))
			return
		}
		s.head = (s.head - 1 + len(s.buf)) % len(s.buf)
		s.buf[s.head] = es[i]
		s.n++
	}
}

func (s *Sharer) fail(err error) {
	s.errs.Add(1)
	msg := err.Error()
	s.lastErr.Store(&msg)
	s.connected.Store(false)
}

func (s *Sharer) ok() {
	s.connected.Store(true)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (s *Sharer) run(ctx context.Context) {
	defer s.wg.Done()
	back := firstBackoff
	for {
		opt, err := s.cfg.Conn.ClientOption(redisconn.ConnTimeout(s.cfg.Conn.ReadTimeout))
		if err == nil {
			var cl rueidis.Client
			cl, err = rueidis.NewClient(opt)
			if err == nil {
				s.cl.Store(&cl)
				s.ok()
				break
			}
		}
		s.fail(err)
		if !sleep(ctx, back) {
			return
		}
		back = min(2*back, maxBackoff)
	}
	cl := *s.cl.Load()
	s.wg.Add(2)
	go s.publishLoop(ctx, cl)
	go s.readLoop(ctx, cl)
}

func (s *Sharer) publishLoop(ctx context.Context, cl rueidis.Client) {
	defer s.wg.Done()
	back := firstBackoff
	maxlen := strconv.FormatInt(s.cfg.StreamLen, 10)
	for {
		batch := s.take(defaultBatch)
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		cmds := make(rueidis.Commands, len(batch))
		for i, e := range batch {
			cmds[i] = cl.B().Xadd().Key(s.key).Maxlen().Almost().Threshold(maxlen).Id("*").
				FieldValue().FieldValue("i", s.cfg.Instance).FieldValue("m", e.model).
				FieldValue("t", e.text).FieldValue("a", e.addr).Build()
		}
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Conn.ReadTimeout+time.Second)
		res := cl.DoMulti(cctx, cmds...)
		cancel()
		var failed []entry
		var ferr error
		for i, r := range res {
			if err := r.Error(); err != nil {
				failed = append(failed, batch[i])
				ferr = err
			} else {
				s.published.Add(1)
			}
		}
		if ferr == nil {
			s.ok()
			back = firstBackoff
			continue
		}
		if ctx.Err() != nil {
			return
		}
		s.fail(ferr)
		s.requeue(failed)
		if !sleep(ctx, back) {
			return
		}
		back = min(2*back, maxBackoff)
	}
}

func (s *Sharer) readLoop(ctx context.Context, cl rueidis.Client) {
	defer s.wg.Done()
	back := firstBackoff
	for ctx.Err() == nil {
		last := *s.lastID.Load()
		cmd := cl.B().Xread().Count(defaultBatch).Block(blockMillis).Streams().Key(s.key).Id(last).Build()
		streams, err := cl.Do(ctx, cmd).AsXRead()
		if err != nil && !rueidis.IsRedisNil(err) {
			if ctx.Err() != nil {
				return
			}
			s.fail(err)
			if !sleep(ctx, back) {
				return
			}
			back = min(2*back, maxBackoff)
			continue
		}
		s.ok()
		back = firstBackoff
		for _, e := range streams[s.key] {
			if e.FieldValues["i"] != s.cfg.Instance {
				// A peer's entries are bounded as our own are (the stream
				// is outside input).
				s.apply(cutBytes(e.FieldValues["m"], MaxModelBytes), cut(e.FieldValues["t"], s.cfg.MaxText), e.FieldValues["a"])
				s.applied.Add(1)
				if ms, ok := idMillis(e.ID); ok {
					s.lag.Store(max(time.Now().UnixMilli()-ms, 0))
				}
			}
			id := e.ID
			s.lastID.Store(&id)
		}
	}
}

func idMillis(id string) (int64, bool) {
	i := strings.IndexByte(id, '-')
	if i < 0 {
		return 0, false
	}
	ms, err := strconv.ParseInt(id[:i], 10, 64)
	return ms, err == nil
}

// Stats reports the counters and the Redis state.
func (s *Sharer) Stats() Stats {
	s.mu.Lock()
	pending := s.n
	s.mu.Unlock()
	st := Stats{
		Instance: s.cfg.Instance, Connected: s.connected.Load(),
		Published: s.published.Load(), Applied: s.applied.Load(),
		Dropped: s.dropped.Load(), Errors: s.errs.Load(), Pending: pending,
		LagMillis: s.lag.Load(), LastID: *s.lastID.Load(),
	}
	if e := s.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// Close stops the goroutines and closes the connection. Entries not yet
// published are dropped.
func (s *Sharer) Close() {
	s.closeMu.Do(func() {
		s.cancel()
		s.wg.Wait()
		if cl := s.cl.Load(); cl != nil {
			(*cl).Close()
		}
	})
}
