package redisleast

import "github.com/redis/rueidis"

// Queueing mode scripts (see keys.go for the queue's keys). Every one of
// them ends by dispatching, so whatever frees a slot (a release, a reaped
// instance, a Sync adding replicas, the background kick) hands it at
// once to the oldest waiter that may use it.
//
// Cluster note: dispatch records a handed-over request under the WAITER's
// instance hash and publishes on its channel; those names are only known
// inside the script, so they are built from the hash tag (ARGV) instead of
// being passed in KEYS. They share the pool's hash tag, hence its slot.

// dispatchFn hands free slots to the waiters, oldest first. Each waiter
// carries its candidates ({tag}:cands: the replicas its instance's pool
// lists, less those its request excluded and those its instance had
// down), and is only ever handed one of them:
//
//   - the free members (under maxIn, counts read through count) are read
//     once, least loaded first;
//   - the queue is scanned from its head: a cancelled token (no longer in
//     waiters) or one whose instance is dead (liveness key gone) is
//     dropped; a waiter some free member of whose candidates is left is
//     handed the least loaded of them: unless the request was barred (a
//     tombstone: its select was given up as lost) it is counted on it,
//     recorded under the waiter's instance (so the reaper reclaims it if
//     that instance dies), its assignment noted and "<request id>
//     <replica>" PUBLISHed on the waiter instance's channel;
//   - a waiter none of whose candidates is a member any more (they left
//     the pool: another instance synced a set without them) has no slot
//     to wait for: it is refused — barred by a tombstone under its
//     instance (so reconcile does not queue it again) and told by PUBLISH
//     "<request id> " (no replica), and its instance picks for it again;
//   - any other waiter keeps its place and the scan goes on: a freed
//     replica goes to the first waiter that may use it, so nobody waits
//     behind a waiter that cannot take the free slot (whose pool lacks
//     the replica), and a waiter is passed over only for slots it may not
//     use: each slot of one of its candidates that frees goes to it or to
//     a waiter ahead of it (new requests queue behind it), so it is served
//     once those ahead of it are.
//
// The scan stops when no free slot is left, unless full (a change of
// members, reconcile queueing waiters again), when it goes to the tail so
// that every waiter left with no candidate in the pool is refused at
// once. The free members only get fewer and busier during one scan, so a
// candidate list that found none free is not looked at again (nor is an
// instance's liveness).
//
// {tag}:idle names members that no queued waiter lists among its
// candidates (a replica only some instances' pools have, while their
// requests are not queued): a scan leaves them out of the free ones, so a
// release of a shared replica is not followed by a scan of the whole
// queue in search of a taker for such a member, at every dispatch. It
// holds that invariant at the end of every script: a scan that looked at
// every waiter left writes it exactly, a waiter joining the queue takes
// its candidates out of it (selectQueueScript; reconcile, which queues
// waiters again, deletes it), and a waiter leaving only makes it truer.
// It only ever leaves out members nobody waiting may use, so it changes
// no hand-over; a full scan ignores it (and writes it again).
//
// A waiter without a candidates entry (lost, or queued by an older
// version) is refused: what it may be handed is not known (an older
// version's {tag}:avoid entry for it goes with it). Returns how many it
// handed.
const dispatchFn = `
-- enqueue gives tok the next place in the queue's order ({tag}:qseq).
local function enqueue(tag, tok)
  local k = tag .. ':qseq'
  local s = (tonumber(redis.call('HGET', k, '#')) or 0) + 1
  redis.call('HSET', k, '#', s, tok, s)
end

local function dispatch(tag, maxIn, full)
  local load, queue, waiters, assigned = tag .. ':load', tag .. ':queue', tag .. ':waiters', tag .. ':assigned'
  local candsKey, idleKey, seqKey = tag .. ':cands', tag .. ':idle', tag .. ':qseq'
  local idle = {}
  if not full then
    local kv = redis.call('HGETALL', idleKey)
    for i = 1, #kv, 2 do idle[kv[i]] = true end
  end
  local free = {}
  local zs = redis.call('ZRANGEBYSCORE', load, '-inf', '(' .. maxIn, 'WITHSCORES')
  for i = 1, #zs, 2 do
    if not idle[zs[i]] then
      local c = count(load, zs[i], zs[i + 1])
      if c < maxIn then free[#free + 1] = {m = zs[i], n = c, i = i} end
    end
  end
  table.sort(free, function(x, y) return x.n < y.n or (x.n == y.n and x.i < y.i) end)
  local sets, none, served, alive, kept = {}, {}, {}, {}, {}
  local n, i, complete = 0, 0, false
  while full or #free > 0 do
    local head = redis.call('LINDEX', queue, i)
    if not head then complete = true break end
    -- LREM removes the first copy of a token: this one, or a stale copy
    -- ahead of it; either way the next token to look at is then at i
    local drop = false
    local inst = redis.call('HGET', waiters, head)
    if inst then
      if alive[inst] == nil then alive[inst] = redis.call('EXISTS', tag .. ':alive:' .. inst) == 1 end
      if not alive[inst] then
        -- its instance died: drop it now, whatever slot it would wait for
        redis.call('HDEL', waiters, head)
        inst = nil
      end
    end
    if not inst then
      drop = true
      redis.call('HDEL', candsKey, head)
      redis.call('HDEL', seqKey, head)
    else
      -- no entry (lost, or queued by an older version): its candidates
      -- are unknown, so it is refused and its instance picks again
      local cands = redis.call('HGET', candsKey, head) or ''
      local allow = sets[cands]
      if not allow then
        allow = {}
        for m in string.gmatch(cands, '[^\n]+') do allow[m] = true end
        sets[cands] = allow
      end
      local j
      if not none[cands] then
        for f = 1, #free do
          if allow[free[f].m] then j = f break end
        end
        if not j then none[cands] = true end
      end
      local refused = false
      if not j then
        if served[cands] == nil then
          served[cands] = false
          for m in pairs(allow) do
            if redis.call('ZSCORE', load, m) then served[cands] = true break end
          end
        end
        refused = not served[cands]
      end
      if not (j or refused) then
        kept[cands] = true
      else
        drop = true
        redis.call('HDEL', waiters, head)
        redis.call('HDEL', candsKey, head)
        if cands == '' then redis.call('HDEL', tag .. ':avoid', head) end -- an older version's entry
        local req = string.match(head, ':([^:]*)$')
        local ikey = tag .. ':inst:' .. inst
        if refused then
          redis.call('HDEL', seqKey, head)
          if redis.call('HEXISTS', ikey, req) == 0 then redis.call('HSET', ikey, req, '') end
          redis.call('PUBLISH', tag .. ':notify:' .. inst, req .. ' ')
        elseif redis.call('HEXISTS', ikey, req) == 0 then
          local f = free[j]
          redis.call('ZINCRBY', load, 1, f.m)
          redis.call('HSET', ikey, req, f.m)
          redis.call('SADD', tag .. ':insts', inst)
          redis.call('HSET', assigned, head, f.m)
          redis.call('PUBLISH', tag .. ':notify:' .. inst, req .. ' ' .. f.m)
          -- its seq stays until the slot is released: a hand-over its
          -- instance's health refuses goes back to this place (requeue)
          n = n + 1
          f.n = f.n + 1
          if f.n >= maxIn then
            table.remove(free, j)
          else -- keep free least loaded first
            while free[j + 1] and free[j + 1].n < f.n do
              free[j], free[j + 1] = free[j + 1], f
              j = j + 1
            end
          end
        else -- barred: its select was given up as lost
          redis.call('HDEL', seqKey, head)
        end
      end
    end
    if drop then redis.call('LREM', queue, 1, head) else i = i + 1 end
  end
  if complete then
    -- every waiter left was looked at: idle is now exactly the members
    -- none of them lists
    redis.call('DEL', idleKey)
    if next(kept) then
      local want = {}
      for cands in pairs(kept) do
        for m in pairs(sets[cands]) do want[m] = true end
      end
      local all = redis.call('ZRANGE', load, 0, -1)
      for k = 1, #all do
        if not want[all[k]] then redis.call('HSET', idleKey, all[k], '1') end
      end
    end
  end
  return n
end
`

