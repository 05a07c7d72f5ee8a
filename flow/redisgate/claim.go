package redisgate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Keys are one pool's records in Redis. They share one hash tag, so a
// Redis Cluster keeps them in one slot and the claim script can touch
// them all.
type Keys struct {
	Held  string // hash: instance → units it holds
	Want  string // hash: instance → units it wants (in flight + queued)
	Since string // hash: instance → when it was last granted more (ms)
	Live  string // sorted set: instance → lease expiry (ms, Redis's clock)
}

// KeysFor are the keys of pool under prefix.
func KeysFor(prefix, pool string) Keys {
	tag := "{sluice:" + prefix + ":" + pool + "}:flow:"
	return Keys{Held: tag + "held", Want: tag + "want", Since: tag + "since", Live: tag + "live"}
}

func (k Keys) list() []string { return []string{k.Held, k.Want, k.Since, k.Live} }

// claimScript is the whole protocol, one atomic step per call:
//
//  1. Instances whose lease ran out lose what they held (a crashed
//     instance's share comes back within one lease).
//  2. The caller records what it wants and renews its lease (an idle
//     caller, holding and wanting nothing, leaves instead).
//  3. Its entitlement is its max-min fair share of the capacity over
//     every instance's want: wants below the water line are met in full,
//     the rest get the line, rounded down; the units left by rounding go
//     to the unmet instances granted least recently, so with fewer units
//     than instances they take turns instead of one keeping them.
//  4. It holds min(entitlement, what it holds + what is free) — never more
//     than the capacity in total — but never less than floor, the units
//     it may be using already (a holding is lowered only once its
//     requests are done).
//
// The call is idempotent: the same arguments again give the same holding.
// Returns {held, pool total held, live instances, entitlement}.
var claimScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local inst = ARGV[1]
local floor, want, cap, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  redis.call('HDEL', KEYS[1], d)
  redis.call('HDEL', KEYS[2], d)
  redis.call('HDEL', KEYS[3], d)
  redis.call('ZREM', KEYS[4], d)
end

if want > 0 then
  redis.call('HSET', KEYS[2], inst, want)
else
  redis.call('HDEL', KEYS[2], inst)
end
local held = tonumber(redis.call('HGET', KEYS[1], inst) or '0')
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end

local flat = redis.call('HGETALL', KEYS[2])
local list = {}
for i = 1, #flat, 2 do
  list[#list + 1] = {id = flat[i], w = tonumber(flat[i + 1]),
    since = tonumber(redis.call('HGET', KEYS[3], flat[i]) or '0')}
end
table.sort(list, function(a, b) if a.w ~= b.w then return a.w < b.w end return a.id < b.id end)
local rem, n, i, entitled = cap, #list, 1, 0
while i <= #list do
  if list[i].w > math.floor(rem / n) then break end
  if list[i].id == inst then entitled = list[i].w end
  rem, n, i = rem - list[i].w, n - 1, i + 1
end
if i <= #list then
  local base = math.floor(rem / n)
  local extra = rem - base * n
  local rest = {}
  for j = i, #list do rest[#rest + 1] = list[j] end
  table.sort(rest, function(a, b) if a.since ~= b.since then return a.since < b.since end return a.id < b.id end)
  for j, e in ipairs(rest) do
    if e.id == inst then
      entitled = base
      if j <= extra then entitled = base + 1 end
    end
  end
end

local new = entitled
if entitled > held then new = math.min(entitled, held + math.max(0, cap - total)) end
if new < floor then new = floor end
if new > held then redis.call('HSET', KEYS[3], inst, now) end
if new > 0 then
  redis.call('HSET', KEYS[1], inst, new)
else
  redis.call('HDEL', KEYS[1], inst)
end
if new > 0 or want > 0 then
  redis.call('ZADD', KEYS[4], now + ttl, inst)
else
  redis.call('ZREM', KEYS[4], inst)
  redis.call('HDEL', KEYS[3], inst)
end
return {new, total - held + new, redis.call('ZCARD', KEYS[4]), entitled}
`)

// claimed is one answer of the claim script.
type claimed struct {
	held, total, instances, entitled int64
}

// claim runs the script for instance: it wants want units, may be using
// floor already, and the pool holds capacity units in all.
func claim(ctx context.Context, cl rueidis.Client, k Keys, instance string, floor, want, capacity int64, ttl time.Duration) (claimed, error) {
	args := []string{instance, strconv.FormatInt(floor, 10), strconv.FormatInt(want, 10),
		strconv.FormatInt(capacity, 10), strconv.FormatInt(ttl.Milliseconds(), 10)}
	vals, err := claimScript.Exec(ctx, cl, k.list(), args).ToArray()
	if err != nil {
		return claimed{}, err
	}
	if len(vals) != 4 {
		return claimed{}, fmt.Errorf("redisgate: claim answered %d values, want 4", len(vals))
	}
	var out [4]int64
	for i, v := range vals {
		n, err := v.AsInt64()
		if err != nil {
			return claimed{}, fmt.Errorf("redisgate: claim answer %d: %v", i, err)
		}
		if n < 0 {
			return claimed{}, fmt.Errorf("redisgate: claim answer %d is negative (%d)", i, n)
		}
		out[i] = n
	}
	return claimed{held: out[0], total: out[1], instances: out[2], entitled: out[3]}, nil
}
