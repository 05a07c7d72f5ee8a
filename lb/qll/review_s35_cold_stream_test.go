package qll

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// streamEngine is a batching engine that streams: up to servers requests
// run at once, each answers its first token ttft after it starts and
// ends service later (its whole duration; the queue inside it is FCFS).
// Its first request's prefill is cold (a long system prompt not cached
// yet): coldExtra seconds longer, first token included.
type streamEngine struct {
	servers        int
	ttft, service  float64
	coldExtra      float64
	free           []float64
	started, ended int
}

// admit returns when a request arriving at now gets its first token and
// when it ends.
func (m *streamEngine) admit(now float64) (first, end float64) {
	if len(m.free) < m.servers {
		m.free = append(m.free, make([]float64, m.servers-len(m.free))...)
	}
	i := 0
	for j := range m.free {
		if m.free[j] < m.free[i] {
			i = j
		}
	}
	start := max(now, m.free[i])
	extra := 0.0
	if m.started == 0 {
		extra = m.coldExtra
	}
	m.started++
	first, end = start+m.ttft+extra, start+m.service+extra
	m.free[i] = end
	return first, end
}

// streamDriver keeps one engine saturated and reports each request's
// first token and end in virtual time, as the proxy's trace does for a
// stream: first bytes come while other streams are still answering.
type streamDriver struct {
	s    *State
	m    *streamEngine
	now  float64
	live []streamed
}

type streamed struct {
	l              *Lease
	at, first, end float64
	firstDelivered bool // the first byte was reported
}

// step dispatches what the state lets through, then delivers the next
// event (a first byte or an end).
func (d *streamDriver) step(t *testing.T) {
	t.Helper()
	for {
		l, err := d.s.Acquire(context.Background())
		if errors.Is(err, lb.ErrQueueFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		first, end := d.m.admit(d.now)
		d.live = append(d.live, streamed{l: l, at: d.now, first: first, end: end})
	}
	if len(d.live) == 0 {
		t.Fatal("nothing in flight and nothing dispatched")
	}
	i, at := -1, 0.0
	for j, e := range d.live {
		next := e.end
		if !e.firstDelivered {
			next = e.first
		}
		if i < 0 || next < at {
			i, at = j, next
		}
	}
	d.now = at
	e := &d.live[i]
	if !e.firstDelivered {
		e.firstDelivered = true
		e.l.FirstByte(time.Duration((e.first - e.at) * float64(time.Second)))
		return
	}
	e.l.Release(lb.Outcome{Kind: lb.Success, Streamed: true,
		Latency: time.Duration((e.first - e.at) * float64(time.Second)),
		Total:   time.Duration((e.end - e.at) * float64(time.Second))})
	d.m.ended++
	d.live = append(d.live[:i], d.live[i+1:]...)
}

func (d *streamDriver) slots() int {
	for _, r := range d.s.Snapshot().Replicas {
		return r.Parallelism
	}
	return -1
}

// A one-at-a-time server that streams answers one request at a time (a
// first token only once the one before has ended): its cold first
// request still voids the baseline and drains it to one, as before.
func TestReviewS35AOneAtATimeStreamerIsStillRelearnedAfterAColdFirstRequest(t *testing.T) {
	m := &streamEngine{servers: 1, ttft: 0.05, service: 0.2, coldExtra: 4}
	s := New(Config{QueueMaxSize: -1})
	s.SetReplicas([]string{"tts:1"})
	t.Cleanup(s.Close)
	d := &streamDriver{s: s, m: m}
	for m.ended < 1200 {
		d.step(t)
	}
	if got := d.slots(); got > 1 {
		t.Fatalf("slots = %d on a one-at-a-time streaming server after a cold first request, want 1", got)
	}
}
