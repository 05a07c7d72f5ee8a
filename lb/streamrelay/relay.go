// Package streamrelay carries one kind of record between Sluice instances
// through a Redis stream: each instance publishes its own records and
// applies the others'. Publishing is asynchronous through a bounded buffer
// that drops its oldest record when Redis is slow or away, so the caller
// never waits on Redis; the reader resumes from the last record it
// applied, or from the oldest one the stream still holds (MAXLEN ~
// StreamLen), so a new instance and one back from a Redis outage catch up
// on the recent history. A stream reset under the reader (key deleted,
// Redis back empty, ids gone below the last one read) is noticed when a
// read comes back empty and re-read from its start (Stats.Resets).
// cache_aware's shared tree (lb/cacheaware/share) and the KV-event relay
// (lb/kvevents) are its users.
package streamrelay

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// Defaults.
const (
	DefaultStreamLen = 10000
	DefaultBuffer    = 4096
	defaultBatch     = 256
	blockMillis      = 1000
	maxBackoff       = 5 * time.Second
	firstBackoff     = 100 * time.Millisecond
)

// InstanceField is the field naming the publishing instance; users must
// not set it.
const InstanceField = "i"

// Config is one relay.
type Config struct {
	Conn redisconn.Config
	// Key is the stream's key (one hash tag, so a cluster works).
	Key string
	// Instance names this instance in the stream (its own records are
	// skipped by its reader); random when empty.
	Instance string
	// StreamLen bounds the stream (approximately, XADD MAXLEN ~): the
	// history a new instance replays.
	StreamLen int64
	// Buffer bounds the records waiting to be published.
	Buffer int
	// FromNow skips the history the stream holds: the reader applies only
	// records published after it started (for a user whose state already
	// covers the past).
	FromNow bool
}

func (c Config) withDefaults() Config {
	c.Conn = c.Conn.WithDefaults()
	if c.StreamLen <= 0 {
		c.StreamLen = DefaultStreamLen
	}
	if c.Buffer <= 0 {
		c.Buffer = DefaultBuffer
	}
	if c.Instance == "" {
		c.Instance = redisconn.InstanceID("")
	}
	return c
}

// ApplyFunc receives another instance's record: its fields as read from
// Redis (outside input: the user bounds and checks them), and whether it
// is history (read before the relay first reached the stream's end: a
// replay on start) rather than news.
type ApplyFunc func(fields map[string]string, history bool)

// record is a flat field, value, field, value... list.
type record []string

// Stats are the relay's counters and state.
type Stats struct {
	Instance  string `json:"instance"`
	Connected bool   `json:"connected"`
	Published uint64 `json:"published"`
	Applied   uint64 `json:"applied"`
	Dropped   uint64 `json:"dropped"`
	Errors    uint64 `json:"errors"`
	Pending   int    `json:"pending"`
	// Resets counts the stream found reset under the reader (deleted,
	// emptied, or holding only ids below LastID: Redis restarted empty,
	// failed over, or a record with a far-future id was read and removed)
	// and re-read from its start.
	Resets uint64 `json:"resets"`
	// LagMillis: age of the last applied record when it was applied.
	LagMillis int64  `json:"lag_ms"`
	LastID    string `json:"last_id"`
	LastError string `json:"last_error,omitempty"`
}

// Relay publishes this instance's records and applies the others'.
type Relay struct {
	cfg   Config
	apply ApplyFunc

	mu      sync.Mutex
	buf     []record // ring
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
	resets                            atomic.Uint64 // Stats.Resets
}

// New starts relaying: a goroutine connects (retrying with back-off while
// Redis is away), then one publishes and one reads. Close stops them.
func New(cfg Config, apply ApplyFunc) *Relay {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{cfg: cfg, apply: apply, buf: make([]record, cfg.Buffer), wake: make(chan struct{}, 1), cancel: cancel}
	first := "0-0" // replay the retained history first
	r.lastID.Store(&first)
	r.wg.Add(1)
	go r.run(ctx)
	return r
}

// Instance is this instance's id in the stream.
func (r *Relay) Instance() string { return r.cfg.Instance }

