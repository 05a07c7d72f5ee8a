package redisleast

// A count in {tag}:load or {tag}:gone is outside input: an operator, a
// foreign client or an older version may have left any score there, and
// the scripts' arithmetic does not bring a wrong one back: -inf + 1 is
// -inf (the replica is the least loaded for good, past max_inflight),
// +inf - 1 is +inf (never picked again), a fraction ends below zero. So
// the scripts read every score they act on through count, which takes one
// that is not a whole number in 0..maxCount for corrupt and counts the
// replica's requests again from the records: one per field naming it in
// the hashes of the instances in {tag}:insts, the same records every
// count change goes with (see keys.go). That scans every record, but only
// when a score is corrupt; a sane one costs nothing more than before.
//
// The callers of decr drop the request's record first, so a recount
// there already leaves the request out, and decr does not decrement it
// again.
//
// The key names are built from the tag (keys.go: load and gone are
// tag .. ':load' and tag .. ':gone'), as dispatch does: on a Cluster they
// share the pool's slot.
const countFn = `
local maxCount = 2147483648

-- recount sets rep's count in key (load or gone) to the records naming
-- it, dropping it from gone at zero (nil then).
local function recount(key, rep)
  local tag = string.sub(key, 1, -6)
  local n = 0
  local ids = redis.call('SMEMBERS', tag .. ':insts')
  for i = 1, #ids do
    local kv = redis.call('HGETALL', tag .. ':inst:' .. ids[i])
    for j = 1, #kv, 2 do
      if kv[j + 1] == rep and kv[j] ~= '#' and kv[j] ~= '!' then n = n + 1 end
    end
  end
  if n == 0 and key == tag .. ':gone' then
    redis.call('ZREM', key, rep)
    return nil
  end
  redis.call('ZADD', key, n, rep)
  return n
end

-- count is rep's count in key, from its score s (read if not given), or
-- nil if rep is not there; the second value is true when it was counted
-- again. tonumber reads 'inf', '-inf' and 'nan' too.
local function count(key, rep, s)
  s = s or redis.call('ZSCORE', key, rep)
  if not s then return nil, false end
  local n = tonumber(s)
  if n and n >= 0 and n <= maxCount and n % 1 == 0 then return n, false end
  return recount(key, rep), true
end

-- least is the least loaded member of load and its count (nil if load
-- is empty), counting corrupt lowest scores again until the lowest is sane.
local function least(load)
  while true do
    local top = redis.call('ZRANGE', load, 0, 0, 'WITHSCORES')
    if #top == 0 then return nil end
    local n, recounted = count(load, top[1], top[2])
    if not recounted then return top[1], n end
  end
end

-- counts is load as a flat member/score list, corrupt scores counted again.
local function counts(load)
  local zs = redis.call('ZRANGE', load, 0, -1, 'WITHSCORES')
  for i = 1, #zs, 2 do
    local n, recounted = count(load, zs[i], zs[i + 1])
    if recounted then zs[i + 1] = tostring(n) end
  end
  return zs
end
`
