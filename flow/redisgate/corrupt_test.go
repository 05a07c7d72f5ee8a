package redisgate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redistest"
)

// The pool's records in Redis are hostile until checked: a stray record
// (an instance's lease evicted by maxmemory, a crash, a hand edit) or a
// corrupt one must neither fail every claim — every instance on its
// fallback share for good — nor count capacity forever.

// corruptLease is the lease of the instances here: short, so that stray
// records lapse soon (at least 3 × the default read_timeout).
const corruptLease = time.Second

func corruptInstance(t *testing.T, tg redistest.Target, pool, name string, capacity int) *instance {
	t.Helper()
	return newInstance(t, tg.Conn, pool, name, capacity, func(c *Config) { c.LeaseTTL = corruptLease })
}

// redisNow is Redis's clock in ms: leases are kept by it.
func redisNow(t *testing.T, cl rueidis.Client) int64 {
	t.Helper()
	ts, err := cl.Do(context.Background(), cl.B().Time().Build()).AsStrSlice()
	if err != nil || len(ts) != 2 {
		t.Fatalf("TIME: %v %v", ts, err)
	}
	sec, _ := strconv.ParseInt(ts[0], 10, 64)
	usec, _ := strconv.ParseInt(ts[1], 10, 64)
	return sec*1000 + usec/1000
}

func mustDo(t *testing.T, cl rueidis.Client, cmd rueidis.Completed) {
	t.Helper()
	if err := cl.Do(context.Background(), cmd).Error(); err != nil {
		t.Fatal(err)
	}
}

// field is a hash field's value ("" and false when absent).
func field(t *testing.T, cl rueidis.Client, key, f string) (string, bool) {
	t.Helper()
	v, err := cl.Do(context.Background(), cl.B().Hget().Key(key).Field(f).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

func leased(t *testing.T, cl rueidis.Client, k Keys, inst string) bool {
	t.Helper()
	err := cl.Do(context.Background(), cl.B().Zscore().Key(k.Live).Member(inst).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// admitWithin enqueues one request at in: it must be admitted within d,
// by a share Redis counted — not by the fallback share.
func admitWithin(t *testing.T, in *instance, d time.Duration) *flow.Ticket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	tk, err := in.ctl.Enqueue(ctx, flow.Request{FlowID: "t"})
	if err != nil {
		t.Fatalf("%s: no unit within %v: %v (gate %+v)", in.name, d, err, in.gate.Stats())
	}
	if s := in.gate.Stats(); s.Fallback || s.RedisErrors != 0 || s.Held < 1 {
		tk.Release()
		t.Fatalf("%s: admitted after %v, but not by a share Redis counted: %+v", in.name, time.Since(start).Round(time.Millisecond), s)
	}
	return tk
}

// TestStrayHeldWithoutLeaseLapses: a held record of an instance with no
// lease (its lease evicted, or a crash left it) lapses within a lease,
// as a crashed instance's does, instead of holding the pool forever.
func TestStrayHeldWithoutLeaseLapses(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor(tg.Conn.KeyPrefix, pool)
		mustDo(t, cl, cl.B().Hset().Key(k.Held).FieldValue().FieldValue("ghost", "2").Build())
		a := corruptInstance(t, tg, pool, "a", 2)
		admitWithin(t, a, 3*corruptLease).Release()
		if _, ok := field(t, cl, k.Held, "ghost"); ok {
			t.Errorf("the stray held record is still there")
		}
	})
}

// TestEvictedLeasesKeepTheirUnits: the live set lost (maxmemory evicted
// it) while an instance's requests run must not free their units: the
// instance renews and keeps its record; no one is granted them meanwhile.
func TestEvictedLeasesKeepTheirUnits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor(tg.Conn.KeyPrefix, pool)
		a := corruptInstance(t, tg, pool, "a", 2)
		b := corruptInstance(t, tg, pool, "b", 2)
		running := []*flow.Ticket{admitWithin(t, b, 5*time.Second), admitWithin(t, b, 5*time.Second)}
		mustDo(t, cl, cl.B().Del().Key(k.Live).Build())
		ctx, cancel := context.WithTimeout(context.Background(), 2*corruptLease)
		defer cancel()
		if tk, err := a.ctl.Enqueue(ctx, flow.Request{FlowID: "t"}); err == nil {
			tk.Release()
			t.Fatalf("a admitted while b's 2 requests hold the pool of 2 (gate a %+v, b %+v)", a.gate.Stats(), b.gate.Stats())
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if !leased(t, cl, k, "b") || poolHeld(t, cl, k) < 2 {
			t.Errorf("b's lease or units lost: leased %v, pool holds %d", leased(t, cl, k, "b"), poolHeld(t, cl, k))
		}
		for _, tk := range running {
			tk.Release()
		}
		admitWithin(t, a, 5*time.Second).Release()
	})
}

