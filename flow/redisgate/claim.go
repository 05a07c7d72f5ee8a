package redisgate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// Keys are one pool's records in Redis. They share one hash tag, so a
// Redis Cluster keeps them in one slot and the claim script can touch
// them all.
type Keys struct {
	Held  string // hash: instance → units it holds
	Want  string // hash: instance → its demand per flow (encodeDemand)
	Since string // hash: instance → when it was last granted more (ms)
	Live  string // sorted set: instance → lease expiry (ms, Redis's clock)
	// Meta is a hash: epoch (when Redis first saw the pool) and gen
	// (claims so far) let an instance tell that Redis went back in time;
	// settle is until when (ms) no instance is granted more after it
	// did. It has no expiry: one small key per pool, so that a pool idle
	// for long is not taken for one whose records were lost.
	Meta string
}

// KeysFor are the keys of pool under prefix.
func KeysFor(prefix, pool string) Keys {
	tag := redisconn.KeyTag(prefix, pool) + ":flow:"
	return Keys{Held: tag + "held", Want: tag + "want", Since: tag + "since", Live: tag + "live", Meta: tag + "meta"}
}

func (k Keys) list() []string { return []string{k.Held, k.Want, k.Since, k.Live, k.Meta} }

// claimScript is the whole protocol, one atomic step per call:
//
//  1. Instances whose lease ran out lose what they held (a crashed
//     instance's share comes back within one lease).
//  2. The caller records its demand — per flow: priority, flow, units in
//     flight + queued — and renews its lease (an idle caller, holding and
//     wanting nothing, leaves instead).
//  3. The capacity is shared out as one flow control would: priority
//     bands first, highest first; within a band max-min fair over the
//     flows (tenants) of every instance together; a flow's share max-min
//     fair over the instances where it waits. An instance is entitled to
//     the sum of its flows' shares, rounded down; the units left by
//     rounding go to instances with a fraction, granted least recently
//     first, so with fewer units than instances they take turns. So a
//     quiet tenant's request waiting at one instance gets a unit there
//     while a flood spread over every instance shares the rest.
//  4. It holds min(entitlement, what it holds + what is free) — never more
//     than the capacity in total — but never less than floor, the units
//     it may be using already (a holding is lowered only once its
//     requests are done).
//
// Units free now go first to the instances entitled to more than they
// hold, in the order they were last granted; while any is, the answer
// says the pool is contended, and an instance holding its whole share
// gives back the next unit that frees up instead of reusing it (the gate
// lowers what it allows by one), so a freed unit anywhere goes where the
// shares say — as one flow control would hand it to the request it
// serves next.
//
// Redis that goes back in time (restarted empty, from an older snapshot,
// or failed over to a replica that lagged) has lost what the instances
// hold, and the first to ask would be granted what the others still use.
// Every answer carries the pool's record identity (epoch: when Redis
// first saw the pool) and claim count (gen), and each instance sends the
// last it saw: another epoch, or a count below it, means Redis went back
// (another epoch covers a restore over records made since the loss). Then
// for one lease no instance is granted more than it already holds; within
// a lease every instance that holds or wants units has renewed, and so
// written back what it may be using (its floor), and sharing resumes on a
// true record.
//
// The call is idempotent: the same arguments again give the same holding.
// Returns {held, pool total held, live instances, entitlement, contended,
// the caller's share per flow ("<priority>\t<flow>\t<units>" lines), the
// pool's claim count, settling (1 while no one is granted more), epoch}.
var claimScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local inst = ARGV[1]
local floor, want, cap, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local seenGen, seenEpoch = tonumber(ARGV[7]), ARGV[8]
local epoch = redis.call('HGET', KEYS[5], 'epoch')
if not epoch then
  epoch = tostring(now)
  redis.call('HSET', KEYS[5], 'epoch', epoch)
