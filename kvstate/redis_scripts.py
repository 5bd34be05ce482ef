"""The Lua scripts of ``RedisStore``'s block index: every multi-key update is one script, hence atomic.

Each script touches the keys of one model's slot only (``kvstate.redis_keys``), declared or not: block strings are
reached from the block base, never declared one by one, and share the model's hash tag, so every script here runs
on one Redis Cluster node. The fleet slot's scripts (in-flight work, snapshots, health marks) are in
``kvstate.redis_fleet_scripts``.

Block strings (``kvstate.redis_keys``): byte ``id`` of ``{p}:{m}:b:<hex>`` describes endpoint ``id``; its low nibble,
read with ``BITFIELD GET u4 <id*8+4>``, is ``spec*8 + disk*4 + cpu*2 + gpu*1``. ``SETBIT`` addresses bits from the
most significant end, so tier ``t`` of endpoint ``id`` is bit ``id*8 + 7 - t`` and the speculative flag ``id*8 + 4``.

Invariants the scripts keep: an endpoint's tier bits are set on a block iff the block is a member of the endpoint's
block ZSET; its speculative bit is set iff the block is a member of its speculative ZSET; a block string with no bit
set is deleted. So purging an endpoint walks its two ZSETs and nothing else, and afterwards its id is free.

Chains arrive as one argument of 16-hex-digit keys (``redis_keys.BLOCK_HEX_DIGITS``), sliced here: shorter to send
than one argument per key. Time is the server's (``TIME``), so gateways with skewed clocks agree on expiry. Lua
numbers format with 14 significant digits, so scores and expiries are formatted with ``%.0f`` before use.
"""

from __future__ import annotations

__all__ = ["ADD", "ADD_SPECULATIVE", "CLEAR_CHUNK", "MATCH", "PRELUDE", "REMOVE"]

PRELUDE = """
-- Redis 7 guards the globals table, so every global lookup is slow: the hot loops use these locals instead.
local rcall, ssub, sbyte, sformat = redis.call, string.sub, string.byte, string.format
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function hex_at(blob, i) return ssub(blob, 16 * i - 15, 16 * i) end
-- the low nibble of endpoint ``id``'s byte: spec*8 + disk*4 + cpu*2 + gpu
local function nibble(k, id) return rcall('BITFIELD', k, 'GET', 'u4', id * 8 + 4)[1] end
local function delete_if_empty(k) if rcall('BITCOUNT', k) == 0 then rcall('DEL', k) end end
-- batched ZADD / ZREM: one call per 1000 members rather than one per member
local function flush(cmd, key, args) if #args > 0 then rcall(cmd, key, unpack(args)) end return {} end
"""

_ENDPOINT_ID = """
-- KEYS[3..5]: ids hash, names hash, free ids zset
local function endpoint_id(ep)
  local id = rcall('HGET', KEYS[3], ep)
  if id then return tonumber(id) end
  local free = rcall('ZPOPMIN', KEYS[5])
  if #free > 0 then id = tonumber(free[1]) else id = rcall('HLEN', KEYS[3]) end
  rcall('HSET', KEYS[3], ep, id)
  rcall('HSET', KEYS[4], id, ep)
  return id
end
"""