// Publish queues one record given as field, value pairs (the slice is
// kept: the caller must not change it); it never blocks on Redis. A full
// buffer drops its oldest record (counted in Dropped).
func (r *Relay) Publish(fieldValues ...string) {
	if len(fieldValues)%2 != 0 {
		panic("streamrelay: Publish needs field, value pairs")
	}
	r.mu.Lock()
	if r.n == len(r.buf) {
		r.buf[r.head] = nil
		r.head = (r.head + 1) % len(r.buf)
		r.n--
		r.dropped.Add(1)
	}
	r.buf[(r.head+r.n)%len(r.buf)] = fieldValues
	r.n++
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// CountDropped counts a record the user did not publish (too large for
// the stream, say) in Dropped, as the others see it missing.
func (r *Relay) CountDropped() { r.dropped.Add(1) }

func (r *Relay) take(max int) []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := min(r.n, max)
	out := make([]record, k)
	for i := range k {
		j := (r.head + i) % len(r.buf)
		out[i] = r.buf[j]
		r.buf[j] = nil
	}
	r.head = (r.head + k) % len(r.buf)
	r.n -= k
	return out
}

// requeue puts back a batch that failed, ahead of newer records, as far
// as the buffer has room (the rest counts as dropped).
func (r *Relay) requeue(rs []record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(rs) - 1; i >= 0; i-- {
		if r.n == len(r.buf) {
			r.dropped.Add(uint64(i + 1))
			return
		}
		r.head = (r.head - 1 + len(r.buf)) % len(r.buf)
		r.buf[r.head] = rs[i]
		r.n++
	}
}

func (r *Relay) fail(err error) {
	r.errs.Add(1)
	msg := err.Error()
	r.lastErr.Store(&msg)
	r.connected.Store(false)
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

func (r *Relay) run(ctx context.Context) {
	defer r.wg.Done()
	back := firstBackoff
	for {
		opt, err := r.cfg.Conn.ClientOption(redisconn.ConnTimeout(r.cfg.Conn.ReadTimeout))
		if err == nil {
			var cl rueidis.Client
			cl, err = rueidis.NewClient(opt)
			if err == nil {
				r.cl.Store(&cl)
				r.connected.Store(true)
				break
			}
		}
		r.fail(err)
		if !sleep(ctx, back) {
			return
		}
		back = min(2*back, maxBackoff)
	}
	cl := *r.cl.Load()
	r.wg.Add(2)
	go r.publishLoop(ctx, cl)
	go r.readLoop(ctx, cl)
}

func (r *Relay) publishLoop(ctx context.Context, cl rueidis.Client) {
	defer r.wg.Done()
	back := firstBackoff
	maxlen := strconv.FormatInt(r.cfg.StreamLen, 10)
	for {
		batch := r.take(defaultBatch)
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
				continue
			}
		}
		cmds := make(rueidis.Commands, len(batch))
		for i, rec := range batch {
			fv := cl.B().Xadd().Key(r.cfg.Key).Maxlen().Almost().Threshold(maxlen).Id("*").
				FieldValue().FieldValue(InstanceField, r.cfg.Instance)
			for j := 0; j < len(rec); j += 2 {
				fv = fv.FieldValue(rec[j], rec[j+1])
			}
			cmds[i] = fv.Build()
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.Conn.ReadTimeout+time.Second)
		res := cl.DoMulti(cctx, cmds...)
		cancel()
		var failed []record
		var ferr error
		for i, res := range res {
			if err := res.Error(); err != nil {
				failed = append(failed, batch[i])
				ferr = err
			} else {
				r.published.Add(1)
			}
		}
		if ferr == nil {
			r.connected.Store(true)
			back = firstBackoff
			continue
		}
		if ctx.Err() != nil {
			return
		}
		r.fail(ferr)
		r.requeue(failed)
		if !sleep(ctx, back) {
			return
		}
		back = min(2*back, maxBackoff)
	}
}

// wait records a failed read and sleeps the back-off, doubling it; false
// when ctx ended.
func (r *Relay) wait(ctx context.Context, err error, back *time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	r.fail(err)
	if !sleep(ctx, *back) {
		return false
	}
	*back = min(2**back, maxBackoff)
	return true
}