end
local gen = tonumber(redis.call('HGET', KEYS[5], 'gen') or '0')
local settle = tonumber(redis.call('HGET', KEYS[5], 'settle') or '0')
if seenGen > 0 and (epoch ~= seenEpoch or gen < seenGen) then
  settle = now + ttl
  redis.call('HSET', KEYS[5], 'settle', settle)
end
gen = redis.call('HINCRBY', KEYS[5], 'gen', 1)
local settling = now < settle

for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  redis.call('HDEL', KEYS[1], d)
  redis.call('HDEL', KEYS[2], d)
  redis.call('HDEL', KEYS[3], d)
  redis.call('ZREM', KEYS[4], d)
end

if want > 0 then
  redis.call('HSET', KEYS[2], inst, ARGV[6])
else
  redis.call('HDEL', KEYS[2], inst)
end
local held = tonumber(redis.call('HGET', KEYS[1], inst) or '0')
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end

-- the level that shares amount max-min fairly over vals
local function level(vals, amount)
  table.sort(vals)
  for i, v in ipairs(vals) do
    local l = amount / (#vals - i + 1)
    if v > l then return l end
    amount = amount - v
  end
  return math.huge
end

-- A priority stays the string it came as: Lua's numbers are floats, which
-- print 1e14 as "1e+14" and merge priorities beyond 2^53. Bands are
-- ordered as the integers the strings spell (canonical decimal).
local function higher(a, b)
  local x, y = tonumber(a), tonumber(b)
  if x ~= y then return x > y end
  -- equal floats of distinct integers: large, of one sign
  if #a ~= #b then return (#a > #b) == (x > 0) end
  return (a > b) == (x > 0)
end

local flat = redis.call('HGETALL', KEYS[2])
local bands, prios, ids = {}, {}, {}
for i = 1, #flat, 2 do
  local id = flat[i]
  ids[#ids + 1] = id
  for line in string.gmatch(flat[i + 1], '[^\n]+') do
    local p, f, n = string.match(line, '^(-?%d+)\t([^\t]+)\t(%d+)$')
    if p then
      n = tonumber(n)
      local b = bands[p]
      if not b then b = {}; bands[p] = b; prios[#prios + 1] = p end
      local fl = b[f]
      if not fl then fl = {total = 0, per = {}}; b[f] = fl end
      fl.total = fl.total + n
      fl.per[id] = (fl.per[id] or 0) + n
    end
  end
end
table.sort(prios, higher)
local alloc, rem, mine = {}, cap, {}
for _, p in ipairs(prios) do
  if rem <= 0 then break end
  local totals, bw = {}, 0
  for _, fl in pairs(bands[p]) do totals[#totals + 1] = fl.total; bw = bw + fl.total end
  local give = math.min(rem, bw)
  local lf = level(totals, give)
  for f, fl in pairs(bands[p]) do
    local per = {}
    for _, n in pairs(fl.per) do per[#per + 1] = n end
    local li = level(per, math.min(fl.total, lf))
    for id, n in pairs(fl.per) do
      alloc[id] = (alloc[id] or 0) + math.min(n, li)
      if id == inst then mine[#mine + 1] = p .. '\t' .. f .. '\t' .. string.format('%.3f', math.min(n, li)) end
    end
  end
  rem = rem - give
end

local used, frac, ent, since = 0, {}, {}, {}
for _, id in ipairs(ids) do
  local a = alloc[id] or 0
  local b = math.floor(a + 1e-9)
  used = used + b
  ent[id] = b
  since[id] = tonumber(redis.call('HGET', KEYS[3], id) or '0')
  if a - b > 1e-9 then frac[#frac + 1] = id end
end
since[inst] = since[inst] or tonumber(redis.call('HGET', KEYS[3], inst) or '0')
local function older(a, b) if since[a] ~= since[b] then return since[a] < since[b] end return a < b end
table.sort(frac, older)
for j, id in ipairs(frac) do
  if j <= cap - used then ent[id] = ent[id] + 1 end
end
local entitled = ent[inst] or 0

-- Instances entitled to more than they hold are served in the order they
-- were last granted: units free now go to the older ones first.
local heldBy = {}
local hflat = redis.call('HGETALL', KEYS[1])
for i = 1, #hflat, 2 do heldBy[hflat[i]] = tonumber(hflat[i + 1]) end
local reserved, waiting = 0, 0
for _, id in ipairs(ids) do
  local d = (ent[id] or 0) - (heldBy[id] or 0)
  if id ~= inst and d > 0 then
    waiting = waiting + d
    if older(id, inst) then reserved = reserved + d end
  end
end
-- contended: others wait for more than is free now
local contended = 0
if waiting > math.max(0, cap - total) then contended = 1 end

-- While another instance waits for its share, one holding exactly its own
-- gives back a unit as soon as it is not in use, and goes to the back of
-- the line for units left by rounding.
local target, yielded = entitled, false
if contended == 1 and held == entitled and entitled > 0 and floor < entitled then
  target, yielded = entitled - 1, true
end
local new = target
if target > held then
  if settling then
    new = held
  else
    new = math.min(target, held + math.max(0, cap - total - reserved))
  end
end
if new < floor then new = floor end
if new > held or (yielded and new < held) then redis.call('HSET', KEYS[3], inst, now) end
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
local settlingFlag = 0
if settling then settlingFlag = 1 end
return {new, total - held + new, redis.call('ZCARD', KEYS[4]), entitled, contended, table.concat(mine, '\n'), gen, settlingFlag, epoch}
`)

// claimed is one answer of the claim script.
type claimed struct {
	held, total, instances, entitled int64
	contended                        bool
	shares                           string // the caller's share per flow
	// seen is the pool's record identity and claim count, for the
	// caller's next claim; settling: Redis went back in time less than a
	// lease ago.
	seen     seen
	settling bool
}

// seen is what an instance last saw of the pool's records (claimScript).
type seen struct {
	epoch string
	gen   int64
}

// claim runs the script for instance: it wants want units in all, per
// flow as demand says (encodeDemand), may be using floor already, and the
// pool holds capacity units in all; last is what the instance saw at its
// last answer (zero: none).
func claim(ctx context.Context, cl rueidis.Client, k Keys, instance string, floor, want int64, demand string, capacity int64, ttl time.Duration, last seen) (claimed, error) {
	args := []string{instance, strconv.FormatInt(floor, 10), strconv.FormatInt(want, 10),
		strconv.FormatInt(capacity, 10), strconv.FormatInt(ttl.Milliseconds(), 10), demand,
		strconv.FormatInt(last.gen, 10), last.epoch}
	vals, err := claimScript.Exec(ctx, cl, k.list(), args).ToArray()
	if err != nil {
		return claimed{}, err
	}
	if len(vals) != 9 {
		return claimed{}, fmt.Errorf("redisgate: claim answered %d values, want 9", len(vals))
	}
	shares, err := vals[5].ToString()
	if err != nil {
		return claimed{}, fmt.Errorf("redisgate: claim answer 5: %v", err)
	}
	epoch, err := vals[8].ToString()
	if err != nil || len(epoch) > 20 {
		return claimed{}, fmt.Errorf("redisgate: claim answer 8 (epoch %.20q): %v", epoch, err)
	}
	var out [8]int64 // out[5] unused: the shares are a string
	for _, i := range []int{0, 1, 2, 3, 4, 6, 7} {
		n, err := vals[i].AsInt64()
		if err != nil {
			return claimed{}, fmt.Errorf("redisgate: claim answer %d: %v", i, err)
		}
		if n < 0 {
			return claimed{}, fmt.Errorf("redisgate: claim answer %d is negative (%d)", i, n)
		}
		out[i] = n
	}
	return claimed{held: out[0], total: out[1], instances: out[2], entitled: out[3], contended: out[4] == 1, shares: shares,
		seen: seen{epoch: epoch, gen: out[6]}, settling: out[7] == 1}, nil
}
