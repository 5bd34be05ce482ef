"""The budget ledger's Lua: one script reserves a batch of requests (each against all of its limits), one settles
a batch.

A batch is what ``cognitora.budgets.batcher`` gathered while the previous call was out: the reservations run one
after another inside the script, in arrival order, each all-or-nothing against every one of its limits, so a batch
of 200 counts exactly as 200 separate calls would, for one round trip and one script call.

Every key of both scripts is in the budget slot (``{<prefix>.budget}``, see ``redis_ledger``), so each runs whole on
one Redis Cluster node. Fixed-window counters are STRINGs (INCRBY); rolling ones are HASHes of bucket -> amount.

Few, packed arguments (a counter is one space-separated string, ``-`` for none; the report rows are their field
prefixes, one per line): redis-py's encoding of each argument is most of a call's client-side CPU.

RESERVE  KEYS: leases, then per reservation: done:<rid>, day:<date>, counters...
         ARGV: now_ms, done_ttl_s, key base, reap_batch, then per reservation: rid, "lease_expires_ms
               day_expire_ms n_counters", row prefixes, estimate "in out cached cost", then per counter "bucket cap
               amount expire_ms min_bucket bucket_ms resets_ms"
         -> per reservation: {0} admitted, {2} already reserved, {1, i, used, resets_ms} refused by counter i
SETTLE   KEYS: leases, then per settle: done:<rid>, day:<date>, counters...
         ARGV: done_ttl_s, then per settle: rid, "day_expire_ms requests n_counters", row prefixes, reserved "in out
               cached cost", actual "in out cached cost", then per counter "bucket reserved actual expire_ms"
               (requests: 1 served, 0 given back)
         -> per settle: 1 settled (delta applied), 2 added in full (the store never saw the reservation), 0 already
"""

from __future__ import annotations

__all__ = ["COUNTERS", "RESERVE", "SETTLE"]

_WORDS = """
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
local names = {'input_tokens', 'output_tokens', 'cached_tokens', 'cost_micro_usd'}
-- add amount to a counter: a fixed window's STRING, or a rolling window's bucket (bucket ~= '-') in its HASH
local function add(key, bucket, amount, expire_ms)
  if bucket == '-' then
    redis.call('INCRBY', key, amount)
  else
    redis.call('HINCRBY', key, bucket, amount)
  end
  redis.call('PEXPIREAT', key, expire_ms)
end
"""

RESERVE = (
    _WORDS
    + """
local now, done_ttl, base, batch = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
-- reservations whose gateway never settled them: settled at their estimate (already counted), once
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
for _, old in ipairs(expired) do
  redis.call('SET', base .. 'done:' .. old, '1', 'EX', done_ttl)
  redis.call('ZREM', KEYS[1], old)
end

local function reserve(a, k)
  local rid = ARGV[a]
  local head = words(ARGV[a + 1])
  local lease, day_exp, n = head[1], tonumber(head[2]), tonumber(head[3])
  local done_key, day_key = KEYS[k], KEYS[k + 1]
  if redis.call('ZSCORE', KEYS[1], rid) or redis.call('EXISTS', done_key) == 1 then
    return {2}
  end
  local prefixes = rows(ARGV[a + 2])
  local counters = {}
  for i = 1, n do counters[i] = words(ARGV[a + 3 + i]) end
  for i, c in ipairs(counters) do
    local key, bucket, cap, amount = KEYS[k + 1 + i], c[1], tonumber(c[2]), tonumber(c[3])
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
      for _, p in ipairs(prefixes) do redis.call('HINCRBY', day_key, p .. 'rejections', 1) end
      redis.call('PEXPIREAT', day_key, day_exp)
      return {1, i, value, resets}
    end
  end
  for i, c in ipairs(counters) do add(KEYS[k + 1 + i], c[1], c[3], c[4]) end
  local est = words(ARGV[a + 3])
  for _, p in ipairs(prefixes) do
    redis.call('HINCRBY', day_key, p .. 'requests', 1)
    for j, name in ipairs(names) do
      if tonumber(est[j]) ~= 0 then redis.call('HINCRBY', day_key, p .. name, est[j]) end
    end
  end
  redis.call('PEXPIREAT', day_key, day_exp)
  redis.call('ZADD', KEYS[1], lease, rid)
  return {0}
end

local out = {}
local a, k = 5, 2
while a <= #ARGV do
  local n = tonumber(words(ARGV[a + 1])[3])
  out[#out + 1] = reserve(a, k)
  a = a + 4 + n
  k = k + 2 + n
end
return out
"""
)

SETTLE = (
    _WORDS
    + """
local done_ttl = tonumber(ARGV[1])

local function settle(a, k)
  local rid = ARGV[a]
  local head = words(ARGV[a + 1])
  local day_exp, requests, n = tonumber(head[1]), tonumber(head[2]), tonumber(head[3])
  local done_key, day_key = KEYS[k], KEYS[k + 1]
  if redis.call('EXISTS', done_key) == 1 then
    return 0
  end
  local held = redis.call('ZREM', KEYS[1], rid) == 1
  for i = 1, n do
    local c = words(ARGV[a + 4 + i])
    local delta = tonumber(c[3])
    if held then delta = delta - tonumber(c[2]) end
    if delta ~= 0 then add(KEYS[k + 1 + i], c[1], delta, c[4]) end
  end
  local reserved, actual = words(ARGV[a + 3]), words(ARGV[a + 4])
  if held then requests = requests - 1 end
  for _, p in ipairs(rows(ARGV[a + 2])) do
    if requests ~= 0 then redis.call('HINCRBY', day_key, p .. 'requests', requests) end
    for j, name in ipairs(names) do
      local delta = tonumber(actual[j])
      if held then delta = delta - tonumber(reserved[j]) end
      if delta ~= 0 then redis.call('HINCRBY', day_key, p .. name, delta) end
    end
  end
  redis.call('PEXPIREAT', day_key, day_exp)
  redis.call('SET', done_key, '1', 'EX', done_ttl)
  if held then return 1 end
  return 2
end

local out = {}
local a, k = 2, 2
while a <= #ARGV do
  local n = tonumber(words(ARGV[a + 1])[3])
  out[#out + 1] = settle(a, k)
  a = a + 5 + n
  k = k + 2 + n
end
return out
"""
)

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
