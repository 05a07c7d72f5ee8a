package redisleast

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// Redis can come back with older data: restarted from an RDB snapshot or
// after an AOF everysec crash, or a replica promoted that had not received
// the last writes. Releases it acknowledged are then undone (their
// records count again, and nothing reaps a live instance: with
// max_inflight the pool would shed or queue for good), picks it
// acknowledged are gone (their requests count nowhere), and in the
// queueing mode waiters that had left come back (the queue hands them
// slots that nobody releases).
//
// Detection: every script that writes an instance's records (or renews
// it, changes the member set for it, or takes one of its waiters out of
// the queue) raises the instance's version, field "!" of its hash, and
// answers it (bumpFn). The instance
// keeps the highest version Redis acknowledged (identity.acked). A call
// sent after that acknowledgement ran after the write it acknowledged, so
// it must answer a higher version; an answer at or below it means Redis
// lost writes (or a reaper took the instance for dead and deleted its
// hash). The renewal is such a call, so an idle instance notices within
// one maintenance round (LeaseTTL/3).
//
// Reconciliation: at the next round the instance replays its member set
// and rewrites its own contribution from what it holds, in one script: a
// record it holds no lease for is dropped (and its replica decremented),
// a lease it holds that has no record is recorded again, the version goes
// above every one acknowledged; in the queueing mode its waiters it no
// longer waits for leave the queue (the slots they were handed are among
// the dropped records) and the freed slots are dispatched. Meanwhile no
// pick or release of the instance touches its records (ownRecords.mu
// for the one-call picks and releases, the batcher's mutex for the
// batched ones), and the batcher has sent everything it kept, so what the
// instance holds is exactly what Redis should hold. Other instances
// reconcile their own records; dead ones are reaped as always. In the
// queueing mode a slot handed to a token the instance no longer knows
// after it reconciled is released by its next round (globalQueue.sweep).

// ownRecords is what this instance holds in Redis, for reconciliation.
type ownRecords struct {
	// mu is read-held by every one-call pick and release of the
	// instance's records (from before its script is sent until held
	// reflects it), and write-held by reconcile. Batched picks and
	// releases change held under the batcher's mutex instead, which
	// reconcile holds too (quiesce).
	mu    sync.RWMutex
	lmu   sync.Mutex
	held  Lease       // sentinel of the ring of leases recorded (or to be) in Redis
	stale atomic.Bool // Redis lost writes: reconcile at the next round
}

// hold links l (its Addr, ident and req set) into held.
func (o *ownRecords) hold(l *Lease) {
	o.lmu.Lock()
	h := &o.held
	if h.next == nil {
		h.next, h.prev = h, h
	}
	l.prev, l.next = h.prev, h
	h.prev.next = l
	h.prev = l
	o.lmu.Unlock()
}

// drop unlinks l, if held.
func (o *ownRecords) drop(l *Lease) {
	o.lmu.Lock()
	if l.next != nil {
		l.prev.next, l.next.prev = l.next, l.prev
		l.prev, l.next = nil, nil
	}
	o.lmu.Unlock()
}

// snapshot lists ident's leases as (request id, replica) pairs.
func (o *ownRecords) snapshot(ident *identity) []string {
	o.lmu.Lock()
	defer o.lmu.Unlock()
	var out []string
	for l := o.held.next; l != nil && l != &o.held; l = l.next {
		if l.ident == ident {
			out = append(out, l.req, l.Addr)
		}
	}
	return out
}

// maxVersion bounds an instance's version: a Lua number (a float64) adds
// 1 exactly only below 2^53, so from there on every answer would read as
// lost writes and the loop would reconcile without a pause. No instance
// bumps its version that often: Redis answering maxVersion means a
// corrupt one (versionFn), and the instance takes a fresh identity, as
// when its releases overflow pending_max (the reapers reclaim the old).
const (
	maxVersion    = 1 << 53
	maxVersionLua = "2^53" // maxVersion, in the scripts
)

// noteVersion takes in the version v that Redis answered for ident to a
// call sent when ident's highest acknowledged version was floor.
func (m *member) noteVersion(ident *identity, floor, v int64) {
	if v >= maxVersion {
		m.rotate(ident)
		return
	}
	if v <= floor {
		if ident == m.ident.Load() && !m.own.stale.Swap(true) {
			m.wake()
		}
		return
	}
	for {
		cur := ident.acked.Load()
		if v <= cur || ident.acked.CompareAndSwap(cur, v) {
			return
		}
	}
}

// versionOf reads the version at index i of a script's reply (0 if it
// has none).
func versionOf(arr []rueidis.RedisMessage, i int) int64 {
	if i >= len(arr) {
		return 0
	}
	v, _ := arr[i].AsInt64()
	return v
}

// reconcile rewrites this instance's records from the leases it holds
// (see above); on failure it stays stale and the next round tries again.
func (m *member) reconcile(ctx context.Context) {
	m.replaySet(ctx)
	m.own.mu.Lock()
	defer m.own.mu.Unlock()
	m.rec.quiesce(func() {
		ident := m.ident.Load()
		floor := ident.acked.Load()
		held := m.own.snapshot(ident)
		res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
			return m.rec.execReconcile(ctx, ident, floor, held)
		})
		arr, err := res.ToArray()
		if err != nil || len(arr) != 3 {
			return
		}
		m.own.stale.Store(false)
		m.noteVersion(ident, floor, versionOf(arr, 2))
	})
}

// releaseRecorded ends a lease recorded in Redis with one release script
// (or keeps the release for later: releaseNow).
func (m *member) releaseRecorded(l *Lease) {
	m.own.mu.RLock()
	defer m.own.mu.RUnlock()
	m.own.drop(l)
	m.releaseNow(l.ident, l.req)
}

// reconcileArgs are the arguments reconcileScript and its queueing
// variant start with.
func (m *member) reconcileArgs(ident *identity, floor int64) []string {
	return []string{strconv.FormatInt(m.conf().LeaseTTL.Milliseconds(), 10), ident.id, strconv.FormatInt(floor, 10)}
}
