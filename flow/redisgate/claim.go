package redisgate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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
	// did; held ("<gen>:<units>") is what the last claim left held, so
	// that the held hash lost alone shows. It has no expiry: one small key per pool, so that a pool idle
	// for long is not taken for one whose records were lost.
	Meta string
}

// KeysFor are the keys of pool under prefix where its capacity is
// counted in requests (KeysForUnit: in tokens).
func KeysFor(prefix, pool string) Keys {
	return keysUnder(redisconn.KeyTag(prefix, pool) + ":flow:")
}

func keysUnder(base string) Keys {
	return Keys{Held: base + "held", Want: base + "want", Since: base + "since", Live: base + "live", Meta: base + "meta"}
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
// What Redis holds is hostile until checked: a record that broke the
// script would fail every claim, and every instance would stay on its
// fallback share until someone deleted the keys by hand; a stray one
// would count capacity for good. So each claim first repairs the pool's
// records, keeping every unit a live instance may use counted:
//   - a key of another type (only corruption can put one at these names)
//     is deleted; the held hash deleted means records lost;
//   - a held value that is no count (text, negative, fractional, over 15
//     digits) is dropped; unless it is the caller's, records are lost;
//   - units held without a lease (the live set evicted by maxmemory, a
//     crash) get a lease from now: a live holder renews it, a dead one's
//     lapses within a lease, as a crashed instance's does; demand and
//     grant times without a lease, and a lease with nothing held or
//     wanted, are dropped (a live instance writes them again);
//   - fewer units held than the last claim left (meta's held: claim
//     count and total), with no claim between, is records lost: the held
//     hash evicted or deleted alone, which no epoch or count shows;
//   - a lease or settling time beyond maxAhead leases is cut back to it;
//     a grant time, epoch, claim count or settling time that is no
//     number is replaced (a new epoch or count makes instances settle).
//
// Records lost settle the pool for a lease, as when Redis goes back.
//
// The call is idempotent: the same arguments again give the same holding.
// Returns {held, pool total held, live instances, entitlement, contended,
// the caller's share per flow ("<priority>\t<flow>\t<units>" lines), the
// pool's claim count, settling (1 while no one is granted more), epoch,
// records repaired, what (the first 3)}.
var claimScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local inst = ARGV[1]
local floor, want, cap, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- No time the pool keeps (a lease, the settling time) lies further ahead.
local ahead = now + tonumber(ARGV[9]) * ttl

-- What Redis holds is checked before it is used: a record that fails the
-- script fails every claim, and every instance stays on its fallback
-- share until someone deletes the keys by hand. What was repaired goes
-- back in the answer.
local repairs = {}
local function repaired(key, what)
  repairs[#repairs + 1] = key .. ': ' .. what
end
-- s quoted for the answer: 64 bytes at most, printable ASCII
local function quote(s)
  local q = string.gsub(string.sub(s, 1, 64), '[^%w%p ]', function(c) return string.format('\\x%02x', string.byte(c)) end)
  return '"' .. q .. '"'
end
-- n when s spells a count: digits only, at most 15 (exact in a Lua
-- number; "-5" would add capacity, "inf" or "1e400" break the answer).
local function count(s)
  if type(s) == 'string' and #s <= 15 and string.find(s, '^%d+$') then return tonumber(s) end
  return nil
end
-- lost: records of what instances hold are gone; no one is granted more
-- for a lease, as after Redis went back in time (below).
local lost = false

-- Every key is this pool's own ({sluice:...}:flow:*, in the namespace the
-- ACL gives Sluice), so one of another type can only be corrupt: nothing
-- in it means anything to the gate, and while it stays every claim fails
-- (WRONGTYPE). It goes: held gone is records lost (settle), live gone
-- leaves records without a lease (adopted below), meta gone is a new
-- record identity (every instance settles), want and since each instance
-- writes again.
for i, c in ipairs({'HLEN', 'HLEN', 'HLEN', 'ZCARD', 'HLEN'}) do
  local r = redis.pcall(c, KEYS[i])
  if type(r) == 'table' and r.err then
    if not string.find(r.err, 'WRONGTYPE', 1, true) then return r end
    redis.call('DEL', KEYS[i])
    repaired(KEYS[i], 'deleted, of the wrong type')
    if i == 1 then lost = true end
  end
end

local seenGen, seenEpoch = tonumber(ARGV[7]), ARGV[8]
local epoch = redis.call('HGET', KEYS[5], 'epoch')
if epoch and not (#epoch <= 20 and string.find(epoch, '^%d+$')) then
  -- a new identity: every instance that saw the old one settles
  repaired(KEYS[5], 'epoch ' .. quote(epoch) .. ' replaced')
  epoch = false
end
if not epoch then
  epoch = tostring(now)
  redis.call('HSET', KEYS[5], 'epoch', epoch)
end
local gen = redis.call('HGET', KEYS[5], 'gen')
if gen and not count(gen) then
  -- counted again from 0 (HINCRBY would fail on it): every instance that
  -- saw more settles
  repaired(KEYS[5], 'gen ' .. quote(gen) .. ' reset')
  redis.call('HSET', KEYS[5], 'gen', 0)
  gen = '0'
end
gen = tonumber(gen or '0')
-- The held hash dropped alone (maxmemory evicted it, an operator's DEL)
-- loses what instances hold while meta, and so the epoch and claim count,
-- stay. Each claim records the pool's total held with its claim count
-- (below); fewer units held at the next claim, with no claim between (an
-- older Sluice's claim does not record it, and moves the count), is
-- records lost.
local heldRec = redis.call('HGET', KEYS[5], 'held')
if heldRec then
  local rgen, rsum = string.match(heldRec, '^(%d+):(%d+)$')
  if rgen and #heldRec <= 40 and tonumber(rgen) == gen then
    local sum = 0
    for _, v in ipairs(redis.call('HVALS', KEYS[1])) do sum = sum + (count(v) or 0) end
    if sum < tonumber(rsum) then
      lost = true
      repaired(KEYS[1], string.format('%d of the %s units held gone (evicted or deleted)', tonumber(rsum) - sum, rsum))
    end
  end
end
local settleRaw = redis.call('HGET', KEYS[5], 'settle')
local settle = tonumber(settleRaw or '0')
if settleRaw and not count(settleRaw) then
  settle = now + ttl -- it was set because records were lost: one lease
  repaired(KEYS[5], 'settle ' .. quote(settleRaw) .. ' replaced')
  redis.call('HSET', KEYS[5], 'settle', settle)
elseif settle > ahead then
  settle = ahead -- no grant for ever otherwise
  repaired(KEYS[5], 'settle cut back to ' .. tonumber(ARGV[9]) .. ' leases')
  redis.call('HSET', KEYS[5], 'settle', settle)
end
if seenGen > 0 and (epoch ~= seenEpoch or gen < seenGen) then
  settle = now + ttl
  redis.call('HSET', KEYS[5], 'settle', settle)
end
gen = redis.call('HINCRBY', KEYS[5], 'gen', 1)

-- Leases: the instances whose lease ran out lose what they held; one
-- further ahead than any lease (+inf, or Redis's clock went back) is cut
-- back, or a crashed instance's share would not come back for that long.
local lease = {}
local lz = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #lz, 2 do
  local d, exp = lz[i], tonumber(lz[i + 1]) or math.huge
  if exp <= now then
    redis.call('HDEL', KEYS[1], d)
    redis.call('HDEL', KEYS[2], d)
    redis.call('HDEL', KEYS[3], d)
    redis.call('ZREM', KEYS[4], d)
  else
    if exp > ahead then
      redis.call('ZADD', KEYS[4], ahead, d)
      repaired(KEYS[4], quote(d) .. ' cut back to ' .. tonumber(ARGV[9]) .. ' leases')
    end
    lease[d] = true
  end
end

-- What each instance holds. A value that is no count says nothing of
-- what its instance uses: it goes, and unless it is the caller's (whose
-- floor says what it may use) records are lost. Units held without a
-- lease (the live set evicted, a crash) may still be in use: they get a
-- lease from now; a live holder renews it, a dead one's lapses.
local heldBy, total = {}, 0
local hflat = redis.call('HGETALL', KEYS[1])
for i = 1, #hflat, 2 do
  local id, n = hflat[i], count(hflat[i + 1])
  if not n then
    redis.call('HDEL', KEYS[1], id)
    repaired(KEYS[1], quote(id) .. ' held ' .. quote(hflat[i + 1]) .. ', not a count: dropped')
    if id ~= inst then lost = true end
  else
    if not lease[id] then
      redis.call('ZADD', KEYS[4], now + ttl, id)
      lease[id] = true
      repaired(KEYS[1], quote(id) .. ' held units without a lease: leased for one')
    end
    heldBy[id] = n
    total = total + n
  end
end
local held = heldBy[inst] or 0
if lost then
  settle = math.max(settle, now + ttl)
  redis.call('HSET', KEYS[5], 'settle', settle)
end
local settling = now < settle

if want > 0 then
  redis.call('HSET', KEYS[2], inst, ARGV[6])
else
  redis.call('HDEL', KEYS[2], inst)
end

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

-- Demand of an instance with no lease and nothing held: it goes (a live
-- instance writes it again at its next claim), or it would take a share
-- for good. Lines that are no demand are skipped.
local flat = redis.call('HGETALL', KEYS[2])
local bands, prios, ids, wanting = {}, {}, {}, {}
for i = 1, #flat, 2 do
  local id = flat[i]
  if not lease[id] and id ~= inst then
    redis.call('HDEL', KEYS[2], id)
    repaired(KEYS[2], quote(id) .. ' wanted units without a lease: dropped')
  else
    ids[#ids + 1] = id
    wanting[id] = true
    for line in string.gmatch(flat[i + 1], '[^\n]+') do
      local p, f, n = string.match(line, '^(-?%d+)\t([^\t]+)\t(%d+)$')
      if p and #n > 15 then p = nil end -- "1e400" units: no count
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
end
-- A lease with nothing held nor wanted is of no instance the script left
-- (it drops the lease with both): it goes, or it counts as an instance.
for id in pairs(lease) do
  if not heldBy[id] and not wanting[id] and id ~= inst then
    redis.call('ZREM', KEYS[4], id)
    redis.call('HDEL', KEYS[3], id)
    lease[id] = nil
    repaired(KEYS[4], quote(id) .. ' leased, holding and wanting nothing: dropped')
  end
end
-- When each instance was last granted (ms): a value that is no count is
-- taken as never (it only orders the instances); that of an instance with
-- no lease goes.
local sinceBy = {}
local sflat = redis.call('HGETALL', KEYS[3])
for i = 1, #sflat, 2 do
  local id, ms = sflat[i], count(sflat[i + 1])
  if not lease[id] and id ~= inst then
    redis.call('HDEL', KEYS[3], id)
    repaired(KEYS[3], quote(id) .. ' without a lease: dropped')
  elseif not ms then
    redis.call('HDEL', KEYS[3], id)
    repaired(KEYS[3], quote(id) .. ' ' .. quote(sflat[i + 1]) .. ', not a time: dropped')
  else
    sinceBy[id] = ms
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
  since[id] = sinceBy[id] or 0
  if a - b > 1e-9 then frac[#frac + 1] = id end
end
since[inst] = since[inst] or sinceBy[inst] or 0
local function older(a, b) if since[a] ~= since[b] then return since[a] < since[b] end return a < b end
table.sort(frac, older)
for j, id in ipairs(frac) do
  if j <= cap - used then ent[id] = ent[id] + 1 end
end
local entitled = ent[inst] or 0

-- Instances entitled to more than they hold are served in the order they
-- were last granted: units free now go to the older ones first.
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
redis.call('HSET', KEYS[5], 'held', string.format('%d:%d', gen, total - held + new))
local settlingFlag = 0
if settling then settlingFlag = 1 end
local repairNote = table.concat(repairs, '; ', 1, math.min(#repairs, 3))
if #repairs > 3 then repairNote = repairNote .. '; and ' .. (#repairs - 3) .. ' more' end
return {new, total - held + new, redis.call('ZCARD', KEYS[4]), entitled, contended, table.concat(mine, '\n'), gen, settlingFlag, epoch, #repairs, repairNote}
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
	// repairs is how many of the pool's records the claim found corrupt
	// or stray and repaired; repairNote says what (the first few).
	repairs    int64
	repairNote string
}

// maxRepairNote bounds what a repair note keeps: it quotes what Redis
// held.
const maxRepairNote = 512

// truncate keeps at most n bytes of s, cut at a character.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
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
		strconv.FormatInt(last.gen, 10), last.epoch, strconv.Itoa(maxAhead)}
	vals, err := claimScript.Exec(ctx, cl, k.list(), args).ToArray()
	if err != nil {
		return claimed{}, err
	}
	if len(vals) != 11 {
		return claimed{}, fmt.Errorf("redisgate: claim answered %d values, want 11", len(vals))
	}
	shares, err := vals[5].ToString()
	if err != nil {
		return claimed{}, fmt.Errorf("redisgate: claim answer 5: %v", err)
	}
	epoch, err := vals[8].ToString()
	if err != nil || len(epoch) > 20 {
		return claimed{}, fmt.Errorf("redisgate: claim answer 8 (epoch %.20q): %v", epoch, err)
	}
	note, err := vals[10].ToString()
	if err != nil {
		return claimed{}, fmt.Errorf("redisgate: claim answer 10: %v", err)
	}
	var out [10]int64 // out[5] and out[8] unused: strings
	for _, i := range []int{0, 1, 2, 3, 4, 6, 7, 9} {
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
		seen: seen{epoch: epoch, gen: out[6]}, settling: out[7] == 1, repairs: out[9], repairNote: truncate(note, maxRepairNote)}, nil
}

// maxAhead bounds, in leases of the claiming instance, how far ahead of
// Redis's clock a time the pool keeps (a lease, the settling time) may
// lie: one beyond it (+inf, or Redis's clock went back) is cut back to
// it. A lease is never written further ahead than its instance's
// lease_ttl and renewed every third of it, so instances whose lease_ttl
// differ up to 3 × maxAhead times never cut each other's leases short.
const maxAhead = 10
