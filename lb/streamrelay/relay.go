// Package streamrelay carries one kind of record between Sluice instances
// through a Redis stream: each instance publishes its own records and
// applies the others'. Publishing is asynchronous through a buffer bounded
// in records and in bytes that drops its oldest record when Redis is slow
// or away, so the caller never waits on Redis; the reader resumes from the
// last record it applied, or from the oldest one the stream still holds
// (MAXLEN ~ StreamLen), so a new instance and one back from a Redis outage
// catch up on the recent history. A stream reset under the reader (key
// deleted, Redis back empty, ids gone below the last one read) is noticed
// when a read comes back empty and re-read from its start (Stats.Resets).
// A read Redis leaves unanswered past its block time and the connection
// timeout (redisconn.ConnTimeout) fails, and the reader redials.
// The stream is outside input (anyone with write access to the key): the
// reader skips a record over the size bounds (Stats.Oversize) and cuts a
// reply from Redis before the client holds more than ReadBytes of it (the
// cut drops the connection, once per such record: while one is the newest,
// the idle reset check asks a script for the newest id alone).
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
	DefaultStreamLen      = 10000
	DefaultBuffer         = 4096
	DefaultBufferBytes    = 64 << 20
	DefaultMaxRecordBytes = 1 << 20
	DefaultReadBytes      = 16 << 20
	defaultBatch          = 256
	blockMillis           = 1000
	maxBackoff            = 5 * time.Second
	firstBackoff          = 100 * time.Millisecond
)

// InstanceField is the field naming the publishing instance; users must
// not set it.
const InstanceField = "i"

const (
	// maxRecordFields bounds a record's fields (InstanceField aside).
	maxRecordFields = 64
	// instanceBytes is what a record read may hold beyond MaxRecordBytes:
	// its InstanceField (a host name and a random suffix).
	instanceBytes = 1024
	// replyBytes is what an XREAD reply holds beside its entries (the
	// key, the arrays around them).
	replyBytes = 1024
)

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
	// BufferBytes bounds the bytes (fields and values) of the records
	// waiting to be published and of the batch in flight, together
	// (default DefaultBufferBytes; at least MaxRecordBytes). Past it the
	// oldest waiting records are dropped, as past Buffer (the new one
	// when the batch in flight alone leaves it no room).
	BufferBytes int64
	// MaxRecordBytes bounds one record's fields and values, in bytes
	// (default DefaultMaxRecordBytes); a record also has at most 64
	// fields. Publish drops a larger record (Stats.Dropped); the reader
	// skips one (Stats.Oversize) without applying it.
	MaxRecordBytes int
	// ReadBytes bounds what one read from the stream may make the client
	// hold (default DefaultReadBytes; at least one record's worth): the
	// strings of the reply and 64 bytes per array element. A reply over
	// it is cut before the string or array that would pass it is
	// allocated, and read again record by record; a record alone over it
	// is skipped (Stats.Oversize). A read asks for as many records as fit
	// (XREAD COUNT, at most 256).
	ReadBytes int64
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
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	c.BufferBytes = max(c.BufferBytes, int64(c.MaxRecordBytes))
	if c.ReadBytes <= 0 {
		c.ReadBytes = DefaultReadBytes
	}
	c.ReadBytes = max(c.ReadBytes, replyBytes+c.entryReadBytes())
	if c.Instance == "" {
		c.Instance = redisconn.InstanceID("")
	}
	return c
}

// entryReadBytes is the most a stream entry within the bounds costs a
// read (as boundedConn counts): its fields and values, its id, and the
// arrays holding them.
func (c Config) entryReadBytes() int64 {
	const maxIDBytes = 41
	return int64(c.MaxRecordBytes) + instanceBytes + maxIDBytes + elementBytes*(3+2*(maxRecordFields+1))
}

// readCount is how many entries a read asks for: as many as fit in
// ReadBytes, so records within the bounds never make a reply cut.
func (c Config) readCount() int64 {
	return min(max((c.ReadBytes-replyBytes)/c.entryReadBytes(), 1), defaultBatch)
}

// oversize reports whether a record read is over the bounds.
func (c Config) oversize(fields map[string]string) bool {
	if len(fields) > maxRecordFields+1 {
		return true
	}
	n := 0
	for f, v := range fields {
		n += len(f) + len(v)
	}
	return n > c.MaxRecordBytes+instanceBytes
}

// ApplyFunc receives another instance's record: its fields as read from
// Redis (outside input: the user bounds and checks them), and whether it
// is history (read before the relay first reached the stream's end: a
// replay on start) rather than news.
type ApplyFunc func(fields map[string]string, history bool)

