"""The Lua scripts of ``RedisStore``'s fleet slot: in-flight work, snapshots, health marks and heartbeats.

Every key these scripts touch is in the fleet slot (``kvstate.redis_keys``: hash tag the prefix), so each runs on
one Redis Cluster node, and each multi-key update is atomic. Time is the server's (``TIME``), so gateways with
skewed clocks agree on what has expired. The block index's scripts are in ``kvstate.redis_scripts``.
"""

from __future__ import annotations

from kvstate.redis_scripts import PRELUDE

__all__ = [
    "FLEET_STATE",
    "HEALTH_READ",
    "HEARTBEATS_READ",
    "INFLIGHT_ADD",
    "INFLIGHT_PREFILL_DONE",
    "INFLIGHT_READ",
    "INFLIGHT_RELEASE",
    "MARK_UNHEALTHY",
    "PUT_HEARTBEAT",
    "PUT_SNAPSHOT",
]

_INFLIGHT_SWEEP = (
    PRELUDE
    + """
local function sweep(z, h, now)
  local expired = rcall('ZRANGEBYSCORE', z, '-inf', now)
  for j = 1, #expired, 1000 do
    rcall('HDEL', h, unpack(expired, j, math.min(j + 999, #expired)))
  end
  if #expired > 0 then rcall('ZREMRANGEBYSCORE', z, '-inf', now) end
end
"""
)

INFLIGHT_ADD = (
    _INFLIGHT_SWEEP
    + """
-- KEYS: inflight zset, inflight tokens hash. ARGV: request id, prefill tokens, decode tokens, ttl ms.
local now = now_ms()
sweep(KEYS[1], KEYS[2], now)
local ttl = tonumber(ARGV[4])
rcall('ZADD', KEYS[1], sformat('%.0f', now + ttl), ARGV[1])
rcall('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
-- the keys outlive their longest-lived member, so an abandoned endpoint leaves nothing behind
if rcall('PTTL', KEYS[1]) < ttl then
  rcall('PEXPIRE', KEYS[1], ttl)
  rcall('PEXPIRE', KEYS[2], ttl)
end
return 1
"""
)

INFLIGHT_PREFILL_DONE = """
-- KEYS: inflight zset, inflight tokens hash. ARGV: request id.
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
local decode = string.match(v, ' (%d+)$') or '0'
redis.call('HSET', KEYS[2], ARGV[1], '0 ' .. decode)
return 1
"""

INFLIGHT_RELEASE = """
-- KEYS: inflight zset, inflight tokens hash. ARGV: request id. Both together, or a reader could count a request
-- whose tokens are gone (or the reverse). Idempotent.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""

INFLIGHT_READ = (
    _INFLIGHT_SWEEP
    + """
-- KEYS: inflight zset, inflight tokens hash. Returns {requests, prefill tokens, decode tokens}; drops expired ones.
sweep(KEYS[1], KEYS[2], now_ms())
local vals = rcall('HVALS', KEYS[2])
local p, d = 0, 0
for _, v in ipairs(vals) do
  local a, b = string.match(v, '^(%d+) (%d+)$')
  p = p + (tonumber(a) or 0); d = d + (tonumber(b) or 0)