// TestCorruptHeldValueIsDropped: a held value that is no count (text,
// negative, fractional, too large for a float to count exactly) must not
// fail the claims (it did: arithmetic on nil) nor stay for good.
func TestCorruptHeldValueIsDropped(t *testing.T) {
	cases := []struct {
		value string
		lease bool // the stray instance has a live lease
	}{
		{"abc", false}, {"abc", true}, {"", false}, {"-5", false}, {"1.5", false}, {"inf", false},
		{"0x10", false}, {"99999999999999999999", false},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%q", c.value)
		if c.lease {
			name += " leased"
		}
		t.Run(name, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, tg redistest.Target) {
				pool := uniquePool(t)
				cl := redistest.Client(t, tg.Conn)
				k := KeysFor(tg.Conn.KeyPrefix, pool)
				mustDo(t, cl, cl.B().Hset().Key(k.Held).FieldValue().FieldValue("ghost", c.value).Build())
				if c.lease {
					mustDo(t, cl, cl.B().Zadd().Key(k.Live).ScoreMember().ScoreMember(float64(redisNow(t, cl)+5000), "ghost").Build())
				}
				a := corruptInstance(t, tg, pool, "a", 2)
				admitWithin(t, a, 3*corruptLease).Release()
				if v, ok := field(t, cl, k.Held, "ghost"); ok {
					t.Errorf("the corrupt held value is still there: %q", v)
				}
				if s := a.gate.Stats(); s.Repairs == 0 || !strings.Contains(s.LastRepair, k.Held) {
					t.Errorf("the repair is not in the stats: %+v", s)
				}
			})
		})
	}
}

// TestNegativeHeldGrantsNoMoreThanCapacity: a negative held value must
// not add capacity (it did: the pool's total went below what was held).
func TestNegativeHeldGrantsNoMoreThanCapacity(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor(tg.Conn.KeyPrefix, pool)
		a := corruptInstance(t, tg, pool, "a", 2)
		b := corruptInstance(t, tg, pool, "b", 2)
		running := []*flow.Ticket{admitWithin(t, b, 5*time.Second), admitWithin(t, b, 5*time.Second)}
		mustDo(t, cl, cl.B().Hset().Key(k.Held).FieldValue().FieldValue("ghost", "-5").Build())
		ctx, cancel := context.WithTimeout(context.Background(), 2*corruptLease)
		defer cancel()
		if tk, err := a.ctl.Enqueue(ctx, flow.Request{FlowID: "t"}); err == nil {
			tk.Release()
			t.Fatalf("a admitted while b's 2 requests hold the pool of 2 (gate a %+v)", a.gate.Stats())
		}
		for _, tk := range running {
			tk.Release()
		}
		admitWithin(t, a, 5*time.Second).Release()
	})
}

// TestStrayWantWithoutLeaseLapses: the demand of an instance with no
// lease must not take a share of the pool forever.
func TestStrayWantWithoutLeaseLapses(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor(tg.Conn.KeyPrefix, pool)
		mustDo(t, cl, cl.B().Hset().Key(k.Want).FieldValue().FieldValue("ghost", "0\tx\t5").Build())
		a := corruptInstance(t, tg, pool, "a", 2)
		// Both units of the pool, at once: none is kept for the ghost.
		tk := admitWithin(t, a, 3*corruptLease)
		admitWithin(t, a, 3*corruptLease).Release()
		tk.Release()
		if _, ok := field(t, cl, k.Want, "ghost"); ok {
			t.Errorf("the stray demand is still there")
		}
	})
}