// Stats are the relay's counters and state.
type Stats struct {
	Instance  string `json:"instance"`
	Connected bool   `json:"connected"`
	Published uint64 `json:"published"`
	Applied   uint64 `json:"applied"`
	Dropped   uint64 `json:"dropped"`
	Errors    uint64 `json:"errors"`
	// Pending counts the records waiting to be published; PendingBytes
	// is their bytes and the batch in flight's (at most BufferBytes).
	Pending      int   `json:"pending"`
	PendingBytes int64 `json:"pending_bytes"`
	// Oversize counts records read and skipped for their size (over
	// MaxRecordBytes or 64 fields, or alone over ReadBytes).
	Oversize uint64 `json:"oversize"`
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

	buf  *publishBuffer
	wake chan struct{}

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
	oversize                          atomic.Uint64 // Stats.Oversize
}

// New starts relaying: a goroutine connects (retrying with back-off while
// Redis is away), then one publishes and one reads. Close stops them.
func New(cfg Config, apply ApplyFunc) *Relay {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{cfg: cfg, apply: apply, buf: newPublishBuffer(cfg.Buffer, cfg.BufferBytes),
		wake: make(chan struct{}, 1), cancel: cancel}
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
// buffer (Buffer records or BufferBytes) drops its oldest record, and a
// record over MaxRecordBytes or 64 fields is not queued (both counted in
// Dropped).
func (r *Relay) Publish(fieldValues ...string) {
	if len(fieldValues)%2 != 0 {
		panic("streamrelay: Publish needs field, value pairs")
	}
	rec := record(fieldValues)
	if len(rec)/2 > maxRecordFields || rec.size() > int64(r.cfg.MaxRecordBytes) {
		r.dropped.Add(1) // the others would skip it
		return
	}
	r.dropped.Add(r.buf.push(rec))
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// CountDropped counts a record the user did not publish (too large for
// the stream, say) in Dropped, as the others see it missing.
func (r *Relay) CountDropped() { r.dropped.Add(1) }

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
			opt.DialCtxFn = dialBounded(r.cfg.ReadBytes)
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
		// A quarter of the byte budget at most in flight, so news has
		// room meanwhile.
		batch := r.buf.take(defaultBatch, r.cfg.BufferBytes/4)
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
		var sent, failed []record
		var ferr error
		for i, res := range res {
			if err := res.Error(); err != nil {
				failed = append(failed, batch[i])
				ferr = err
			} else {
				sent = append(sent, batch[i])
				r.published.Add(1)
			}
		}
		r.buf.settle(sent)
		if ferr == nil {
			r.connected.Store(true)
			back = firstBackoff
			continue
		}
		if ctx.Err() != nil {
			return
		}
		r.fail(ferr)
		r.dropped.Add(r.buf.requeue(failed))
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
	full := r.cfg.readCount()
	// After a reply cut for its size, the records it asked for are read
	// one at a time (slow of them left): those before the one over
	// ReadBytes fit, and that one is then cut alone and skipped, and
	// reads ask for full batches again (a read one at a time never comes
	// back short, so it would take news for history until the stream's
	// end came back empty).
	count, slow := full, int64(0)
	// huge is the id of a record found alone over ReadBytes (skipped, or
	// cut from newestID's reply): while it is the last one read, the
	// reset check asks for the newest id alone (newestIDAlone), so the
	// record is not read, and the connection not cut, again each second.
	huge := ""
	for ctx.Err() == nil {
		if !positioned {
			// The newest record's id ("$" would miss what is published
			// between two reads).
			id, found, cut, err := r.newestID(ctx, cl)
			if err != nil {
				if !r.wait(ctx, err, &back) {
					return
				}
				continue
			}
			if found {
				r.lastID.Store(&id)
			}
			if cut {
				huge = id
			}
			positioned = true
		}
		last := *r.lastID.Load()
		cmd := cl.B().Xread().Count(count).Block(blockMillis).Streams().Key(r.cfg.Key).Id(last).Build()
		// A deadline of its own: rueidis sends no keep-alive PING on a
		// connection while a blocking command is in flight, and TCP's
		// keep-alives are answered by a frozen Redis's kernel or by a
		// proxy whose backend went, so without one a read could wait on a
		// dead connection for good.
		rctx, cancel := context.WithTimeout(ctx, r.readDeadline())
		streams, err := cl.Do(rctx, cmd).AsXRead()
		cancel()
		if cut := asCut(err); cut != nil {
			if count > 1 {
				count, slow = 1, count
				continue
			}
			// The next record alone is over ReadBytes: its id is the
			// reply's second string (after the key).
			if id, ok := cut.string(1); ok && idLess(last, id) {
				r.oversize.Add(1)
				r.lastID.Store(&id)
				huge = id
				count, slow = full, 0
				continue
			}
		}
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
			reset, err := r.streamReset(ctx, cl, last, &huge)
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
			switch {
			case e.FieldValues[InstanceField] == r.cfg.Instance:
			case r.cfg.oversize(e.FieldValues):
				r.oversize.Add(1)
			default:
				r.apply(e.FieldValues, history)
				r.applied.Add(1)
				if ms, ok := idMillis(e.ID); ok {
					r.lag.Store(max(time.Now().UnixMilli()-ms, 0))
				}
			}
			id := e.ID
			r.lastID.Store(&id)
		}
		if int64(len(entries)) < count {
			history = false // caught up: what follows is news
		}
		if slow -= int64(len(entries)); slow <= 0 || len(entries) == 0 {
			count, slow = full, 0
		}
	}
}