_MATCH_FN = """
-- The longest held prefix of ``blob`` (a hex chain) per endpoint: a flat list endpoint, matched blocks, weighted
-- blocks (as a string: Lua replies truncate numbers), blocks held only in CPU memory, blocks held only on
-- disk. ``wanted``: endpoint names to score, or nil for every holder
-- of the first block (``first_key``). ``mw``: weights of nibbles 1..7; ``sw``: weight of a live speculative entry.
--
-- ``cp_at`` > 0 also takes a checkpoint after that many blocks: the second value returned is {proof, held, until},
-- where ``held`` is the flat list endpoint, weighted, CPU-only, disk-only of the endpoints holding all ``cp_at``
-- blocks, ``proof`` the flat list block number, block string of the blocks where any holder's change would show (the
-- first block, the checkpoint's, and each shorter holder's last block and the one after it), and ``until`` the
-- earliest expiry (ms) of a live speculative entry it counted (0: none); nil when the prefix holds an expired
-- speculative entry. ``resume``: {proof, held, until} of such a checkpoint taken on a chain that began with the same
-- ``cp_at`` blocks: if it has not expired and every block of its proof reads the same, the walk starts after
-- ``cp_at`` from ``held`` (third value true) and the endpoints that ended before it are the caller's to add.
local function match(first_key, ids_key, names_key, base, blob, sbase, mw, sw, wanted, cp_at, resume)
  local n = #blob / 16
  if n == 0 then return {} end
  local function block_key(i) return base .. ssub(blob, 16 * i - 15, 16 * i) end
  -- the block strings a change of holders would show in: the first block, the checkpoint's, and where each holder
  -- that stops short of it (``lengths``) stops
  local function proof_of(lengths)
    local seen, where = {}, {1, cp_at}
    for _, len in pairs(lengths) do
      if len < cp_at then where[#where + 1] = math.max(1, len); where[#where + 1] = len + 1 end
    end
    local blocks, pkeys = {}, {}
    for _, i in ipairs(where) do
      if not seen[i] then seen[i] = true; blocks[#blocks + 1] = i; pkeys[#pkeys + 1] = block_key(i) end
    end
    local strings = rcall('MGET', unpack(pkeys))
    local flat = {}
    for j = 1, #blocks do flat[#flat + 1] = blocks[j]; flat[#flat + 1] = strings[j] or '' end
    return flat
  end
  -- nobody to match: a checkpoint all the same (no holders), so the next prompt only reads the proof
  local function nobody()
    if cp_at > 0 and cp_at <= n then return {}, {proof_of({}), {}, 0}, false end
    return {}
  end
  local alive = {}
  local name, lengths, weighted, cpu, disk = {}, {}, {}, {}, {}
  local start, resumed = 1, false
  if resume then
    local proof, held = resume[1], resume[2]
    local pkeys = {}
    for j = 1, #proof, 2 do pkeys[#pkeys + 1] = block_key(tonumber(proof[j])) end
    local now_strings = rcall('MGET', unpack(pkeys))
    resumed = resume[3] == 0 or now_ms() < resume[3]  -- a speculative entry it counted has not expired
    for j = 1, #pkeys do
      if not resumed then break end
      if (now_strings[j] or '') ~= proof[2 * j] then resumed = false end
    end
    if resumed then
      start = cp_at + 1
      if #held > 0 then
        local held_names = {}
        for j = 1, #held, 4 do held_names[#held_names + 1] = held[j] end
        local ids = rcall('HMGET', ids_key, unpack(held_names))
        for j = 1, #held_names do
          if ids[j] then
            local id = tonumber(ids[j])
            local at = 4 * j - 3
            name[id] = held[at]; lengths[id] = cp_at; weighted[id] = tonumber(held[at + 1])
            cpu[id] = tonumber(held[at + 2]); disk[id] = tonumber(held[at + 3])
            alive[#alive + 1] = id
          end
        end
      end
      if #alive == 0 or start > n then
        local out = {}
        for id, len in pairs(lengths) do
          out[#out + 1] = name[id]; out[#out + 1] = len; out[#out + 1] = tostring(weighted[id])
          out[#out + 1] = cpu[id]; out[#out + 1] = disk[id]
        end
        return out, nil, true
      end
    end
  end
  if not resumed then
    if wanted then
      if #wanted == 0 then return nobody() end
      local ids = rcall('HMGET', ids_key, unpack(wanted))
      for j = 1, #wanted do if ids[j] then alive[#alive + 1] = tonumber(ids[j]) end end
    else
      local s = rcall('GET', first_key)
      if s then
        for j = 1, #s do if sbyte(s, j) > 0 then alive[#alive + 1] = j - 1 end end
      end
    end
    if #alive == 0 then return nobody() end
    local names = rcall('HMGET', names_key, unpack(alive))
    local named = {}
    for j, id in ipairs(alive) do
      if names[j] then name[id] = names[j]; weighted[id] = 0; cpu[id] = 0; disk[id] = 0; named[#named + 1] = id end
    end
    alive = named
  end
  local now = nil
  -- Consecutive blocks usually have byte-identical strings (the same endpoints hold the whole run). Lua strings are
  -- interned, so ``s == prev`` is a pointer compare: such a block repeats the previous step's outcome and is only
  -- counted; the per-endpoint loop runs where the holders change (or a speculative entry needs its expiry checked).
  local prev, simple, run = nil, false, 0
  local step_weight, step_tier = {}, {}
  local count = #alive
  -- a speculative entry before the checkpoint: alive, it bounds how long the checkpoint holds (``spec_until``, the
  -- earliest expiry); expired, it ends a match where a renewal would not change the block string: no checkpoint
  local spec_dead, spec_until, reached = false, nil, false
  local checkpoint = nil
  local function flush_run()
    if run > 0 then
      for j = 1, count do
        local id = alive[j]
        lengths[id] = lengths[id] + run
        weighted[id] = weighted[id] + step_weight[id] * run
        local t = step_tier[id]
        if t == 1 then cpu[id] = cpu[id] + run elseif t == 2 then disk[id] = disk[id] + run end
      end
      run = 0
    end
  end
  if not resumed then
    for j = 1, count do lengths[alive[j]] = 0 end
  end
  -- Blocks are fetched 32 at a time with MGET: a third fewer calls' worth of time than one GET each, and at most
  -- 31 keys read past the end of the match.
  local batch, batch_start = {}, start
  for i = start, n do
    if i - batch_start >= #batch then
      batch_start = i
      local batch_keys = {}
      for j = i, math.min(n, i + 31) do batch_keys[#batch_keys + 1] = block_key(j) end
      batch = rcall('MGET', unpack(batch_keys))
    end
    local s = batch[i - batch_start + 1] or ''
    if simple and s == prev then
      run = run + 1
    else
      flush_run()
      prev, simple = s, true
      local kept = 0
      for j = 1, count do
        local id = alive[j]
        local v = (sbyte(s, id + 1) or 0) % 16
        local w, t = nil, 0
        if v % 8 > 0 then
          w = mw[v % 8]
          -- best tier: GPU (bit 1), else CPU (bit 2), else disk
          if v % 2 == 0 then if v % 4 >= 2 then t = 1 else t = 2 end end
        elseif v >= 8 then
          simple = false
          now = now or now_ms()
          local expiry = tonumber(rcall('ZSCORE', sbase .. name[id], hex_at(blob, i)) or 0)
          if expiry > now then
            w = sw
            if not reached then spec_until = math.min(spec_until or expiry, expiry) end
          elseif not reached then
            spec_dead = true
          end
        end
        if w then
          step_weight[id] = w
          step_tier[id] = t
          weighted[id] = weighted[id] + w
          if t == 1 then cpu[id] = cpu[id] + 1 elseif t == 2 then disk[id] = disk[id] + 1 end
          lengths[id] = i
          kept = kept + 1
          alive[kept] = id
        end
      end
      for j = kept + 1, count do alive[j] = nil end
      count = kept
      if count == 0 then break end
    end
    if i == cp_at then
      reached = true
      if not resumed and not spec_dead then
        flush_run()
        local held = {}
        for j = 1, count do
          local id = alive[j]
          -- %.17g: the weight reads back exactly, so a resumed match equals a whole walk
          held[#held + 1] = name[id]; held[#held + 1] = sformat('%.17g', weighted[id])
          held[#held + 1] = cpu[id]; held[#held + 1] = disk[id]
        end
        checkpoint = held
      end
    end
  end
  flush_run()
  local out = {}
  for id, len in pairs(lengths) do
    if len > 0 then
      out[#out + 1] = name[id]; out[#out + 1] = len; out[#out + 1] = tostring(weighted[id])
      out[#out + 1] = cpu[id]; out[#out + 1] = disk[id]
    end
  end
  if not resumed and not reached and not spec_dead and cp_at > 0 and cp_at <= n then
    checkpoint = {}  -- the walk stopped before the checkpoint: nobody holds all of it
  end
  if checkpoint then return out, {proof_of(lengths), checkpoint, spec_until or 0}, false end
  return out, nil, resumed
end
"""

