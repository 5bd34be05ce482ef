"""Where the prefix match's time goes inside Redis: what reading one block string per block costs, by layout.

    .venv/bin/python -m bench.match_floor [--blocks 512] [--calls 300]

``redis_scripts.MATCH`` reads one block string per block of the prompt until no endpoint holds the next one: for an
8k-token prompt held whole by an engine, 512 strings. This times, server-side (``TIME`` inside the script, so no
round trip or client is counted), the pieces of that walk and the alternatives a layout change could use, on a
fresh ``redis-server`` with 512 block strings of 4 endpoint bytes:

- building the 512 key names in Lua from the hex chain (what MATCH does), or slicing them from names sent whole;
- ``MGET`` 32 at a time (what MATCH does), all at once, or ``GET`` one by one;
- ``HMGET`` on one hash keyed by the raw 8-byte block key (one key per model instead of one per block; 20,000
  more fields in it, as a real index has, so it is a hash table).

Each line: p50 and p90 over ``--calls`` calls, in microseconds. The per-block cost that remains under every layout
is what keeps the decision over Redis from the issue's 3 ms p99 (``bench/results/litellm_overhead.md``).
"""

from __future__ import annotations

import argparse
import random
import struct
from collections.abc import Sequence

_TIMED = (
    "local t0 = redis.call('TIME')\n"
    "local function us(t) return tonumber(t[1]) * 1e6 + tonumber(t[2]) end\n"
    "local ssub, rcall = string.sub, redis.call\n"
    "local base, blob, raw, names, width = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])\n"
    "local n = #blob / 16\n"
    "local prev, same = nil, 0\n"
    "local function walk(b) for j = 1, #b do if b[j] == prev then same = same + 1 else prev = b[j] end end end\n"
    "{body}\n"
    "return us(rcall('TIME')) - us(t0)"
)

VARIANTS: dict[str, str] = {
    "names built in Lua, no read": (
        "for i = 1, n do local k = base .. ssub(blob, 16 * i - 15, 16 * i); same = same + #k end"
    ),
    "names sliced from names sent, no read": (
        "for i = 1, n do local k = ssub(names, width * i - width + 1, width * i); same = same + #k end"
    ),
    "MGET x32, names built (MATCH today)": (
        "for i = 1, n, 32 do local ks = {} for j = i, math.min(n, i + 31) do "
        "ks[#ks + 1] = base .. ssub(blob, 16 * j - 15, 16 * j) end walk(rcall('MGET', unpack(ks))) end"
    ),
    "MGET x32, names sliced": (
        "for i = 1, n, 32 do local ks = {} for j = i, math.min(n, i + 31) do "
        "ks[#ks + 1] = ssub(names, width * j - width + 1, width * j) end walk(rcall('MGET', unpack(ks))) end"
    ),
    "MGET all at once, names built": (
        "local ks = {} for j = 1, n do ks[j] = base .. ssub(blob, 16 * j - 15, 16 * j) end "
        "walk(rcall('MGET', unpack(ks)))"
    ),
    "GET one by one, names built": (
        "for j = 1, n do local s = rcall('GET', base .. ssub(blob, 16 * j - 15, 16 * j)) walk({s}) end"
    ),
    "HMGET x32 on one hash, raw 8-byte fields": (
        "for i = 1, n, 32 do local fs = {} for j = i, math.min(n, i + 31) do "
        "fs[#fs + 1] = ssub(raw, 8 * j - 7, 8 * j) end walk(rcall('HMGET', KEYS[1], unpack(fs))) end"
    ),
}


def measure(url: str, blocks: int, calls: int) -> dict[str, tuple[int, int]]:
    import redis

    client = redis.from_url(url)
    rng = random.Random(7)
    keys = [rng.getrandbits(64) for _ in range(blocks)]
    hexes = [struct.pack(">Q", k).hex() for k in keys]
    base = "{bench}:{chat}:b:"
    value = b"\x00\x01\x00\x00"  # endpoint 1 holds the block on GPU
    pipe = client.pipeline(transaction=False)
    for h, k in zip(hexes, keys, strict=True):
        pipe.set(base + h, value)
        pipe.hset("{bench}:{chat}:h", struct.pack(">Q", k), value)
    for _ in range(20_000):  # a real index holds far more blocks: the hash is a hash table, not a listpack
        pipe.hset("{bench}:{chat}:h", struct.pack(">Q", rng.getrandbits(64)), value)
    pipe.execute()
    raw = b"".join(struct.pack(">Q", k) for k in keys)
    args: list[str | bytes] = [base, "".join(hexes), raw, "".join(base + h for h in hexes), str(len(base) + 16)]
    out = {}
    for name, body in VARIANTS.items():
        sha = client.script_load(_TIMED.replace("{body}", body))
        times = sorted(int(client.evalsha(sha, 1, "{bench}:{chat}:h", *args)) for _ in range(calls))
        out[name] = (times[len(times) // 2], times[int(len(times) * 0.9)])
    encoding = client.object("ENCODING", "{bench}:{chat}:h")
    client.close()
    print(f"(the hash's encoding: {encoding!r})")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from bench.harness.redis_server import redis_url

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--blocks", type=int, default=512, help="block strings read (512: an 8k-token prompt)")
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args(argv)
    with redis_url() as url:
        results = measure(url, args.blocks, args.calls)
    print(f"{args.blocks} block strings, {args.calls} calls each, microseconds inside Redis")
    print("| variant | p50 | p90 | per block (p50) |")
    print("|---|---|---|---|")
    for name, (p50, p90) in results.items():
        print(f"| {name} | {p50} | {p90} | {p50 / args.blocks:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