func (r *Relay) readLoop(ctx context.Context, cl rueidis.Client) {
	defer r.wg.Done()
	back := firstBackoff
	positioned := !r.cfg.FromNow
	history := !r.cfg.FromNow // until a read comes back short
	for ctx.Err() == nil {
		if !positioned {
			// The newest record's id ("$" would miss what is published
			// between two reads).
			es, err := cl.Do(ctx, cl.B().Xrevrange().Key(r.cfg.Key).End("+").Start("-").Count(1).Build()).AsXRange()
			if err != nil && !rueidis.IsRedisNil(err) {
				if !r.wait(ctx, err, &back) {
					return
				}
				continue
			}
			if len(es) > 0 {
				id := es[0].ID
				r.lastID.Store(&id)
			}
			positioned = true
		}
		last := *r.lastID.Load()
		cmd := cl.B().Xread().Count(defaultBatch).Block(blockMillis).Streams().Key(r.cfg.Key).Id(last).Build()
		streams, err := cl.Do(ctx, cmd).AsXRead()
		if err != nil && !rueidis.IsRedisNil(err) {
			if !r.wait(ctx, err, &back) {
				return
			}
			continue
		}
		r.connected.Store(true)
		back = firstBackoff
		entries := streams[r.cfg.Key]
		if len(entries) == 0 && last != "0-0" {
			// The read timed out: see whether the stream was reset under
			// LastID (one call a second at most, and only when idle).
			reset, err := r.streamReset(ctx, cl, last)
			if err != nil {
				if !r.wait(ctx, err, &back) {
					return
				}
				continue
			}
			if reset {
				// Re-read the new stream from its start. Its records came
				// after the last one applied, yet they are history to
				// ApplyFunc, as on start: read before the relay reached the
				// stream's end, they may be older than a second (a failover
				// to a replica behind, records buffered through an outage),
				// and a user taking news as "computed now" (cache_aware's
				// speculative entries) must not take them so.
				zero := "0-0"
				r.lastID.Store(&zero)
				r.resets.Add(1)
				history = true
				continue
			}
		}
		for _, e := range entries {
			if e.FieldValues[InstanceField] != r.cfg.Instance {
				r.apply(e.FieldValues, history)
				r.applied.Add(1)
				if ms, ok := idMillis(e.ID); ok {
					r.lag.Store(max(time.Now().UnixMilli()-ms, 0))
				}
			}
			id := e.ID
			r.lastID.Store(&id)
		}
		if len(entries) < defaultBatch {
			history = false // caught up: what follows is news
		}
	}
}

// streamReset reports whether the stream holds no record at or after last
// while last is an id the reader got from it: the key is gone or empty,
// or its newest id is below last (new ids will be too, so XREAD from last
// would never return anything again).
func (r *Relay) streamReset(ctx context.Context, cl rueidis.Client, last string) (bool, error) {
	es, err := cl.Do(ctx, cl.B().Xrevrange().Key(r.cfg.Key).End("+").Start("-").Count(1).Build()).AsXRange()
	if err != nil && !rueidis.IsRedisNil(err) {
		return false, err
	}
	if len(es) == 0 {
		// Gone or emptied: whatever is added next is new.
		return true, nil
	}
	return idLess(es[0].ID, last), nil
}

// idLess reports whether stream id a is below b ("ms-seq", both parts
// unsigned 64-bit); false when either does not parse.
func idLess(a, b string) bool {
	am, as, ok1 := parseID(a)
	bm, bs, ok2 := parseID(b)
	if !ok1 || !ok2 {
		return false
	}
	return am < bm || am == bm && as < bs
}

func parseID(id string) (ms, seq uint64, ok bool) {
	m, s, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseUint(m, 10, 64)
	seq, err2 := strconv.ParseUint(s, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}

// idMillis is id's time part, in Unix milliseconds.
func idMillis(id string) (int64, bool) {
	ms, _, ok := parseID(id)
	return int64(ms), ok && ms <= math.MaxInt64
}

// Stats reports the counters and the Redis state.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	pending := r.n
	r.mu.Unlock()
	st := Stats{
		Instance: r.cfg.Instance, Connected: r.connected.Load(),
		Published: r.published.Load(), Applied: r.applied.Load(),
		Dropped: r.dropped.Load(), Errors: r.errs.Load(), Pending: pending,
		LagMillis: r.lag.Load(), LastID: *r.lastID.Load(), Resets: r.resets.Load(),
	}
	if e := r.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// Close stops the goroutines and closes the connection. Records not yet
// published are dropped.
func (r *Relay) Close() {
	r.closeMu.Do(func() {
		r.cancel()
		r.wg.Wait()
		if cl := r.cl.Load(); cl != nil {
			(*cl).Close()
		}
	})
}