// TestCorruptSinceIsIgnored: a grant time that is no number must not
// fail the claims (it did: comparing nil when ordering the instances).
func TestCorruptSinceIsIgnored(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor(tg.Conn.KeyPrefix, pool)
		// A live instance wanting units in another flow, with a corrupt
		// grant time: a's claim orders the two.
		mustDo(t, cl, cl.B().Zadd().Key(k.Live).ScoreMember().ScoreMember(float64(redisNow(t, cl)+5000), "ghost").Build())
		mustDo(t, cl, cl.B().Hset().Key(k.Want).FieldValue().FieldValue("ghost", "0\tx\t5").Build())
		mustDo(t, cl, cl.B().Hset().Key(k.Since).FieldValue().FieldValue("ghost", "abc").Build())
		a := corruptInstance(t, tg, pool, "a", 2)
		admitWithin(t, a, 3*corruptLease).Release()
		if v, _ := field(t, cl, k.Since, "ghost"); v == "abc" {
			t.Errorf("the corrupt grant time is still there")
		}
	})
}

// TestWrongTypeKeyIsReplaced: a key of the pool holding another type
// (here a string) failed every claim with WRONGTYPE, every instance on
// its fallback share until someone deleted it. It is the package's own
// key name, so it can only be corrupt: the claim deletes it, says so in
// the stats, and the gate goes on.
func TestWrongTypeKeyIsReplaced(t *testing.T) {
	for _, which := range []string{"held", "want", "since", "live", "meta"} {
		t.Run(which, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, tg redistest.Target) {
				pool := uniquePool(t)
				cl := redistest.Client(t, tg.Conn)
				k := KeysFor(tg.Conn.KeyPrefix, pool)
				key := map[string]string{"held": k.Held, "want": k.Want, "since": k.Since, "live": k.Live, "meta": k.Meta}[which]
				mustDo(t, cl, cl.B().Set().Key(key).Value("junk").Build())
				a := corruptInstance(t, tg, pool, "a", 2)
				admitWithin(t, a, 3*corruptLease).Release()
				typ, err := cl.Do(context.Background(), cl.B().Type().Key(key).Build()).ToString()
				if err != nil {
					t.Fatal(err)
				}
				if typ == "string" {
					t.Errorf("%s is still a string", key)
				}
				if s := a.gate.Stats(); s.Repairs == 0 || !strings.Contains(s.LastRepair, key) {
					t.Errorf("the repair is not in the stats: %+v", s)
				}
			})
		})
	}
}

// TestCorruptMetaIsReset: the pool's record identity, claim count and
// settling time that are no numbers (or a count HINCRBY cannot raise)
// failed every claim; one far in the future stopped every grant.
func TestCorruptMetaIsReset(t *testing.T) {
	cases := []struct {
		field, value string
		within       time.Duration
	}{
		{"gen", "abc", 3 * corruptLease},
		{"gen", "9223372036854775807", 3 * corruptLease},
		{"epoch", strings.Repeat("9", 30), 3 * corruptLease},
		{"settle", "abc", 3 * corruptLease},
		// Cut back to maxAhead leases from now.
		{"settle", "99999999999999", (maxAhead + 3) * corruptLease},
	}
	for _, c := range cases {
		t.Run(c.field+"="+c.value, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, tg redistest.Target) {
				pool := uniquePool(t)
				cl := redistest.Client(t, tg.Conn)
				k := KeysFor(tg.Conn.KeyPrefix, pool)
				mustDo(t, cl, cl.B().Hset().Key(k.Meta).FieldValue().FieldValue(c.field, c.value).Build())
				a := corruptInstance(t, tg, pool, "a", 2)
				admitWithin(t, a, c.within).Release()
				if v, _ := field(t, cl, k.Meta, c.field); v == c.value {
					t.Errorf("meta %s is still %q", c.field, v)
				}
			})
		})
	}
}

// TestFarFutureLeaseIsCutBack: a lease that never runs out (+inf, or a
// Redis clock that went back) held its units forever.
func TestFarFutureLeaseIsCutBack(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor(tg.Conn.KeyPrefix, pool)
		mustDo(t, cl, cl.B().Zadd().Key(k.Live).ScoreMember().ScoreMember(1e300, "ghost").Build())
		mustDo(t, cl, cl.B().Hset().Key(k.Held).FieldValue().FieldValue("ghost", "2").Build())
		a := corruptInstance(t, tg, pool, "a", 2)
		admitWithin(t, a, (maxAhead+3)*corruptLease).Release()
		if _, ok := field(t, cl, k.Held, "ghost"); ok || leased(t, cl, k, "ghost") {
			t.Errorf("the ghost's records are still there")
		}
	})
}