// readDeadline bounds one blocking read: the time Redis blocks it, and
// what the connection allows a reply beside (redisconn.ConnTimeout).
func (r *Relay) readDeadline() time.Duration {
	return blockMillis*time.Millisecond + redisconn.ConnTimeout(r.cfg.Conn.ReadTimeout)
}

// newestID is the id of the stream's newest record (found false: the key
// is gone or empty). A newest record over ReadBytes is cut from the reply
// after its id, the reply's first string (cut true). The check goes on
// the client's pipelined connection, which the cut drops: the publisher's
// XADDs sent behind it fail and are published again, though Redis ran
// them (a dedicated connection would avoid that, but rueidis resets one it
// hands back with DISCARD and UNSUBSCRIBE, which the documented ACL user
// may not run). Only a hostile newest record costs that, once (the reader
// then asks newestIDAlone); the users take a record twice (a decision
// applied again, a KV-event message a duplicate).
func (r *Relay) newestID(ctx context.Context, cl rueidis.Client) (id string, found, cut bool, err error) {
	es, err := cl.Do(ctx, cl.B().Xrevrange().Key(r.cfg.Key).End("+").Start("-").Count(1).Build()).AsXRange()
	if c := asCut(err); c != nil {
		if id, ok := c.string(0); ok {
			if _, _, valid := parseID(id); valid {
				return id, true, true, nil
			}
		}
	}
	if err != nil && !rueidis.IsRedisNil(err) {
		return "", false, false, err
	}
	if len(es) == 0 {
		return "", false, false, nil
	}
	return es[0].ID, true, false, nil
}

// newestIDScript returns the newest record's id alone (nil when the key
// is gone or empty): the record stays in Redis, however large. EVALSHA
// and EVAL are in the documented ACL user's commands.
var newestIDScript = rueidis.NewLuaScript(`local e = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if e then return e[1] end
return false`)

// newestIDAlone is newestID for a stream whose newest record is known to
// be over ReadBytes. Only then: the plain XREVRANGE needs no scripting.
func (r *Relay) newestIDAlone(ctx context.Context, cl rueidis.Client) (id string, found bool, err error) {
	id, err = newestIDScript.Exec(ctx, cl, []string{r.cfg.Key}, nil).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false, nil
	}
	return id, err == nil, err
}

// streamReset reports whether the stream holds no record at or after last
// while last is an id the reader got from it: the key is gone or empty,
// or its newest id is below last (new ids will be too, so XREAD from last
// would never return anything again). huge is the id of a record known
// over ReadBytes (see readLoop); a newest record found so is recorded there.
func (r *Relay) streamReset(ctx context.Context, cl rueidis.Client, last string, huge *string) (bool, error) {
	var id string
	var found bool
	var err error
	if last == *huge {
		id, found, err = r.newestIDAlone(ctx, cl)
	} else {
		var cut bool
		id, found, cut, err = r.newestID(ctx, cl)
		if cut {
			*huge = id
		}
	}
	if err != nil || !found {
		// Gone or emptied: whatever is added next is new.
		return err == nil, err
	}
	return idLess(id, last), nil
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
	pending, pendingBytes := r.buf.pending()
	st := Stats{
		Instance: r.cfg.Instance, Connected: r.connected.Load(),
		Published: r.published.Load(), Applied: r.applied.Load(),
		Dropped: r.dropped.Load(), Errors: r.errs.Load(), Pending: pending, PendingBytes: pendingBytes,
		Oversize:  r.oversize.Load(),
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
