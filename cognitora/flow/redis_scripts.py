"""The Lua scripts of ``RedisLeases``: every key they touch is in the flow slot (``cognitora.flow.redis_keys``), so
each runs whole on one Redis Cluster node and is atomic. Time is the server's (``TIME``): replicas with skewed
clocks agree on which heartbeat has expired.

Keys built inside a script (the leases and held hashes of a dead replica) share the slot's hash tag, as in
``kvstate.redis_scripts``. Counters travel as strings: Lua truncates numbers in replies.
"""

from __future__ import annotations

from kvstate.redis_scripts import PRELUDE

__all__ = ["ACQUIRE", "CHARGE", "HEARTBEAT", "HELD", "LEAVE", "MARGINS", "QUEUED", "RELEASE"]

_REPLICAS = """
-- Release every lease of the replicas whose heartbeat expired, and forget them (their queue depths too).
local function reap(replicas, depth, leases_base, held_base, now)
  local all = rcall('HGETALL', replicas)
  local dead = {}
  for j = 1, #all, 2 do
    if tonumber(all[j + 1]) <= now then dead[#dead + 1] = all[j] end
  end
  if #dead == 0 then return 0 end
  local fields = rcall('HKEYS', depth)
  for _, r in ipairs(dead) do
    local held = held_base .. r
    local owned = rcall('HGETALL', held)
    for j = 1, #owned, 2 do rcall('ZREM', leases_base .. owned[j + 1], r .. ' ' .. owned[j]) end
    rcall('DEL', held)
    rcall('HDEL', replicas, r)
    local mine = r .. ' '
    for _, f in ipairs(fields) do
      if ssub(f, 1, #mine) == mine then rcall('HDEL', depth, f) end
    end
  end
  return #dead
end
-- The replica is alive until now + ttl. The hash lives as long as a lease may (``keep_ms``): a dead replica's
-- entry must outlive its leases, or nobody would release them.
local function beat(replicas, replica, now, ttl, keep_ms)
  rcall('HSET', replicas, replica, sformat('%.0f', now + ttl))
  rcall('PEXPIRE', replicas, keep_ms)
end
local function alive(replicas, now)
  local all = rcall('HGETALL', replicas)
  local live = {}
  for j = 1, #all, 2 do
    if tonumber(all[j + 1]) > now then live[all[j]] = true end
  end
  return live
end
-- Add ``cost`` to ``flow``'s served counter; return it and the counters of ``argv[from..]`` (strings).
local function charge(key, flow, cost, keep_ms, argv, from)
  local out = {rcall('HINCRBYFLOAT', key, flow, cost)}
  rcall('PEXPIRE', key, keep_ms)
  if #argv >= from then
    local vals = rcall('HMGET', key, unpack(argv, from))
    for j = 1, #vals do out[#out + 1] = vals[j] or '0' end
  end
  return out
end
"""

ACQUIRE = (
    PRELUDE
    + _REPLICAS
    + """
-- KEYS: replicas hash, the endpoint's leases zset, this replica's held hash, depth hash[, the band's served hash]
-- ARGV: replica, lease id, capacity, max lease ms, replica ttl ms, endpoint, leases base, held base
--       [, flow, cost, keep ms, peer flows...]
-- Returns {granted 0/1, leases on the endpoint after the call, served} where served is {} or, when granted with a
-- served hash, {flow's counter, each peer's counter} as strings. Idempotent: a lease already held is granted.
local now = now_ms()
local max_ms, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
reap(KEYS[1], KEYS[4], ARGV[7], ARGV[8], now)
beat(KEYS[1], ARGV[1], now, ttl, max_ms)
rcall('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local member = ARGV[1] .. ' ' .. ARGV[2]
local n = rcall('ZCARD', KEYS[2])
local granted = 0
if rcall('ZSCORE', KEYS[2], member) then
  granted = 1
elseif n < tonumber(ARGV[3]) then
  rcall('ZADD', KEYS[2], sformat('%.0f', now + max_ms), member)
  rcall('HSET', KEYS[3], ARGV[2], ARGV[6])
  rcall('PEXPIRE', KEYS[2], max_ms)
  rcall('PEXPIRE', KEYS[3], max_ms)
  n = n + 1
  granted = 1
end
local served = {}
if granted == 1 and #KEYS >= 5 then served = charge(KEYS[5], ARGV[9], ARGV[10], tonumber(ARGV[11]), ARGV, 12) end
return {granted, n, served}
"""
)