MATCH = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + _MATCH_FN
    + """
-- KEYS: first block string (routes to the model's slot), ids hash, names hash.
-- ARGV: block base, hex chain, speculative zset base, weights of nibbles 1..7, speculative weight, checkpoint
-- (blocks; 0: none), the resumed checkpoint's expiry (server ms; 0: none), proof length P and held length H (0 0:
-- none), its P proof values and H held values, then the endpoints to score (none: every holder of the first block).
local mw = {}
for m = 1, 7 do mw[m] = tonumber(ARGV[3 + m]) end
local cp_at = tonumber(ARGV[12])
local np, nh = tonumber(ARGV[14]), tonumber(ARGV[15])
local resume = nil
if np > 0 then
  local proof, held = {}, {}
  for i = 16, 15 + np do proof[#proof + 1] = ARGV[i] end
  for i = 16 + np, 15 + np + nh do held[#held + 1] = ARGV[i] end
  resume = {proof, held, tonumber(ARGV[13])}
end
local wanted = nil
if #ARGV > 15 + np + nh then
  wanted = {}
  for i = 16 + np + nh, #ARGV do wanted[#wanted + 1] = ARGV[i] end
end
-- ends in ``return out``: bench/store_bench.py swaps that line for its server-clock timing
local out, checkpoint, resumed = match(
  KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], mw, tonumber(ARGV[11]), wanted, cp_at, resume
)
if cp_at > 0 then out = {out, checkpoint or {}, resumed and 1 or 0} end
return out
"""
)

