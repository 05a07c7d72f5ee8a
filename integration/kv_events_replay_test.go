package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// cache_aware with kv_events_replay_port: a message the engine published
// but Sluice never received is fetched from the engine's replay socket
// (vLLM's replay_endpoint protocol), so health counts a recovered replay
// and no gap; a reload that changes the port uses the new one. Ports:
// Caddy 9186, replica 9187, ZMQ 5589, replay 5582 then 5583.

// replayEngine is a publisher in vLLM's shape (see lb/kvevents/replay.go):
// a PUB dialing Sluice, each message kept in a buffer, and a ROUTER that
// answers [id, "", start] with [id, "", seq, payload] per buffered
// message from start on and [id, "", ff×8, ""] at the end.
type replayEngine struct {
	t      *testing.T
	topic  string
	pub    zmq4.Socket
	router zmq4.Socket
	done   chan struct{}
	mu     sync.Mutex
	seq    uint64
	buf    [][]byte // payloads, index = seq
}

func (e *replayEngine) serveOn(port int) {
	e.t.Helper()
	if e.router != nil {
		_ = e.router.Close()
		<-e.done
	}
	e.router, e.done = zmq4.NewRouter(context.Background()), make(chan struct{})
	if err := e.router.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", port)); err != nil {
		e.t.Fatal(err)
	}
	go func(router zmq4.Socket, done chan struct{}) {
		defer close(done)
		for {
			msg, err := router.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			var s [8]byte
			e.mu.Lock()
			for seq := start; seq < uint64(len(e.buf)); seq++ {
				binary.BigEndian.PutUint64(s[:], seq)
				_ = router.SendMulti(zmq4.NewMsgFrom(id, []byte{}, s[:], e.buf[seq]))
			}
			e.mu.Unlock()
			_ = router.SendMulti(zmq4.NewMsgFrom(id, []byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{}))
		}
	}(e.router, e.done)
}

// publish sends the next message (lost: only buffered, as if it never
// reached Sluice).
func (e *replayEngine) publish(lost bool) {
	e.t.Helper()
	payload, _ := msgpack.Marshal([]any{float64(time.Now().Unix()), []any{[]any{"AllBlocksCleared"}}})
	e.mu.Lock()
	defer e.mu.Unlock()
	if !lost {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], e.seq)
		if err := e.pub.SendMulti(zmq4.NewMsgFrom([]byte(e.topic), s[:], payload)); err != nil {
			e.t.Fatal(err)
		}
	}
	e.buf = append(e.buf, payload)
	e.seq++
}

func TestKVEventsReplayFillsAGap(t *testing.T) {
	const replica = "127.0.0.1:9187"
	url := "http://127.0.0.1:9186"
	config := func(replayPort int) string {
		return globals + fmt.Sprintf(`
:9186 {
	custom_router kvr
	reverse_proxy {
		dynamic custom_router kvr
		lb_policy cache_aware {
			pool kvr
			kv_events tcp://127.0.0.1:5589
			kv_events_tokenizer llmd_sim
			kv_events_replay_port %d
		}
	}
}
`, replayPort) + sims(9187)
	}
	startCaddy(t, config(5582))
	setBackends(t, url, "http://"+replica)

	e := &replayEngine{t: t, topic: "kv@" + replica + "@m", pub: zmq4.NewPub(context.Background())}
	defer e.pub.Close()
	if err := e.pub.Dial("tcp://127.0.0.1:5589"); err != nil {
		t.Fatal(err)
	}
	e.serveOn(5582)
	defer func() {
		_ = e.router.Close()
		<-e.done
	}()
	// served sends one request through the proxy; it must be served.
	// (The replica is a site of the Caddy the test reloads: reload waits
	// until the old config's replica server has closed its listener, which
	// CI once met right after the reload: "connection reset by peer".)
	served := func() {
		t.Helper()
		if o := complete(url); o.err != nil || o.status != 200 {
			t.Fatalf("request: %+v", o)
		}
	}
	// The pool learns its replica from a request; the PUB drops messages
	// until the subscription reaches it.
	eventually(t, "the first batch", func() bool {
		served()
		e.publish(false)
		return getKVHealth(t, url).Totals["batches"] > 0
	})
	// gap loses a message and sends the next: one more recovered replay,
	// no gap counted.
	gap := func() {
		t.Helper()
		before := getKVHealth(t, url).Totals
		outcomes := func(tot map[string]uint64) uint64 {
			return tot["replays_recovered"] + tot["replays_failed"] + tot["replays_too_old"]
		}
		e.publish(true)
		e.publish(false)
		eventually(t, "the replay's outcome", func() bool {
			return outcomes(getKVHealth(t, url).Totals) > outcomes(before)
		})
		if tot := getKVHealth(t, url).Totals; tot["replays_recovered"] != before["replays_recovered"]+1 || tot["gaps"] != before["gaps"] {
			t.Fatalf("totals %v, before %v: want one more recovered replay and no gap", tot, before)
		}
	}
	gap()
	if m := metricsText(t, url); !strings.Contains(m, `sluice_kv_events_replays_total{pool="kvr",result="recovered"} 1`) {
		t.Errorf("metrics lack the recovered replay:\n%s", grepLines(m, "sluice_kv_events_replays"))
	}

	// A reload that changes the port rebuilds the state: the new port is
	// the one asked (nothing answers on the old one any more).
	reload(t, config(5583))
	setBackends(t, url, "http://"+replica)
	e.serveOn(5583)
	eventually(t, "the new state to know the replica", func() bool {
		served()
		before := getKVHealth(t, url).Totals["batches"]
		e.publish(false)
		return getKVHealth(t, url).Totals["batches"] > before
	})
	gap()
	drained(t, url)
}