CHARGE = (
    PRELUDE
    + _REPLICAS
    + """
-- KEYS: the band's served hash. ARGV: flow, cost, keep ms, peer flows... Returns as ACQUIRE's served.
return charge(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV, 4)
"""
)

RELEASE = """
-- KEYS: the endpoint's leases zset, this replica's held hash. ARGV: replica, lease id. Idempotent.
local n = redis.call('ZREM', KEYS[1], ARGV[1] .. ' ' .. ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[2])
return n
"""

HEARTBEAT = (
    PRELUDE
    + _REPLICAS
    + """
-- KEYS: replicas hash, depth hash, margin hash. ARGV: replica, ttl ms, keep ms, leases base, held base, margin
-- ("<factor> <samples>", or '' when it has none yet), then band, waiting...
-- Renews the replica, releases dead replicas' leases, and publishes this replica's queue depth per band and its
-- prediction margin. A margin whose replica is no longer in the replicas hash (reaped, here or by an acquire) is
-- dropped; one whose replica's heartbeat expired but was not reaped yet is skipped by MARGINS.
local now = now_ms()
local keep = tonumber(ARGV[3])
reap(KEYS[1], KEYS[2], ARGV[4], ARGV[5], now)
beat(KEYS[1], ARGV[1], now, tonumber(ARGV[2]), keep)
for i = 7, #ARGV, 2 do
  local field = ARGV[1] .. ' ' .. ARGV[i]
  if tonumber(ARGV[i + 1]) > 0 then rcall('HSET', KEYS[2], field, ARGV[i + 1]) else rcall('HDEL', KEYS[2], field) end
end
if rcall('EXISTS', KEYS[2]) == 1 then rcall('PEXPIRE', KEYS[2], keep) end
if ARGV[6] ~= '' then rcall('HSET', KEYS[3], ARGV[1], ARGV[6]) end
for _, r in ipairs(rcall('HKEYS', KEYS[3])) do
  if rcall('HEXISTS', KEYS[1], r) == 0 then rcall('HDEL', KEYS[3], r) end
end
if rcall('EXISTS', KEYS[3]) == 1 then rcall('PEXPIRE', KEYS[3], keep) end
return 1
"""
)

LEAVE = (
    PRELUDE
    + _REPLICAS
    + """
-- KEYS: replicas hash, depth hash, margin hash. ARGV: replica, leases base, held base. A clean shutdown: the
-- replica's leases are released now rather than when its heartbeat would have expired, its margin dropped.
rcall('HDEL', KEYS[3], ARGV[1])
if rcall('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
rcall('HSET', KEYS[1], ARGV[1], '0')
return reap(KEYS[1], KEYS[2], ARGV[2], ARGV[3], now_ms())
"""
)

HELD = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + _REPLICAS
    + """
-- KEYS: replicas hash, then leases zsets. Returns the live leases of each: unexpired, of a live replica (a dead
-- replica's leases no longer count, even before a write releases them).
local now = now_ms()
local live = alive(KEYS[1], now)
local out = {}
for i = 2, #KEYS do
  local n = 0
  for _, m in ipairs(rcall('ZRANGEBYSCORE', KEYS[i], sformat('(%.0f', now), '+inf')) do
    if live[string.match(m, '^(%S+) ')] then n = n + 1 end
  end
  out[#out + 1] = n
end
return out
"""
)

QUEUED = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + _REPLICAS
    + """
-- KEYS: replicas hash, depth hash. Returns a flat list band, waiting (summed over live replicas).
local live = alive(KEYS[1], now_ms())
local sums, order = {}, {}
local all = rcall('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local replica, band = string.match(all[j], '^(%S+) (.*)$')
  if replica and live[replica] then
    if not sums[band] then sums[band] = 0; order[#order + 1] = band end
    sums[band] = sums[band] + tonumber(all[j + 1])
  end
end
local out = {}
for _, band in ipairs(order) do out[#out + 1] = band; out[#out + 1] = sums[band] end
return out
"""
)

MARGINS = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + _REPLICAS
    + """
-- KEYS: replicas hash, margin hash. Returns a flat list replica, "<factor> <samples>" of the live replicas.
local live = alive(KEYS[1], now_ms())
local out = {}
local all = rcall('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  if live[all[j]] then out[#out + 1] = all[j]; out[#out + 1] = all[j + 1] end
end
return out
"""
)