// selectQueueScript is selectScript in queueing mode: the least-loaded
// candidate is taken only if it is under maxIn AND nobody is queued (a
// new request never takes a slot a waiting one may use); otherwise the
// request joins the global queue with its candidates (taking them out of
// {tag}:idle) and the script dispatches (which hands it a slot at once if
// one of its candidates is free and no waiter ahead of it may take that
// slot).
//
// KEYS: load, alive:<id>, inst:<id>, insts, queue, waiters, assigned, cands, idle
// ARGV: maxInflight (> 0), leaseTTL ms, request id, instance id, offset, tag,
// candidates... (what the waiter may be handed; kept newline-separated,
// candSep, in {tag}:cands)
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
local n = #ARGV - 6
local off = tonumber(ARGV[5])
local best, bestScore
for i = 0, n - 1 do
  local c = ARGV[7 + (i + off) % n]
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
enqueue(ARGV[6], tok)
redis.call('HSET', KEYS[6], tok, ARGV[4])
redis.call('HSET', KEYS[8], tok, table.concat(ARGV, '\n', 7))
if redis.call('EXISTS', KEYS[9]) == 1 then -- its candidates are wanted now
  for i = 7, #ARGV, 256 do redis.call('HDEL', KEYS[9], unpack(ARGV, i, math.min(i + 255, #ARGV))) end