end
return {#vals, p, d}
"""
)

PUT_SNAPSHOT = """
-- KEYS: snapshot hash, snapshot endpoints set, snapshot version. ARGV: endpoint, new version token, field, value...
-- The hash is replaced whole (a field the new snapshot lacks must not survive from an older one), and the version
-- token is replaced with it, atomically: a reader that sees the new token sees the new snapshot. The token gets the
-- server's time appended, so a run replayed by a client retry (after a dropped connection) still makes a new version:
-- a reader that cached the newer snapshot under the same caller token would otherwise keep serving it as current.
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('SADD', KEYS[2], ARGV[1])
local t = redis.call('TIME')
redis.call('SET', KEYS[3], ARGV[2] .. ':' .. t[1] .. '.' .. t[2])
return 1
"""

_HEALTH_FN = """
-- A health mark is a field of one hash: endpoint -> '<expiry ms> <since ms> <reason>' (server clock). Expired
-- fields are skipped by readers and swept by the next mark.
local function live_mark(v, now)
  if not v then return nil end
  local expiry, since, reason = string.match(v, '^(%d+) (%d+) (.*)$')
  if expiry and tonumber(expiry) > now then return {since, reason} end
  return nil
end
-- the live marks of ``endpoints`` (names), as a flat list endpoint, since ms, reason
local function marks_of(health, endpoints, now)
  local out = {}
  if #endpoints == 0 then return out end
  local vals = rcall('HMGET', health, unpack(endpoints))
  for j = 1, #endpoints do
    local mark = live_mark(vals[j], now)
    if mark then out[#out + 1] = endpoints[j]; out[#out + 1] = mark[1]; out[#out + 1] = mark[2] end
  end
  return out
end
"""

MARK_UNHEALTHY = (
    PRELUDE
    + _HEALTH_FN
    + """
-- KEYS: health hash. ARGV: endpoint, ttl ms, reason. The hash lives as long as its longest-lived mark.
local now = now_ms()
local ttl = tonumber(ARGV[2])
local all = rcall('HGETALL', KEYS[1])
local longest = ttl
for j = 1, #all, 2 do
  local v = all[j + 1]
  if live_mark(v, now) then
    local left = tonumber(string.match(v, '^(%d+)')) - now
    if left > longest then longest = left end
  else
    rcall('HDEL', KEYS[1], all[j])
  end
end
rcall('HSET', KEYS[1], ARGV[1], sformat('%.0f %.0f ', now + ttl, now) .. ARGV[3])
rcall('PEXPIRE', KEYS[1], longest)
return 1
"""
)

HEALTH_READ = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + _HEALTH_FN
    + """
-- KEYS: health hash. ARGV: endpoints (none: every endpoint). Returns a flat list endpoint, since ms, reason.
local now = now_ms()
if #ARGV > 0 then return marks_of(KEYS[1], ARGV, now) end
local out = {}
local all = rcall('HGETALL', KEYS[1])
for j = 1, #all, 2 do
  local mark = live_mark(all[j + 1], now)
  if mark then out[#out + 1] = all[j]; out[#out + 1] = mark[1]; out[#out + 1] = mark[2] end
end
return out
"""
)

_HEARTBEAT_FN = """
-- A heartbeat is a field of one hash: writer name -> '<expiry ms> <at ms>' (server clock). Readers skip expired
-- fields; the next beat sweeps them.
local function beats_of(hash, now)
  local out = {}
  local all = rcall('HGETALL', hash)
  for j = 1, #all, 2 do
    local expiry, at = string.match(all[j + 1], '^(%d+) (%d+)$')
    if expiry and tonumber(expiry) > now then
      out[#out + 1] = all[j]; out[#out + 1] = at; out[#out + 1] = sformat('%.0f', math.max(0, now - tonumber(at)))
    end
  end
  return out
end
"""

PUT_HEARTBEAT = (
    PRELUDE
    + """
-- KEYS: heartbeats hash. ARGV: name, ttl ms. The hash lives as long as its longest-lived beat.
local now = now_ms()
local ttl = tonumber(ARGV[2])
local all = rcall('HGETALL', KEYS[1])
local longest = ttl
for j = 1, #all, 2 do
  local expiry = tonumber(string.match(all[j + 1], '^(%d+) ') or '0')
  if expiry > now then
    if expiry - now > longest then longest = expiry - now end
  else
    rcall('HDEL', KEYS[1], all[j])
  end
end
rcall('HSET', KEYS[1], ARGV[1], sformat('%.0f %.0f', now + ttl, now))
rcall('PEXPIRE', KEYS[1], longest)
return 1
"""
)

HEARTBEATS_READ = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + _HEARTBEAT_FN
    + """
-- KEYS: heartbeats hash. Returns a flat list name, at ms, age ms (server clock).
return beats_of(KEYS[1], now_ms())
"""
)

FLEET_STATE = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + _HEALTH_FN
    + _HEARTBEAT_FN
    + """
-- The fleet slot's part of what one placement reads (``RedisStore.fleet_view``; the prefix match is ``MATCH``, in
-- the model's slot, in the same pipeline): each endpoint's in-flight totals, the live health marks and, unless the
-- caller already holds the current ones, the endpoints' snapshots; and the collectors' heartbeats.
-- KEYS: snapshot version, health hash, heartbeats hash, then per endpoint (in ARGV order): in-flight zset,
--       in-flight tokens hash, snapshot hash.
-- ARGV: the snapshot version the caller holds ('' for none), endpoints...
-- Returns {in-flight {requests, prefill, decode} per endpoint flattened, snapshot version, HGETALL per endpoint or
--          0 when the caller's version is current, marks (as HEALTH_READ), heartbeats (as HEARTBEATS_READ)}.
-- Read-only: expired in-flight members are skipped here and swept by the next INFLIGHT_ADD on their endpoint.
local endpoints = {}
for i = 2, #ARGV do endpoints[#endpoints + 1] = ARGV[i] end
local now = now_ms()
local live_after = sformat('(%.0f', now)
local inflight = {}
for i = 1, #endpoints do
  local zset, tokens = KEYS[3 * i + 1], KEYS[3 * i + 2]
  local requests, p, d = 0, 0, 0
  local live = rcall('ZRANGEBYSCORE', zset, live_after, '+inf')
  for j = 1, #live, 1000 do
    local vals = rcall('HMGET', tokens, unpack(live, j, math.min(j + 999, #live)))
    for k = 1, #vals do
      local v = vals[k]
      if v then
        local a, b = string.match(v, '^(%d+) (%d+)$')
        requests = requests + 1
        p = p + (tonumber(a) or 0); d = d + (tonumber(b) or 0)
      end
    end
  end
  inflight[#inflight + 1] = requests
  inflight[#inflight + 1] = p
  inflight[#inflight + 1] = d
end
local version = rcall('GET', KEYS[1]) or ''
local snapshots = 0
if version == '' or version ~= ARGV[1] then
  snapshots = {}
  for i = 1, #endpoints do snapshots[i] = rcall('HGETALL', KEYS[3 * i + 3]) end
end
-- ends in ``return {...}``: bench/router_bench.py swaps that line for its server-clock timing
return {inflight, version, snapshots, marks_of(KEYS[2], endpoints, now), beats_of(KEYS[3], now)}
"""
)
