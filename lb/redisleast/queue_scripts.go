package redisleast

import "github.com/redis/rueidis"

// Queueing mode scripts (see keys.go for the queue's keys). Every one of
// them ends by dispatching, so whatever frees a slot (a release, a reaped
// instance, a Sync adding replicas, the background kick) hands it to the
// oldest waiter at once.
//
// Cluster note: dispatch records a handed-over request under the WAITER's
// instance hash and publishes on its channel; those names are only known
// inside the script, so they are built from the hash tag (ARGV) instead of
// being passed in KEYS. They share the pool's hash tag, hence its slot.

// dispatchFn hands free slots to the oldest waiters: while the queue is
// non-empty, drop a cancelled head (no longer in waiters) or one whose
// instance is dead (liveness key gone); else, if the least-loaded member
// is under maxIn, pop the head and, unless the request was barred (a
// tombstone: its select was given up as lost), count the request on that
// member, record it under the waiter's instance (so the reaper reclaims it
// if that instance dies), note the assignment and PUBLISH "<request id>
// <replica>" on the waiter instance's channel. Returns how many it handed.
//
// A waiter is given any member except those its avoid entry names (the
// replicas its instance had down, or that were not among its candidates):
// the least loaded of the others, once one is under maxIn. The head waits
// for such a slot (FIFO: nobody overtakes it). A head whose avoid entry
// names every member has no slot to wait for (its candidates left the
// pool): it is refused at once — popped, barred by a tombstone under its
// instance (so reconcile does not queue it again) and told by PUBLISH
// "<request id> " (no replica) — and the next waiter goes on.
const dispatchFn = `
local function dispatch(tag, maxIn)
  local load, queue, waiters, assigned = tag .. ':load', tag .. ':queue', tag .. ':waiters', tag .. ':assigned'
  local avoidKey = tag .. ':avoid'
  local n = 0
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then break end
    local inst = redis.call('HGET', waiters, head)
    if inst and redis.call('EXISTS', tag .. ':alive:' .. inst) == 0 then
      -- its instance died: drop it now, whatever slot it would wait for
      redis.call('HDEL', waiters, head)
      inst = nil
    end
    if not inst then
      redis.call('LPOP', queue)
      redis.call('HDEL', avoidKey, head)
    else
      local rep, refused
      local avoid = redis.call('HGET', avoidKey, head)
      if avoid then
        local skip = {}
        for m in string.gmatch(avoid, '[^,]+') do skip[m] = true end
        local free = redis.call('ZRANGEBYSCORE', load, '-inf', '(' .. maxIn, 'WITHSCORES')
        for i = 1, #free, 2 do
          if not skip[free[i]] and count(load, free[i], free[i + 1]) < maxIn then rep = free[i] break end
        end
        if not rep then
          refused = true
          local all = redis.call('ZRANGE', load, 0, -1)
          for i = 1, #all do
            if not skip[all[i]] then refused = false break end
          end
        end
      else
        local m, s = least(load)
        if m and s < maxIn then rep = m end
      end
      if not rep and not refused then break end
      redis.call('LPOP', queue)
      redis.call('HDEL', waiters, head)
      redis.call('HDEL', avoidKey, head)
      local req = string.match(head, ':([^:]*)$')
      local ikey = tag .. ':inst:' .. inst
      if refused then
        redis.call('HSET', ikey, req, '')
        redis.call('PUBLISH', tag .. ':notify:' .. inst, req .. ' ')
      elseif redis.call('HEXISTS', ikey, req) == 0 then
        redis.call('ZINCRBY', load, 1, rep)
        redis.call('HSET', ikey, req, rep)
        redis.call('SADD', tag .. ':insts', inst)
        redis.call('HSET', assigned, head, rep)
        redis.call('PUBLISH', tag .. ':notify:' .. inst, req .. ' ' .. rep)
        n = n + 1
      end
    end
  end
  return n
end
`