ADD = (
    PRELUDE
    + _ENDPOINT_ID
    + """
-- KEYS: endpoint block zset, endpoint speculative zset, ids, names, free ids.
-- ARGV: block base, endpoint, tier (0 GPU, 1 CPU, 2 DISK), cap, hex chain.
local base, ep, tier, cap, blob = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local n = #blob / 16
local id = endpoint_id(ep)
local t = rcall('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local has_spec = rcall('EXISTS', KEYS[2]) == 1
local z, confirmed = {}, {}
for i = 1, n do
  local hex = hex_at(blob, i)
  local k = base .. hex
  rcall('SETBIT', k, id * 8 + 7 - tier, 1)
  if has_spec and rcall('SETBIT', k, id * 8 + 4, 0) == 1 then
    confirmed[#confirmed + 1] = hex
    if #confirmed >= 1000 then confirmed = flush('ZREM', KEYS[2], confirmed) end
  end
  -- the chain's head gets the newest score: the cap forgets tails first, as the engines do
  z[#z + 1] = sformat('%.0f', now_us + (n - i))
  z[#z + 1] = hex
  if #z >= 2000 then z = flush('ZADD', KEYS[1], z) end
end
flush('ZADD', KEYS[1], z)
flush('ZREM', KEYS[2], confirmed)
local over = rcall('ZCARD', KEYS[1]) - cap
while over > 0 do
  local popped = rcall('ZPOPMIN', KEYS[1], math.min(over, 1000))
  for j = 1, #popped, 2 do
    local k = base .. popped[j]
    if nibble(k, id) % 8 > 0 then
      rcall('BITFIELD', k, 'SET', 'u3', id * 8 + 5, 0)
      delete_if_empty(k)
    end
  end
  over = over - #popped / 2
end
return n
"""
)

ADD_SPECULATIVE = (
    PRELUDE
    + _ENDPOINT_ID
    + """
-- A request was routed to the endpoint: blocks it holds are used again (their age in the block zset is refreshed,
-- as its engine will refresh them, once the endpoint is past half its cap), the others are marked speculative
-- until ``ttl`` ms pass.
-- KEYS: endpoint speculative zset, endpoint block zset, ids, names, free ids.
-- ARGV: block base, endpoint, ttl ms, cap, hex chain.
local base, ep, ttl, cap, blob = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local n = #blob / 16
local id = endpoint_id(ep)
local t = rcall('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local function unmark(hex)
  local k = base .. hex
  if rcall('EXISTS', k) == 1 then
    rcall('SETBIT', k, id * 8 + 4, 0)
    delete_if_empty(k)
  end
end
-- sweep this endpoint's expired guesses first, so speculative memory is bounded by what is live
local expired = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for j = 1, #expired do unmark(expired[j]) end
if #expired > 0 then rcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
local expiry = sformat('%.0f', now + ttl)
-- Refreshing is the costly part (a zset move per block) and only orders what the cap will evict: skip it while the
-- endpoint holds less than half its cap, where nothing can be evicted soon.
local refresh = rcall('ZCARD', KEYS[2]) * 2 >= cap
local z, used = {}, {}
local batch, batch_start = {}, 1
for i = 1, n do
  local hex = ssub(blob, 16 * i - 15, 16 * i)
  local k = base .. hex
  if i - batch_start >= #batch then  -- read the block strings 32 at a time, as MATCH does
    batch_start = i
    local batch_keys = {}
    for j = i, math.min(n, i + 31) do batch_keys[#batch_keys + 1] = base .. ssub(blob, 16 * j - 15, 16 * j) end
    batch = rcall('MGET', unpack(batch_keys))
  end
  local s = batch[i - batch_start + 1] or ''
  if (sbyte(s, id + 1) or 0) % 8 > 0 then
    if refresh then
      used[#used + 1] = sformat('%.0f', now_us + (n - i))  -- the head newest, as in ADD
      used[#used + 1] = hex
      if #used >= 2000 then used = flush('ZADD', KEYS[2], used) end
    end
  else
    rcall('SETBIT', k, id * 8 + 4, 1)
    z[#z + 1] = expiry
    z[#z + 1] = hex
    if #z >= 2000 then z = flush('ZADD', KEYS[1], z) end
  end
end
flush('ZADD', KEYS[1], z)
flush('ZADD', KEYS[2], used)
local over = rcall('ZCARD', KEYS[1]) - cap
while over > 0 do
  local popped = rcall('ZPOPMIN', KEYS[1], math.min(over, 1000))
  for j = 1, #popped, 2 do unmark(popped[j]) end
  over = over - #popped / 2
end
return n
"""
)

