// Package share makes the cache_aware trees of many Sluice instances one
// view: each instance publishes the (model, prompt, replica) of its own
// routing decisions on a Redis stream per pool, and a reader applies the
// other instances' entries to its local Router. The pick stays local: no
// Redis call on the request path. The stream's machinery (buffered
// publishing, replay on start, back-off) is lb/streamrelay's.
package share

import (
	"strings"
	"unicode/utf8"

	"github.com/sluice-router/sluice/lb/kvevents"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/streamrelay"
)

// Defaults.
const (
	DefaultStreamLen = streamrelay.DefaultStreamLen
	DefaultBuffer    = streamrelay.DefaultBuffer
	DefaultMaxText   = 32768
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

// Key is the pool's stream key; one hash tag, so a cluster works.
func Key(prefix, pool string) string {
	return redisconn.KeyTag(prefix, pool) + ":cache_tree"
}

// ApplyFunc records another instance's routing decision locally
// (cacheaware.Picker.PeerRouted); saltTag is its cache_salt's tag ("" for
// none); history is true for the decisions replayed on start, false for
// news.
type ApplyFunc func(model, text, addr, saltTag string, history bool)

// Stats are the sharer's counters and state.
type Stats = streamrelay.Stats

// Sharer publishes this instance's inserts and applies the others'.
type Sharer struct {
	r       *streamrelay.Relay
	maxText int
}

// New starts sharing: see streamrelay.New. Close stops it.
func New(cfg Config, apply ApplyFunc) *Sharer {
	if cfg.MaxText <= 0 {
		cfg.MaxText = DefaultMaxText
	}
	s := &Sharer{maxText: cfg.MaxText}
	conn := cfg.Conn.WithDefaults()
	s.r = streamrelay.New(streamrelay.Config{Conn: conn, Key: Key(conn.KeyPrefix, cfg.Pool), Instance: cfg.Instance,
		StreamLen: cfg.StreamLen, Buffer: cfg.Buffer,
		// An entry: model and text as bounded here, the replica's address
		// (host and port: 1 KiB is ample), a salt tag, four one-byte field
		// names.
		MaxRecordBytes: MaxModelBytes + utf8.UTFMax*cfg.MaxText + 1024 + kvevents.SaltTagLen + 4,
	}, func(f map[string]string, history bool) {
		// A peer's entries are bounded as our own are (the stream is
		// outside input); a tag that is not one is refused where it is
		// used (kvevents.ValidSaltTag).
		apply(cutBytes(f["m"], MaxModelBytes), cut(f["t"], s.maxText), f["a"], cutBytes(f["s"], kvevents.SaltTagLen+1), history)
	})
	return s
}

// Instance is this instance's id in the stream.
func (s *Sharer) Instance() string { return s.r.Instance() }

// Publish queues one routing decision; it never blocks on Redis. A full
// buffer drops its oldest entry (counted in Dropped). A salted request's
// entry carries its salt's tag ("s"), never the salt (a tenant's secret);
// an unsalted one has no such field, as entries had before it.
func (s *Sharer) Publish(model, text, addr, salt string) {
	if text == "" {
		return
	}
	if salt != "" {
		s.r.Publish("m", cutBytes(model, MaxModelBytes), "t", cut(text, s.maxText), "a", addr, "s", kvevents.SaltTag(salt))
		return
	}
	s.r.Publish("m", cutBytes(model, MaxModelBytes), "t", cut(text, s.maxText), "a", addr)
}

// Stats reports the counters and the Redis state.
func (s *Sharer) Stats() Stats { return s.r.Stats() }

// Close stops the goroutines and closes the connection. Entries not yet
// published are dropped.
func (s *Sharer) Close() { s.r.Close() }

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