end
dispatch(ARGV[6], maxIn, false)
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
// KEYS: load, gone, inst:<id>, queue, waiters, assigned, cands
// ARGV: maxInflight, tag, instance id, request ids...
// Reply: the instance's version.
var releaseQueueScript = rueidis.NewLuaScript(countFn + decr + dispatchFn + versionFn + bumpFn + `
local me = ARGV[3]
for i = 4, #ARGV do
  local id, lost = ARGV[i], false
  if string.sub(id, 1, 1) == '?' then id, lost = string.sub(id, 2), true end
  local tok = me .. ':' .. id
  redis.call('HDEL', KEYS[6], tok)
  redis.call('HDEL', ARGV[2] .. ':qseq', tok)
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
dispatch(ARGV[2], tonumber(ARGV[1]), false)
return bump(KEYS[3])
`)

// cancelQueueScript takes a waiter out of the queue (its client gave up,
// or its QueueTimeout passed).
//
// KEYS: queue, waiters, assigned, cands, inst:<id> (the waiter's)
// ARGV: token, tag
// Reply: {0, "", version} it was still queued and is removed;
// {1, replica, version} it was handed a slot meanwhile (the caller owns
// that lease); {2, "", version} neither (dropped by dispatch: its instance
// looked dead, or it was barred).
var cancelQueueScript = rueidis.NewLuaScript(versionFn + bumpFn + `
local v = bump(KEYS[5])
local seqKey = ARGV[2] .. ':qseq'
if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[1], 1, ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('HDEL', seqKey, ARGV[1])
  return {0, '', v}
end
local a = redis.call('HGET', KEYS[3], ARGV[1])
if a then return {1, a, v} end -- its seq goes with the release
redis.call('HDEL', seqKey, ARGV[1])
return {2, '', v}
`)

// reapQueueScript is reapScript in queueing mode: it also forgets the dead
// instance's assignments and dispatches the reclaimed slots. The dead
// instance's waiters are dropped by dispatch when its scan reaches them.
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
  redis.call('HDEL', ARGV[3] .. ':qseq', ARGV[1] .. ':' .. kv[i])
  if kv[i] ~= '#' and kv[i] ~= '!' and kv[i + 1] ~= '' then
    decr(KEYS[1], KEYS[2], kv[i + 1])
    n = n + 1
  end
