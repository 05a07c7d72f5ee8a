package kvevents

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/lb/streamrelay"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func relayPool(t *testing.T) string {
	return strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + fmt.Sprint(time.Now().UnixNano())
}

// relayInstance is one Sluice instance's listener, index and relay.
type relayInstance struct {
	ix *Index
	l  *Listener
	r  *Relay
}

func newRelayInstance(t *testing.T, tg redistest.Target, pool string) *relayInstance {
	t.Helper()
	in := &relayInstance{ix: NewIndex(Config{})}
	in.l = listenAny(t, ListenerConfig{Index: in.ix, Resolve: resolveAll})
	in.r = NewRelay(streamrelay.Config{Conn: tg.Conn, Key: RelayKey("", pool)}, in.l)
	t.Cleanup(func() {
		in.r.Close()
		_ = in.l.Close()
	})
	return in
}

func (in *relayInstance) holds(prompt []uint32, replica string) int {
	return in.ix.Match(in.ix.Keys(prompt), []string{replica})[0]
}

// An engine publishes to one instance; another instance's index holds what
// the engine stores and forgets what it removes, through the relay, and
// no instance applies its own records.
func TestRelayGivesEveryInstanceTheEvents(t *testing.T) { redistest.Each(t, testRelayEveryInstance) }

func testRelayEveryInstance(t *testing.T, tg redistest.Target) {
	pool := relayPool(t)
	a := newRelayInstance(t, tg, pool)
	b := newRelayInstance(t, tg, pool)
	pub := newPub(t, endpoint(a.l))
	defer pub.Close()

	prompt := seqTokens(0, 32)
	const pod = "127.0.0.1:9170"
	topic := "kv@" + pod + "@m"
	seq := uint64(1)
	// Until the subscription reaches the publisher, a removal of a block
	// never stored; then the store once (sent twice it would be two
	// copies of each block, which one removal would not take out).
	waitFor(t, "the first batch on a", func() bool {
		send(t, pub, topic, seq, batchPayload(t, vllmRemoved(77)))
		seq++
		return a.ix.Stats().Batches > 0
	})
	send(t, pub, topic, seq, batchPayload(t, vllmStored(anyHashes(1, 2), nil, prompt, 16)))
	seq++
	waitFor(t, "a to hold both blocks", func() bool { return a.holds(prompt, pod) == 2 })
	waitFor(t, "b to hold both blocks", func() bool { return b.holds(prompt, pod) == 2 })
	send(t, pub, topic, seq, batchPayload(t, vllmRemoved(2)))
	waitFor(t, "b to forget the removed block", func() bool { return b.holds(prompt, pod) == 1 })
	if s := b.ix.Stats(); s.Gaps != 0 || s.Restarts != 0 {
		t.Errorf("b saw gaps %d, restarts %d: the relay must keep the engine's sequence", s.Gaps, s.Restarts)
	}
	if st := a.r.Stats(); st.Applied != 0 || st.Published < 2 {
		t.Errorf("a's relay %+v: want its own records published, none applied", st)
	}
	if st := b.r.Stats(); st.Applied < 2 || st.Published != 0 {
		t.Errorf("b's relay %+v: want a's records applied, none published", st)
	}
}

// A message that reached the index already (the same sequence number
// again) is dropped, not taken for a publisher restart that would clear
// the replica.
func TestDuplicateMessageIsDropped(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(0, 32)
	const topic = "kv@127.0.0.1:9171@m"
	m := mustMessage(t, topic, 7, batchPayload(t, vllmStored(anyHashes(1, 2), nil, prompt, 16)))
	if !ix.Apply("r", m, time.Now()) {
		t.Fatal("first message dropped")
	}
	if ix.Apply("r", m, time.Now()) {
		t.Error("the duplicate was applied")
	}
	s := ix.Stats()
	if got := ix.Match(ix.Keys(prompt), []string{"r"})[0]; got != 2 || s.Restarts != 0 || s.Drops[ReasonDuplicate] != 1 {
		t.Errorf("after a duplicate: %d blocks, %d restarts, drops %v; want 2, 0, 1 duplicate", got, s.Restarts, s.Drops)
	}
}

// An instance that starts late replays the stream's history into its
// fresh index; one whose index already holds state skips the history.
func TestRelayReplaysHistoryIntoAFreshIndexOnly(t *testing.T) {
	redistest.Each(t, testRelayReplay)
}

