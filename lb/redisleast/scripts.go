package redisleast

import "github.com/redis/rueidis"

// The scripts run atomically inside Redis and are called by hash
// (EVALSHA; rueidis falls back to EVAL on NOSCRIPT, which did not run the
// script, so nothing is applied twice). Every key a script touches is
// passed in KEYS (Cluster routing), but those only known inside it
// (dispatch's, a recount's: see queue_scripts.go, recount.go), which are
// built from the pool's hash tag, hence in its slot.

// decr takes one request, whose record is dropped already, off a
// replica: from load while it is a member, else from gone (dropped there
// at zero). Never below zero; a corrupt count is counted again instead
// (countFn, which scripts using decr start with).
const decr = `
local function decr(load, gone, rep)
  local s, recounted = count(load, rep)
  if s then
    if s > 0 and not recounted then redis.call('ZINCRBY', load, -1, rep) end
    return
  end
  s, recounted = count(gone, rep)
  if s and not recounted then
    if s <= 1 then redis.call('ZREM', gone, rep) else redis.call('ZINCRBY', gone, -1, rep) end
  end
end
`

// versionFn reads an instance's version (field "!" of its hash), which
// is outside input: garbage or below zero reads as 0 (as a missing one:
// Redis lost the instance's writes, see reconcile.go); from maxVersion on
// (inf and nan included) it reads as maxVersion, where adding 1 would
// soon no longer change a Lua number: the instance takes a fresh
// identity when Redis answers it (noteVersion).
const versionFn = `
local function version(inst)
  local v = tonumber(redis.call('HGET', inst, '!')) or 0
  if v >= ` + maxVersionLua + ` or v ~= v then return ` + maxVersionLua + ` end
  if v < 0 then return 0 end
  return math.floor(v)
end

-- above is the version after v: v + 1, but never past maxVersion.
local function above(v)
  if v < ` + maxVersionLua + ` then return v + 1 end
  return v
end
`

// bumpFn raises an instance's version and returns it: every script that
// writes the instance's records, or that it uses to renew, sync or leave
// the queue, runs it, so the version Redis answers never goes back unless
// Redis lost writes (see reconcile.go). Scripts using it start with
// versionFn.
const bumpFn = `
local function bump(inst)
  local v = above(version(inst))
  redis.call('HSET', inst, '!', v)
  return v
end
`

// selectScript picks the least-loaded candidate that is a member, scanning
// from a caller-chosen offset so ties go to a random one, increments it and
// records the request under the instance.
//
// KEYS: load, alive:<id>, inst:<id>, insts
// ARGV: maxInflight (0 = none), leaseTTL ms, request id, instance id, offset, candidates...
// Reply: {1, replica, version} selected; {0, "", version} no candidate
// is a member; {2, replica, version} saturated (least-loaded candidate is
// at maxInflight). Idempotent: a request id already recorded returns its
// replica unchanged; one the release script marked as never-to-run (empty
// value, see below) returns {3, "", version} and changes nothing else.
var selectScript = rueidis.NewLuaScript(countFn + versionFn + bumpFn + `
local v = bump(KEYS[3])
local prev = redis.call('HGET', KEYS[3], ARGV[3])
if prev == '' then return {3, '', v} end
if prev then return {1, prev, v} end
local maxIn = tonumber(ARGV[1])
local n = #ARGV - 5
local off = tonumber(ARGV[5])
local best, bestScore
for i = 0, n - 1 do
  local c = ARGV[6 + (i + off) % n]
  local s = count(KEYS[1], c)
  if s and (best == nil or s < bestScore) then best, bestScore = c, s end
end
if best == nil then return {0, '', v} end
if maxIn > 0 and bestScore >= maxIn then return {2, best, v} end
-- Counted last: Redis does not roll back a script that fails midway, and
-- an error reply (SADD on a foreign key of the wrong type) gets a local
-- lease, so a count made before it would never be released.
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
redis.call('SADD', KEYS[4], ARGV[4])
redis.call('ZINCRBY', KEYS[1], 1, best)
redis.call('HSET', KEYS[3], ARGV[3], best)
return {1, best, v}
`)

// releaseScript ends requests: for each id still recorded, drop the record
// and decrement its replica. Ids without a record (released already, or
// reclaimed by a reaper, or lost with a Redis restart) change nothing, so a
// repeated release is a no-op and counts never go negative.
//
// An id prefixed with "?" is a select whose reply was lost (timeout): it
// may have run, or may still be on its way over another connection. If it
// has no record, the release leaves an empty-valued record (a tombstone) so
// that the late select, when it arrives, does nothing. Tombstones are only
// written for lost selects (outages); the instance deletes them once no
// late select can arrive (sweepTombstones), else they go with its hash.
//
// KEYS: load, gone, inst:<id>
// ARGV: request ids...
// Reply: the instance's version.
var releaseScript = rueidis.NewLuaScript(countFn + decr + versionFn + bumpFn + `
for i = 1, #ARGV do
  local id, lost = ARGV[i], false
  if string.sub(id, 1, 1) == '?' then id, lost = string.sub(id, 2), true end
  local rep = redis.call('HGET', KEYS[3], id)
  if rep and rep ~= '' then
    redis.call('HDEL', KEYS[3], id)
    decr(KEYS[1], KEYS[2], rep)
  elseif lost and not rep then
    redis.call('HSET', KEYS[3], id, '')
  end
end
return bump(KEYS[3])
`)