// selectQueueScript is selectScript in queueing mode: the least-loaded
// candidate is taken only if it is under maxIn AND nobody is queued (a new
// request never overtakes a waiting one); otherwise the request joins the
// global queue and the script dispatches (which hands it a slot at once if
// one is free and it is first in line).
//
// KEYS: load, alive:<id>, inst:<id>, insts, queue, waiters, assigned, avoid
// ARGV: maxInflight (> 0), leaseTTL ms, request id, instance id, offset, tag,
// avoid ("" or comma-separated members it must not be handed), candidates...
// Reply: {1, replica, version} selected (directly or handed over at
// once); {4, "", version} queued: the replica comes by notification;
// {0, "", version} no candidate is a member; {3, "", version} barred (as
// selectScript).
var selectQueueScript = rueidis.NewLuaScript(countFn + dispatchFn + versionFn + bumpFn + `
local v = bump(KEYS[3])
local prev = redis.call('HGET', KEYS[3], ARGV[3])
if prev == '' then return {3, '', v} end
if prev then return {1, prev, v} end
local tok = ARGV[4] .. ':' .. ARGV[3]
if redis.call('HEXISTS', KEYS[6], tok) == 1 then return {4, '', v} end
local maxIn = tonumber(ARGV[1])
local n = #ARGV - 7
local off = tonumber(ARGV[5])
local best, bestScore
for i = 0, n - 1 do
  local c = ARGV[8 + (i + off) % n]
  local s = count(KEYS[1], c)
  if s and (best == nil or s < bestScore) then best, bestScore = c, s end
end
if best == nil then return {0, '', v} end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
redis.call('SADD', KEYS[4], ARGV[4])
if bestScore < maxIn and redis.call('LLEN', KEYS[5]) == 0 then
  redis.call('ZINCRBY', KEYS[1], 1, best)
  redis.call('HSET', KEYS[3], ARGV[3], best)
  return {1, best, v}
end
redis.call('RPUSH', KEYS[5], tok)
redis.call('HSET', KEYS[6], tok, ARGV[4])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[8], tok, ARGV[7]) end
dispatch(ARGV[6], maxIn)
local got = redis.call('HGET', KEYS[3], ARGV[3])
if got and got ~= '' then return {1, got, v} end
if redis.call('HEXISTS', KEYS[6], tok) == 1 then return {4, '', v} end
return {3, '', v}
`)

// releaseQueueScript is releaseScript in queueing mode: it also forgets
// the requests' assignments, takes a request that ended out of the queue
// if its token is still there (a lost select, "?id"; or a waiter a
// rollback put back after it had left with a hand-over Redis lost), and
// dispatches the freed slots.
//
// KEYS: load, gone, inst:<id>, queue, waiters, assigned, avoid
// ARGV: maxInflight, tag, instance id, request ids...
// Reply: the instance's version.
var releaseQueueScript = rueidis.NewLuaScript(countFn + decr + dispatchFn + versionFn + bumpFn + `
local me = ARGV[3]
for i = 4, #ARGV do
  local id, lost = ARGV[i], false
  if string.sub(id, 1, 1) == '?' then id, lost = string.sub(id, 2), true end
  local tok = me .. ':' .. id
  redis.call('HDEL', KEYS[6], tok)
  if redis.call('HDEL', KEYS[5], tok) == 1 then
    redis.call('LREM', KEYS[4], 1, tok)
    redis.call('HDEL', KEYS[7], tok)
  end
  local rep = redis.call('HGET', KEYS[3], id)
  if rep and rep ~= '' then
    redis.call('HDEL', KEYS[3], id)
    decr(KEYS[1], KEYS[2], rep)
  elseif lost and not rep then
    redis.call('HSET', KEYS[3], id, '')
  end
end
dispatch(ARGV[2], tonumber(ARGV[1]))
return bump(KEYS[3])
`)

// cancelQueueScript takes a waiter out of the queue (its client gave up,
// or its QueueTimeout passed).
//
// KEYS: queue, waiters, assigned, avoid, inst:<id> (the waiter's)
// ARGV: token
// Reply: {0, "", version} it was still queued and is removed;
// {1, replica, version} it was handed a slot meanwhile (the caller owns
// that lease); {2, "", version} neither (dropped by dispatch: its instance
// looked dead, or it was barred).
var cancelQueueScript = rueidis.NewLuaScript(versionFn + bumpFn + `
local v = bump(KEYS[5])
if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[1], 1, ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  return {0, '', v}
end
local a = redis.call('HGET', KEYS[3], ARGV[1])
if a then return {1, a, v} end
return {2, '', v}
`)