REMOVE = (
    PRELUDE
    + """
-- KEYS: endpoint block zset, endpoint speculative zset, ids. ARGV: block base, endpoint, tier (-1: all), hex chain.
local base, ep, tier, blob = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local id = rcall('HGET', KEYS[3], ep)
if not id then return 0 end
id = tonumber(id)
local n = #blob / 16
local gone, guesses = {}, {}
for i = 1, n do
  local hex = hex_at(blob, i)
  local k = base .. hex
  local v = nibble(k, id)
  if v % 8 > 0 then
    local nv = v
    if tier < 0 then
      nv = 0
    elseif math.floor(v / 2 ^ tier) % 2 == 1 then
      nv = v - 2 ^ tier
    end
    if nv % 8 == 0 then
      -- no tier left: our guess that the block would be there is superseded too
      if nv >= 8 then guesses[#guesses + 1] = hex end
      nv = 0
      gone[#gone + 1] = hex
    end
    if nv ~= v then
      rcall('BITFIELD', k, 'SET', 'u4', id * 8 + 4, nv)
      if nv == 0 then delete_if_empty(k) end
    end
    if #gone >= 1000 then gone = flush('ZREM', KEYS[1], gone) end
    if #guesses >= 1000 then guesses = flush('ZREM', KEYS[2], guesses) end
  end
end
flush('ZREM', KEYS[1], gone)
flush('ZREM', KEYS[2], guesses)
return n
"""
)

CLEAR_CHUNK = (
    PRELUDE
    + """
-- KEYS: endpoint block zset, endpoint speculative zset, ids, names, free ids. ARGV: block base, endpoint, chunk.
-- Purges up to ``chunk`` entries of each zset and returns how many remain (the caller loops until 0, so no single
-- call blocks Redis for long). When none remain, the endpoint's id is freed for reuse: all its bits are clear.
local base, ep, chunk = ARGV[1], ARGV[2], tonumber(ARGV[3])
local id = rcall('HGET', KEYS[3], ep)
if not id then
  rcall('DEL', KEYS[1], KEYS[2])
  return 0
end
id = tonumber(id)
local popped = rcall('ZPOPMIN', KEYS[1], chunk)
for j = 1, #popped, 2 do
  local k = base .. popped[j]
  if nibble(k, id) % 8 > 0 then
    rcall('BITFIELD', k, 'SET', 'u3', id * 8 + 5, 0)
    delete_if_empty(k)
  end
end
popped = rcall('ZPOPMIN', KEYS[2], chunk)
for j = 1, #popped, 2 do
  local k = base .. popped[j]
  if nibble(k, id) >= 8 then
    rcall('SETBIT', k, id * 8 + 4, 0)
    delete_if_empty(k)
  end
end
local left = rcall('ZCARD', KEYS[1]) + rcall('ZCARD', KEYS[2])
if left == 0 then
  rcall('HDEL', KEYS[3], ep)
  rcall('HDEL', KEYS[4], id)
  rcall('ZADD', KEYS[5], id, id)
end
return left
"""
)