end
redis.call('SREM', KEYS[5], ARGV[1])
dispatch(ARGV[3], tonumber(ARGV[2]), false)
return n
`)

// reconcileQueueScript is reconcileScript in queueing mode: the records
// of the instance's waiting requests are kept (a hand-over on its way),
// those of its waiters Redis lost (not queued, not handed a slot, not
// barred) are queued again at the tail, its waiters it no longer waits for
// leave the queue, the dropped records' assignments go, and the freed
// slots are dispatched (a full scan: a waiter queued again whose
// candidates left the pool meanwhile is refused at once).
//
// KEYS: load, gone, alive:<id>, inst:<id>, insts, queue, waiters, assigned, cands, idle
// ARGV: leaseTTL ms, instance id, version floor, maxInflight, tag, n,
// n (waiting request id, candidates newline-separated) pairs, (request
// id, replica)...
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
    enqueue(ARGV[5], tok) -- at the tail: a place of its own
    redis.call('HSET', KEYS[7], tok, me)
    redis.call('HSET', KEYS[9], tok, ARGV[i + 1])
    redis.call('DEL', KEYS[10]) -- its candidates may be idle members
    added = added + 1
  end
end
for i = 1, #dropped do
  redis.call('HDEL', KEYS[8], me .. ':' .. dropped[i])
  redis.call('HDEL', ARGV[5] .. ':qseq', me .. ':' .. dropped[i])
end
local left = 0
local w = redis.call('HGETALL', KEYS[7])
for i = 1, #w, 2 do
  if w[i + 1] == me and not waiting[string.match(w[i], ':([^:]*)$')] then
    redis.call('HDEL', KEYS[7], w[i])
    redis.call('LREM', KEYS[6], 1, w[i])
    redis.call('HDEL', KEYS[9], w[i])
    redis.call('HDEL', ARGV[5] .. ':qseq', w[i])
    left = left + 1
  end
end
local v = settle(KEYS[3], KEYS[4], KEYS[5], ARGV[1], me, ARGV[3])
dispatch(ARGV[5], tonumber(ARGV[4]), true)
return {#dropped + left, added, v}
`)

// syncQueueScript is syncScript in queueing mode: new members' free slots
// go to the waiters at once, and waiters none of whose candidates is left
// a member are refused at once (a full scan).
//
// KEYS: load, gone, queue, inst:<id> (the syncing instance's)
// ARGV: maxInflight, tag, replicas...
// Reply: the instance's version (as syncScript).
var syncQueueScript = rueidis.NewLuaScript(countFn + syncFn + dispatchFn + versionFn + bumpFn + `
local reps = {}
for i = 3, #ARGV do reps[#reps + 1] = ARGV[i] end
sync(KEYS[1], KEYS[2], reps)
dispatch(ARGV[2], tonumber(ARGV[1]), true)
return bump(KEYS[4])
`)

// kickQueueScript dispatches whatever is free (a safety net run by the
// background loop and when the breaker closes) and reports the queue. It
// also forgets the places ({tag}:qseq) of tokens neither waiting nor
// handed a slot, which only an older version's scripts leave behind (they
// know nothing of them): read whole only when there are such.
//
// KEYS: queue, waiters, load
// ARGV: maxInflight, tag
// Reply: {handed over, queue length, waiting}: the list may still hold
// cancelled tokens, waiting counts live waiters only.
var kickQueueScript = rueidis.NewLuaScript(countFn + dispatchFn + `
local n = dispatch(ARGV[2], tonumber(ARGV[1]), false)
local seqKey, assigned = ARGV[2] .. ':qseq', ARGV[2] .. ':assigned'
if redis.call('HLEN', seqKey) > 1 + redis.call('HLEN', KEYS[2]) + redis.call('HLEN', assigned) then
  local kv = redis.call('HGETALL', seqKey)
  for i = 1, #kv, 2 do
    if kv[i] ~= '#' and redis.call('HEXISTS', KEYS[2], kv[i]) == 0 and redis.call('HEXISTS', assigned, kv[i]) == 0 then
      redis.call('HDEL', seqKey, kv[i])
    end
  end
end
return {n, redis.call('LLEN', KEYS[1]), redis.call('HLEN', KEYS[2])}
`)