// reapQueueScript is reapScript in queueing mode: it also forgets the dead
// instance's assignments and dispatches the reclaimed slots. The dead
// instance's waiters are dropped by dispatch when they reach the head.
//
// KEYS: load, gone, alive:<id>, inst:<id>, insts, assigned
// ARGV: instance id, maxInflight, tag
// Reply: -1 alive; else the number of requests reclaimed.
var reapQueueScript = rueidis.NewLuaScript(countFn + decr + dispatchFn + `
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
local kv = redis.call('HGETALL', KEYS[4])
redis.call('DEL', KEYS[4]) -- first: decr's recount must not count them
local n = 0
for i = 1, #kv, 2 do
  redis.call('HDEL', KEYS[6], ARGV[1] .. ':' .. kv[i])
  if kv[i] ~= '#' and kv[i] ~= '!' and kv[i + 1] ~= '' then
    decr(KEYS[1], KEYS[2], kv[i + 1])
    n = n + 1
  end
end
redis.call('SREM', KEYS[5], ARGV[1])
dispatch(ARGV[3], tonumber(ARGV[2]))
return n
`)

// reconcileQueueScript is reconcileScript in queueing mode: the records
// of the instance's waiting requests are kept (a hand-over on its way),
// those of its waiters Redis lost (not queued, not handed a slot, not
// barred) are queued again at the tail, its waiters it no longer waits for
// leave the queue, the dropped records' assignments go, and the freed
// slots are dispatched.
//
// KEYS: load, gone, alive:<id>, inst:<id>, insts, queue, waiters, assigned, avoid
// ARGV: leaseTTL ms, instance id, version floor, maxInflight, tag, n,
// n (waiting request id, avoid list) pairs, (request id, replica)...
// Reply: {records and waiters dropped, records and waiters added, the
// instance's version}.
var reconcileQueueScript = rueidis.NewLuaScript(countFn + decr + dispatchFn + versionFn + reconcileFn + `
local me, nw = ARGV[2], tonumber(ARGV[6])
local waiting = {}
for i = 7, 6 + 2 * nw, 2 do waiting[ARGV[i]] = true end
local dropped, added = reconcile(KEYS[1], KEYS[2], KEYS[4], ARGV, 7 + 2 * nw, waiting)
for i = 7, 6 + 2 * nw, 2 do
  local tok = me .. ':' .. ARGV[i]
  if redis.call('HEXISTS', KEYS[7], tok) == 0 and redis.call('HEXISTS', KEYS[4], ARGV[i]) == 0 then
    redis.call('RPUSH', KEYS[6], tok)
    redis.call('HSET', KEYS[7], tok, me)
    if ARGV[i + 1] ~= '' then redis.call('HSET', KEYS[9], tok, ARGV[i + 1]) end
    added = added + 1
  end
end
for i = 1, #dropped do redis.call('HDEL', KEYS[8], me .. ':' .. dropped[i]) end
local left = 0
local w = redis.call('HGETALL', KEYS[7])
for i = 1, #w, 2 do
  if w[i + 1] == me and not waiting[string.match(w[i], ':([^:]*)$')] then
    redis.call('HDEL', KEYS[7], w[i])
    redis.call('LREM', KEYS[6], 1, w[i])
    redis.call('HDEL', KEYS[9], w[i])
    left = left + 1
  end
end
local v = settle(KEYS[3], KEYS[4], KEYS[5], ARGV[1], me, ARGV[3])
dispatch(ARGV[5], tonumber(ARGV[4]))
return {#dropped + left, added, v}
`)

// syncQueueScript is syncScript in queueing mode: new members' free slots
// go to the waiters at once.
//
// KEYS: load, gone, queue, inst:<id> (the syncing instance's)
// ARGV: maxInflight, tag, replicas...
// Reply: the instance's version (as syncScript).
var syncQueueScript = rueidis.NewLuaScript(countFn + syncFn + dispatchFn + versionFn + bumpFn + `
local reps = {}
for i = 3, #ARGV do reps[#reps + 1] = ARGV[i] end
sync(KEYS[1], KEYS[2], reps)
dispatch(ARGV[2], tonumber(ARGV[1]))
return bump(KEYS[4])
`)

// kickQueueScript dispatches whatever is free (a safety net run by the
// background loop and when the breaker closes) and reports the queue.
//
// KEYS: queue, waiters, load
// ARGV: maxInflight, tag
// Reply: {handed over, queue length, waiting}: the list may still hold
// cancelled tokens, waiting counts live waiters only.
var kickQueueScript = rueidis.NewLuaScript(countFn + dispatchFn + `
local n = dispatch(ARGV[2], tonumber(ARGV[1]))
return {n, redis.call('LLEN', KEYS[1]), redis.call('HLEN', KEYS[2])}
`)
