"""The budget ledger's Lua: one script reserves all of a request's limits, one settles them.

Every key of both scripts is in the budget slot (``{<prefix>.budget}``, see ``redis_ledger``), so each runs whole on
one Redis Cluster node. Fixed-window counters are STRINGs (INCRBY); rolling ones are HASHes of bucket -> amount.

Few, packed arguments (a counter is one space-separated string, ``-`` for none; the report rows are their field
prefixes, one per line): redis-py's encoding of each argument is most of a call's client-side CPU.

RESERVE  KEYS: leases, done:<rid>, day:<date>, counters...
         ARGV: rid, now_ms, lease_expires_ms, done_ttl_s, day_expire_ms, key base, reap_batch, row prefixes,
               estimate "in out cached cost", then per counter "bucket cap amount expire_ms min_bucket bucket_ms
               resets_ms"
         -> {0} admitted, {2} already reserved, {1, i, used, resets_ms} refused by counter i (1-based)
SETTLE   KEYS: leases, done:<rid>, day:<date>, counters...
         ARGV: rid, done_ttl_s, day_expire_ms, row prefixes, reserved "in out cached cost", actual "in out cached
               cost", requests (1 served, 0 given back), then per counter "bucket reserved actual expire_ms"
         -> 1 settled (delta applied), 2 added in full (the store never saw the reservation), 0 already settled
"""

from __future__ import annotations

RESERVE = """
local rid, now = ARGV[1], tonumber(ARGV[2])
local done_ttl, day_exp, base, batch = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local function words(s)
  local out = {}
  for w in string.gmatch(s, '%S+') do out[#out + 1] = w end
  return out
end
local function rows(s)
  local out = {}
  for line in string.gmatch(s, '[^\\n]+') do out[#out + 1] = line end
  return out
end
-- reservations whose gateway never settled them: settled at their estimate (already counted), once
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
for _, old in ipairs(expired) do
  redis.call('SET', base .. 'done:' .. old, '1', 'EX', done_ttl)
  redis.call('ZREM', KEYS[1], old)
end
if redis.call('ZSCORE', KEYS[1], rid) or redis.call('EXISTS', KEYS[2]) == 1 then
  return {2}
end
local prefixes = rows(ARGV[8])
local counters = {}
for i = 10, #ARGV do counters[#counters + 1] = words(ARGV[i]) end
for i, c in ipairs(counters) do
  local key, bucket, cap, amount = KEYS[3 + i], c[1], tonumber(c[2]), tonumber(c[3])
  local value, oldest = 0, nil
  if bucket == '-' then
    value = tonumber(redis.call('GET', key) or '0')
  else
    local min_bucket = tonumber(c[5])
    local flat = redis.call('HGETALL', key)
    for j = 1, #flat, 2 do
      local b, v = tonumber(flat[j]), tonumber(flat[j + 1])
      if b < min_bucket then
        redis.call('HDEL', key, flat[j])
      else
        value = value + v
        if v > 0 and (oldest == nil or b < oldest) then oldest = b end
      end
    end
  end
  if value + amount > cap then
    local resets = tonumber(c[7])
    if bucket ~= '-' then
      local min_bucket, bucket_ms = tonumber(c[5]), tonumber(c[6])
      resets = ((oldest or min_bucket) + tonumber(bucket) - min_bucket + 1) * bucket_ms
    end
    for _, p in ipairs(prefixes) do redis.call('HINCRBY', KEYS[3], p .. 'rejections', 1) end
    redis.call('PEXPIREAT', KEYS[3], day_exp)
    return {1, i, value, resets}
  end
end
for i, c in ipairs(counters) do
  local key = KEYS[3 + i]
  if c[1] == '-' then
    redis.call('INCRBY', key, c[3])
  else
    redis.call('HINCRBY', key, c[1], c[3])
  end
  redis.call('PEXPIREAT', key, c[4])
end
local est = words(ARGV[9])
local names = {'input_tokens', 'output_tokens', 'cached_tokens', 'cost_micro_usd'}
for _, p in ipairs(prefixes) do
  redis.call('HINCRBY', KEYS[3], p .. 'requests', 1)
  for k, name in ipairs(names) do
    if tonumber(est[k]) ~= 0 then redis.call('HINCRBY', KEYS[3], p .. name, est[k]) end
  end
end
redis.call('PEXPIREAT', KEYS[3], day_exp)
redis.call('ZADD', KEYS[1], ARGV[3], rid)
return {0}
"""

SETTLE = """
local rid, done_ttl, day_exp = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local function words(s)
  local out = {}
  for w in string.gmatch(s, '%S+') do out[#out + 1] = w end
  return out
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local held = redis.call('ZREM', KEYS[1], rid) == 1
for i = 8, #ARGV do
  local c = words(ARGV[i])
  local key, bucket = KEYS[3 + i - 7], c[1]
  local delta = tonumber(c[3])
  if held then delta = delta - tonumber(c[2]) end
  if delta ~= 0 then
    if bucket == '-' then
      redis.call('INCRBY', key, delta)
    else
      redis.call('HINCRBY', key, bucket, delta)
    end
    redis.call('PEXPIREAT', key, c[4])
  end
end
local reserved, actual = words(ARGV[5]), words(ARGV[6])
local requests = tonumber(ARGV[7])
if held then requests = requests - 1 end
local names = {'input_tokens', 'output_tokens', 'cached_tokens', 'cost_micro_usd'}
for p in string.gmatch(ARGV[4], '[^\\n]+') do
  if requests ~= 0 then redis.call('HINCRBY', KEYS[3], p .. 'requests', requests) end
  for k, name in ipairs(names) do
    local delta = tonumber(actual[k])
    if held then delta = delta - tonumber(reserved[k]) end
    if delta ~= 0 then redis.call('HINCRBY', KEYS[3], p .. name, delta) end
  end
end
redis.call('PEXPIREAT', KEYS[3], day_exp)
redis.call('SET', KEYS[2], '1', 'EX', done_ttl)
if held then return 1 end
return 2
"""

COUNTERS = """
-- KEYS: counters; ARGV: per counter, min_bucket or "" (fixed). Values in order.
local out = {}
for i = 1, #KEYS do
  local min_bucket = ARGV[i]
  if min_bucket == '' then
    out[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  else
    local v = 0
    local flat = redis.call('HGETALL', KEYS[i])
    for j = 1, #flat, 2 do
      if tonumber(flat[j]) >= tonumber(min_bucket) then v = v + tonumber(flat[j + 1]) end
    end
    out[i] = v
  end
end
return out
"""