func testRelayReplay(t *testing.T, tg redistest.Target) {
	pool := relayPool(t)
	a := newRelayInstance(t, tg, pool)
	pub := newPub(t, endpoint(a.l))
	defer pub.Close()
	prompt := seqTokens(100, 32)
	const pod = "127.0.0.1:9172"
	seq := uint64(1)
	waitFor(t, "the batch on a", func() bool {
		send(t, pub, "kv@"+pod+"@m", seq, batchPayload(t, vllmStored(anyHashes(11, 12), nil, prompt, 16)))
		seq++
		return a.holds(prompt, pod) == 2
	})
	waitFor(t, "a's records in the stream", func() bool {
		st := a.r.Stats()
		return st.Published >= 1 && st.Pending == 0
	})

	late := newRelayInstance(t, tg, pool)
	waitFor(t, "the late instance to replay the history", func() bool { return late.holds(prompt, pod) == 2 })

	// An instance whose index applied something already (its socket's
	// own engines): old records would only be older news.
	busy := &relayInstance{ix: NewIndex(Config{})}
	busy.ix.Apply("127.0.0.1:9173", mustMessage(t, "kv@127.0.0.1:9173@m", 1,
		batchPayload(t, vllmStored(anyHashes(21), nil, seqTokens(500, 16), 16))), time.Now())
	l := listenAny(t, ListenerConfig{Index: busy.ix, Resolve: resolveAll})
	defer l.Close()
	r := NewRelay(streamrelay.Config{Conn: tg.Conn, Key: RelayKey("", pool)}, l)
	defer r.Close()
	waitFor(t, "the busy instance's reader", func() bool { return r.Stats().Connected && r.Stats().LastID != "0-0" })
	// A new record reaches it; the old ones never did.
	next := seqTokens(200, 16)
	send(t, pub, "kv@"+pod+"@m", seq, batchPayload(t, vllmStored(anyHashes(13), nil, next, 16)))
	waitFor(t, "the new record", func() bool { return r.Stats().Applied >= 1 })
	time.Sleep(100 * time.Millisecond)
	if got := busy.ix.Match(busy.ix.Keys(prompt), []string{pod})[0]; got != 0 {
		t.Errorf("the busy instance replayed the history: holds %d blocks of the old prompt", got)
	}
	if st := r.Stats(); st.Applied != 1 {
		t.Errorf("busy instance applied %d records, want only the new one", st.Applied)
	}
}

// Records another writer put in the stream are outside input: malformed
// ones are dropped with a reason, never a panic, and good ones after them
// still apply.
func TestRelayDropsHostileRecords(t *testing.T) { redistest.Each(t, testRelayHostile) }

func testRelayHostile(t *testing.T, tg redistest.Target) {
	pool := relayPool(t)
	b := newRelayInstance(t, tg, pool)
	cl := redistest.Client(t, tg.Conn)
	key := RelayKey("", pool)
	add := func(fv ...string) {
		t.Helper()
		cmd := cl.B().Xadd().Key(key).Id("*").FieldValue().FieldValue(streamrelay.InstanceField, "hostile")
		for i := 0; i < len(fv); i += 2 {
			cmd = cmd.FieldValue(fv[i], fv[i+1])
		}
		if err := cl.Do(context.Background(), cmd.Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	const pod = "127.0.0.1:9175"
	good := frames("kv@"+pod+"@m", 1, batchPayload(t, vllmStored(anyHashes(1, 2), nil, seqTokens(0, 32), 16)))
	add()                                                                   // no fields
	add("t", "not a topic", "s", string(good[1]), "p", string(good[2]))     // bad topic
	add("t", string(good[0]), "s", "1", "p", string(good[2]))               // short sequence
	add("t", string(good[0]), "s", string(good[1]), "p", "\xc1\xff")        // malformed payload
	add("t", "kv@10.1.1.1:1@m", "s", string(good[1]), "p", string(good[2])) // no replica
	add("t", string(good[0]), "s", string(good[1]), "p", string(good[2]))   // good
	waitFor(t, "the good record", func() bool { return b.holds(seqTokens(0, 32), pod) == 2 })
	d := b.ix.Stats().Drops
	if d[ReasonTopic] != 2 || d[ReasonSeq] != 1 || d[ReasonMalformed] != 1 || d[ReasonUnknownPod] != 1 {
		t.Errorf("drops %v, want 2 topic, 1 seq, 1 malformed, 1 unknown_pod", d)
	}
}

// A message over MaxRelayPayload reaches this instance's index but is not
// put in the stream (counted dropped): the stream lives in a Redis other
// features share.
func TestRelayKeepsOversizedMessagesOutOfRedis(t *testing.T) {
	tg := redistest.Targets(t)[0]
	pool := relayPool(t)
	a := newRelayInstance(t, tg, pool)
	pub := newPub(t, endpoint(a.l))
	defer pub.Close()
	const pod = "127.0.0.1:9176"
	// 16,384 blocks of 16 tokens with ids past 2^16: over 1 MiB of msgpack.
	big := seqTokens(1<<20, 16384*16)
	hashes := make([]any, 16384)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	payload := batchPayload(t, vllmStored(hashes, nil, big, 16))
	if len(payload) <= 1<<20 {
		t.Fatalf("test payload of %d bytes is not over the bound", len(payload))
	}
	seq := uint64(1)
	waitFor(t, "the big batch on a", func() bool {
		send(t, pub, "kv@"+pod+"@m", seq, payload)
		seq++
		return a.holds(big[:32], pod) == 2
	})
	waitFor(t, "the drop counted", func() bool { return a.r.Stats().Dropped >= 1 })
	cl := redistest.Client(t, tg.Conn)
	n, err := cl.Do(context.Background(), cl.B().Xlen().Key(RelayKey("", pool)).Build()).AsInt64()
	if err != nil || n != 0 || a.r.Stats().Published != 0 {
		t.Errorf("stream holds %d records (%v), published %d: want none", n, err, a.r.Stats().Published)
	}
}