// requeueQueueScript puts back in the queue a waiter whose instance
// refused the slot it was handed (passive health has the replica down, or
// its one probe is taken): the slot is released and dispatched, and the
// waiter, under a new request id, takes its old place ({tag}:qseq: before
// the first token that queued after it), less that replica. Queueing it
// again at the tail would let every request that queued after it go
// first, each time its instance refuses a slot.
//
// KEYS: load, gone, inst:<id>, queue, waiters, assigned, cands, idle
// ARGV: maxInflight, tag, instance id, request id handed the slot,
// replica refused, new request id, candidates... (not empty)
// Reply: as selectQueueScript for the new request id; {2, "", version}
// the slot is no longer the request's (reaped, or released): nothing
// done.
var requeueQueueScript = rueidis.NewLuaScript(countFn + decr + dispatchFn + versionFn + bumpFn + `
local v = bump(KEYS[3])
local me, old, req = ARGV[3], ARGV[4], ARGV[6]
if redis.call('HGET', KEYS[3], old) ~= ARGV[5] then return {2, '', v} end
local oldTok, tok = me .. ':' .. old, me .. ':' .. req
redis.call('HDEL', KEYS[3], old)
redis.call('HDEL', KEYS[6], oldTok)
decr(KEYS[1], KEYS[2], ARGV[5])
local seqKey = ARGV[2] .. ':qseq'
local s = tonumber(redis.call('HGET', seqKey, oldTok))
redis.call('HDEL', seqKey, oldTok)
local at -- its place: before the first token that queued after it
if s then
  redis.call('HSET', seqKey, tok, s)
  local last = redis.call('LINDEX', KEYS[4], -1)
  if last and (tonumber(redis.call('HGET', seqKey, last)) or 0) > s then
    -- the queue is in seq order (tokens without one, an older version's,
    -- are passed over); rebuilt with the commands the others use (the
    -- permission check covers them), on this rare path only
    local all = redis.call('LPOP', KEYS[4], redis.call('LLEN', KEYS[4]))
    for i = 1, #all, 256 do
      local seqs = redis.call('HMGET', seqKey, unpack(all, i, math.min(i + 255, #all)))
      for k = 1, #seqs do
        local o = tonumber(seqs[k])
        if o and o > s then at = i + k - 1 break end
      end
      if at then break end
    end
    at = at or #all + 1
    table.insert(all, at, tok)
    for i = 1, #all, 256 do redis.call('RPUSH', KEYS[4], unpack(all, i, math.min(i + 255, #all))) end
  end
else
  enqueue(ARGV[2], tok)
end
if not at then redis.call('RPUSH', KEYS[4], tok) end
redis.call('HSET', KEYS[5], tok, me)
redis.call('HSET', KEYS[7], tok, table.concat(ARGV, '\n', 7))
if redis.call('EXISTS', KEYS[8]) == 1 then
  for i = 7, #ARGV, 256 do redis.call('HDEL', KEYS[8], unpack(ARGV, i, math.min(i + 255, #ARGV))) end
end
dispatch(ARGV[2], tonumber(ARGV[1]), false)
local got = redis.call('HGET', KEYS[3], req)
if got and got ~= '' then return {1, got, v} end
if redis.call('HEXISTS', KEYS[5], tok) == 1 then return {4, '', v} end
return {3, '', v}
`)