// dropTombstonesScript deletes the tombstones among the given request ids
// of one instance's hash (fields whose value is still empty); a field that
// holds a replica (a record) is left alone.
//
// KEYS: inst:<id>
// ARGV: request ids...
// Reply: how many it deleted.
var dropTombstonesScript = rueidis.NewLuaScript(`
local n = 0
for i = 1, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n
`)

// reapScript reclaims a dead instance: if its liveness key has expired,
// every request it recorded is decremented and its records are dropped
// (the field "#" is its last batch number and "!" its version, not
// requests: see batchScript, bumpFn).
// Safe to run concurrently from any instance: the first run empties the
// hash, the others find nothing.
//
// KEYS: load, gone, alive:<id>, inst:<id>, insts
// ARGV: instance id
// Reply: -1 alive; else the number of requests reclaimed.
var reapScript = rueidis.NewLuaScript(countFn + decr + `
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
local kv = redis.call('HGETALL', KEYS[4])
redis.call('DEL', KEYS[4]) -- first: decr's recount must not count them
local n = 0
for i = 1, #kv, 2 do
  if kv[i] ~= '#' and kv[i] ~= '!' and kv[i + 1] ~= '' then
    decr(KEYS[1], KEYS[2], kv[i + 1])
    n = n + 1
  end
end
redis.call('SREM', KEYS[5], ARGV[1])
return n
`)

// renewScript renews an instance's liveness key and names it among the
// instances (so its records are reaped if it dies).
//
// KEYS: alive:<id>, inst:<id>, insts
// ARGV: leaseTTL ms, instance id
// Reply: the instance's version.
var renewScript = rueidis.NewLuaScript(versionFn + bumpFn + `
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
return bump(KEYS[2])
`)

// reconcileFn rewrites an instance's records from the leases it holds
// (see reconcile.go): a record without a lease is dropped and its replica
// decremented, unless keep names it; a lease without a record, or whose
// record names another replica, is recorded (again) on its replica, where
// a pick would be: load, else gone, else not at all.
// argv[from...] are (request id, replica) pairs. Returns the ids dropped
// and how many it recorded. Scripts using it start with countFn, decr and
// versionFn.
const reconcileFn = `
local function reconcile(load, gone, inst, argv, from, keep)
  local held = {}
  for i = from, #argv, 2 do held[argv[i]] = argv[i + 1] end
  local dropped = {}
  local kv = redis.call('HGETALL', inst)
  for i = 1, #kv, 2 do
    local id, rep = kv[i], kv[i + 1]
    if id ~= '#' and id ~= '!' and rep ~= '' then
      local h = held[id]
      if h == rep then
        held[id] = false
      elseif h or not keep[id] then
        redis.call('HDEL', inst, id)
        decr(load, gone, rep)
        if not h then dropped[#dropped + 1] = id end
      end
    end
  end
  local added = 0
  for i = from, #argv, 2 do
    local id, rep = argv[i], argv[i + 1]
    if held[id] then
      local where = nil
      if redis.call('ZSCORE', load, rep) then where = load
      elseif redis.call('ZSCORE', gone, rep) then where = gone end
      if where then
        redis.call('ZINCRBY', where, 1, rep)
        redis.call('HSET', inst, id, rep)
        added = added + 1
      end
    end
  end
  return dropped, added
end

-- settle raises the version above floor, renews and names the instance.
local function settle(alive, inst, insts, ttl, id, floor)
  local v = above(math.max(version(inst), tonumber(floor)))
  redis.call('HSET', inst, '!', v)
  redis.call('SET', alive, '1', 'PX', ttl)
  redis.call('SADD', insts, id)
  return v
end
`

// reconcileScript rewrites an instance's records from the leases it
// holds after Redis lost writes (see reconcile.go, reconcileFn).
//
// KEYS: load, gone, alive:<id>, inst:<id>, insts
// ARGV: leaseTTL ms, instance id, version floor, (request id, replica)...
// Reply: {records dropped, records added, the instance's version}.
var reconcileScript = rueidis.NewLuaScript(countFn + decr + versionFn + reconcileFn + `
local dropped, added = reconcile(KEYS[1], KEYS[2], KEYS[4], ARGV, 4, {})
return {#dropped, added, settle(KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3])}
`)

