"""The budget ledger's Lua: one script reserves all of a request's limits, one settles them.

Every key of both scripts is in the budget slot (``{<prefix>.budget}``, see ``redis_ledger``), so each runs whole on
one Redis Cluster node. Fixed-window counters are STRINGs (INCRBY); rolling ones are HASHes of bucket -> amount.

RESERVE  KEYS: leases, done:<rid>, day:<date>, counters...
         ARGV: rid, now_ms, lease_expires_ms, done_ttl_s, day_expire_ms, key_prefix, reap_batch, n,
               n x (bucket or "", cap, amount, expire_ms, min_bucket or "", bucket_ms or "", resets_ms),
               m, m x (row field, value at estimate), r, r x (rejection row field)
         -> {0} admitted, {2} already reserved, {1, i, used, resets_ms} refused by counter i (1-based)
SETTLE   KEYS: leases, done:<rid>, day:<date>, counters...
         ARGV: rid, done_ttl_s, day_expire_ms, n, n x (bucket or "", reserved, actual, expire_ms),
               m, m x (row field, reserved, actual)
         -> 1 settled (delta applied), 2 added in full (the store never saw the reservation), 0 already settled
"""

from __future__ import annotations

RESERVE = """
local rid, now = ARGV[1], tonumber(ARGV[2])
local done_ttl, day_exp, prefix, batch = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
-- reservations whose gateway never settled them: settled at their estimate (already counted), once
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
for _, old in ipairs(expired) do
  redis.call('SET', prefix .. 'done:' .. old, '1', 'EX', done_ttl)
  redis.call('ZREM', KEYS[1], old)
end
if redis.call('ZSCORE', KEYS[1], rid) or redis.call('EXISTS', KEYS[2]) == 1 then
  return {2}
end
local n = tonumber(ARGV[8])
local base = 8
local used = {}
for i = 1, n do
  local a = base + (i - 1) * 7
  local key, bucket, cap, amount = KEYS[3 + i], ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local value = 0
  local oldest = nil
  if bucket == '' then
    value = tonumber(redis.call('GET', key) or '0')
  else
    local min_bucket = tonumber(ARGV[a + 5])
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
    local resets = tonumber(ARGV[a + 7])
    if bucket ~= '' then
      local min_bucket, bucket_ms = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
      local from = oldest or min_bucket
      resets = (from + tonumber(bucket) - min_bucket + 1) * bucket_ms
    end
    local m = tonumber(ARGV[base + n * 7 + 1])
    local r_at = base + n * 7 + 1 + m * 2 + 1
    for j = 1, tonumber(ARGV[r_at]) do
      redis.call('HINCRBY', KEYS[3], ARGV[r_at + j], 1)
    end
    redis.call('PEXPIREAT', KEYS[3], day_exp)
    return {1, i, value, resets}
  end
end
for i = 1, n do
  local a = base + (i - 1) * 7
  local key, bucket, amount, expire = KEYS[3 + i], ARGV[a + 1], ARGV[a + 3], ARGV[a + 4]
  if bucket == '' then
    redis.call('INCRBY', key, amount)
  else
    redis.call('HINCRBY', key, bucket, amount)
  end
  redis.call('PEXPIREAT', key, expire)
end
local m_at = base + n * 7 + 1
for j = 1, tonumber(ARGV[m_at]) do
  redis.call('HINCRBY', KEYS[3], ARGV[m_at + 2 * j - 1], ARGV[m_at + 2 * j])
end
redis.call('PEXPIREAT', KEYS[3], day_exp)
redis.call('ZADD', KEYS[1], ARGV[3], rid)
return {0}
"""

SETTLE = """
local rid, done_ttl, day_exp = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local held = redis.call('ZREM', KEYS[1], rid) == 1
local n = tonumber(ARGV[4])
for i = 1, n do
  local a = 4 + (i - 1) * 4
  local key, bucket = KEYS[3 + i], ARGV[a + 1]
  local delta = tonumber(ARGV[a + 3])
  if held then delta = delta - tonumber(ARGV[a + 2]) end
  if delta ~= 0 then
    if bucket == '' then
      redis.call('INCRBY', key, delta)
    else
      redis.call('HINCRBY', key, bucket, delta)
    end
    redis.call('PEXPIREAT', key, ARGV[a + 4])
  end
end
local m_at = 4 + n * 4 + 1
for j = 1, tonumber(ARGV[m_at]) do
  local f = m_at + (j - 1) * 3
  local delta = tonumber(ARGV[f + 3])
  if held then delta = delta - tonumber(ARGV[f + 2]) end
  if delta ~= 0 then redis.call('HINCRBY', KEYS[3], ARGV[f + 1], delta) end
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
