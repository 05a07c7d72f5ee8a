package kvevents

import (
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/streamrelay"
)

// RelayKey is the pool's KV-event stream: one hash tag, so a cluster
// works.
func RelayKey(prefix, pool string) string {
	return redisconn.KeyTag(prefix, pool) + ":kv_events"
}

// Relay makes the KV events each instance receives every instance's: an
// engine publishes to one address (one Sluice instance), so each instance
// relays the messages its socket applied, as they came (topic, sequence,
// payload), on the pool's Redis stream, and injects the other instances'
// into its own index with the checks of its socket. Sequences stay the
// engine's, so a message lost on the way is a gap here as on the socket.
type Relay struct {
	r     *streamrelay.Relay
	untap func()
}

// MaxRelayPayload bounds the payload of a relayed message: the stream
// keeps about 10,000 of them in the Redis other features share. A larger
// one (a step storing some 200,000 tokens at once) is not relayed and is
// counted dropped; the other instances see a gap there.
const MaxRelayPayload = 1 << 20

// Record fields.
const (
	relayTopic   = "t"
	relaySeq     = "s"
	relayPayload = "p"
)

// NewRelay relays l's messages through cfg's stream (cfg.Key: RelayKey).
// An index that has applied nothing yet replays the stream's history
// first; one that has skips it (its state covers the past).
func NewRelay(cfg streamrelay.Config, l *Listener) *Relay {
	cfg.FromNow = l.ix.Stats().Batches > 0
	// A record: topic, sequence and payload as the socket's checks bound
	// them, and three one-byte field names.
	cfg.MaxRecordBytes = maxTopicBytes + 8 + MaxRelayPayload + 3
	r := &Relay{}
	r.r = streamrelay.New(cfg, func(f map[string]string, _ bool) {
		// Outside input: DecodeMessage checks every frame as it checks
		// the socket's (a missing field is an empty frame, dropped).
		l.Inject([][]byte{[]byte(f[relayTopic]), []byte(f[relaySeq]), []byte(f[relayPayload])})
	})
	r.untap = l.Tap(func(frames [][]byte) {
		if len(frames[2]) > MaxRelayPayload {
			r.r.CountDropped() // the others see a gap
			return
		}
		r.r.Publish(relayTopic, string(frames[0]), relaySeq, string(frames[1]), relayPayload, string(frames[2]))
	})
	return r
}

// Stats are the relay's counters and Redis state.
func (r *Relay) Stats() streamrelay.Stats { return r.r.Stats() }

// Close stops relaying; records not yet published are dropped.
func (r *Relay) Close() {
	r.untap()
	r.r.Close()
}