// syncScript makes ARGV the member set. Staying members keep their counts;
// new ones join at 0, or with the count they still had in gone if they were
// removed while busy; removed busy ones move to gone, so the releases of
// their last requests stay exact.
//
// KEYS: load, gone, inst:<id> (the syncing instance's)
// ARGV: replicas...
// Reply: the instance's version (a set Redis lost is replayed).
var syncScript = rueidis.NewLuaScript(countFn + syncFn + versionFn + bumpFn + `
sync(KEYS[1], KEYS[2], ARGV)
return bump(KEYS[3])
`)

// syncFn is the body of syncScript, shared with syncQueueScript.
const syncFn = `
local function sync(load, gone, reps)
  local want = {}
  for i = 1, #reps do want[reps[i]] = true end
  local cur = redis.call('ZRANGE', load, 0, -1, 'WITHSCORES')
  for i = 1, #cur, 2 do
    local m = cur[i]
    if want[m] then
      want[m] = false
    else
      local s = count(load, m, cur[i + 1])
      redis.call('ZREM', load, m)
      if s > 0 then redis.call('ZINCRBY', gone, s, m) end
    end
  end
  for i = 1, #reps do
    local m = reps[i]
    if want[m] then
      want[m] = false
      local g = count(gone, m)
      if g then
        redis.call('ZREM', gone, m)
        redis.call('ZADD', load, g, m)
      else
        redis.call('ZADD', load, 0, m)
      end
    end
  end
  return redis.call('ZCARD', load)
end
`

// batchScript applies one numbered batch of an instance's picks and
// releases (least-request mode, see batcher), in order, once: a batch
// whose number is not above the last one applied (field "#" of the
// instance's hash) changes nothing, so a batch whose reply was lost can be
// sent again as it was.
//
// "#" is outside input too: one that no batch leaves (not a whole number
// from 0 to below maxVersion, which no instance numbers that far: inf or
// 1e300 read every batch as applied already, a word failed every script)
// reads as unknown. The batch is applied then, but a pick whose request
// is recorded already is not counted again (an exact one answers the
// replica recorded): a batch that ran, whose reply was lost, still counts
// once when it goes again. Its releases need nothing of the kind (a
// request without a record changes nothing). "#" then holds the batch's
// number again.
//
// Events, three arguments each: kind, request id, replica.
//
//	'+' count the request on replica (chosen by the instance from its view)
//	'*' count it on the least-loaded candidate (ties from the offset on)
//	'-' release the request: decrement the replica it was recorded on
//
// A pick on a replica no longer in the set counts where the replica's last
// requests do (gone) if they are still counted, else is not recorded.
//
// The pool's pick counter (member "n" of the picks sorted set) counts
// every pick recorded: the instances estimate from it how many picks they
// cannot see in their view (viewpick.go).
//
// KEYS: load, gone, alive:<id>, inst:<id>, insts, picks
// ARGV: leaseTTL ms, instance id, batch number, offset, n, n candidates, events...
// Reply: {1, exact pick's replica ("" none: no candidate is a member,
// or no exact pick), load as a flat member/score list, the pick counter,
// the picks this call recorded, the instance's version}.
var batchScript = rueidis.NewLuaScript(countFn + decr + versionFn + bumpFn + `
local load, gone, inst = KEYS[1], KEYS[2], KEYS[4]
local seq = tonumber(ARGV[3])
local off = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local picked = ''
local recorded = 0
local last = tonumber(redis.call('HGET', inst, '#') or '0')
local unsure = not (last and last >= 0 and last < ` + maxVersionLua + ` and last % 1 == 0)
if unsure or seq > last then
  redis.call('HSET', inst, '#', ARGV[3])
  for i = 6 + n, #ARGV, 3 do
    local kind, id, rep = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local r = (kind == '-' or unsure) and redis.call('HGET', inst, id)
    if kind == '-' then
      if r then
        redis.call('HDEL', inst, id)
        if r ~= '' then decr(load, gone, r) end
      end
    elseif r and r ~= '' then
      if kind == '*' then picked = r end -- recorded already (unsure only)
    else
      local where = nil
      if kind == '*' then
        rep = nil
        local best
        for j = 0, n - 1 do
          local c = ARGV[6 + (j + off) % n]
          local s = count(load, c)
          if s and (best == nil or s < best) then rep, best = c, s end
        end
        if rep then where, picked = load, rep end
      elseif redis.call('ZSCORE', load, rep) then
        where = load
      elseif redis.call('ZSCORE', gone, rep) then
        where = gone
      end
      if where then
        redis.call('ZINCRBY', where, 1, rep)
        redis.call('HSET', inst, id, rep)
        recorded = recorded + 1
      end
    end
  end
  if redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
  end
  redis.call('SADD', KEYS[5], ARGV[2])
  if recorded > 0 then redis.call('ZINCRBY', KEYS[6], recorded, 'n') end
else
  for i = 6 + n, #ARGV, 3 do
    if ARGV[i] == '*' then picked = redis.call('HGET', inst, ARGV[i + 1]) or '' end
  end
end
return {1, picked, counts(load), redis.call('ZSCORE', KEYS[6], 'n') or '0', recorded, bump(inst)}
`)
