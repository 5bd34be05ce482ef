"""Does ``cognitora collector``'s RSS step up at each fault for good, or only to a high-water mark? The soak
(bench/soak.py) saw the collector's RSS flat between faults and rising in steps at them; this repeats one kind of
fault many times over and samples the RSS just before each.

    python -m bench.collector_rss --fault redis-restart --faults 12
    python -m bench.collector_rss --fault config-reload --faults 12
    python -m bench.collector_rss --fault none --faults 12          # the same time, no fault

The soak's collector half: a private ``redis-server``, two simulated engines that evict (``--kv-capacity-tokens``),
``cognitora collector`` (no tracemalloc), and ``--rps`` requests a second straight to each engine so KV events flow.
Every ``--every-s``: the fault (a Redis restart: the collector purges and replays each engine's events; a config
reload with another scrape interval: the collector rebuilds its scraper and its discovered event streams, which
resync; an engine restart), then RSS sampled once the next fault is due. Prints one line per fault and the RSS
gained over the first and the second half of the faults.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.soak import Run, load, proc_sample, start_redis
from cognitora_sim.harness.process import ManagedProcess, free_port
from cognitora_sim.launch import start_fleet
from cognitora_sim.tokenizer import SMOLLM2_DIR

FAULTS = ("redis-restart", "config-reload", "engine-restart", "none")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=FAULTS, default="redis-restart")
    p.add_argument("--faults", type=int, default=12)
    p.add_argument("--every-s", type=float, default=30.0)
    p.add_argument("--warmup-s", type=float, default=60.0)
    p.add_argument("--rps", type=float, default=2.0, help="requests a second to each engine (default 2)")
    p.add_argument("--kv-capacity-tokens", type=int, default=16384)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cognitora-collector-rss-"))
    tokenizer = SMOLLM2_DIR / "tokenizer.json"
    redis_port = free_port()
    redis_proc = start_redis(redis_port, str(work))
    with start_fleet(
        2, tokenizer=tokenizer, time_scale=10.0, log_dir=work, kv_capacity_tokens=args.kv_capacity_tokens
    ) as fleet:
        config: dict[str, Any] = {
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "key_prefix": "crss",
            "scrape": {"interval_s": 1.0},
            "models": [fleet.model_config(tokenizer)],
        }
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        collector = ManagedProcess(
            [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(config_path)], work / "c.log"
        )
        try:

            async def drive() -> list[tuple[float, float]]:
                nonlocal redis_proc
                t0 = time.monotonic()
                stop = asyncio.Event()
                run = Run()
                loads = [
                    asyncio.create_task(load(url, f"engine{i}", {}, fleet.model, args.rps, run, t0, stop))
                    for i, url in enumerate(fleet.urls)
                ]
                await asyncio.sleep(args.warmup_s)
                rss: list[tuple[float, float]] = []
                for n in range(args.faults + 1):
                    got = proc_sample(collector.pid)
                    if got is None:
                        raise SystemExit(f"the collector exited; see {work / 'c.log'}")
                    rss.append((time.monotonic() - t0, got[0]))
                    print(f"fault {n}: {rss[-1][0]:.0f} s, collector RSS {got[0]:.1f} MiB", flush=True)
                    if n == args.faults:
                        break
                    if args.fault == "redis-restart":
                        redis_proc.kill()
                        redis_proc.wait()
                        redis_proc = await asyncio.to_thread(start_redis, redis_port, str(work))
                    elif args.fault == "config-reload":
                        config["scrape"] = {"interval_s": 1.5 if n % 2 == 0 else 1.0}
                        config_path.write_text(yaml.safe_dump(config))
                    elif args.fault == "engine-restart":
                        await asyncio.to_thread(fleet.fault, n % 2, "restart")
                    await asyncio.sleep(args.every_s)
                stop.set()
                await asyncio.gather(*loads)
                errors = sum(1 for _, _, status in run.answers if status != 200)
                print(f"requests {len(run.answers)}, not answered 200: {errors}")
                return rss

            rss = asyncio.run(drive())
        finally:
            collector.stop()
            redis_proc.kill()
    half = len(rss) // 2
    print(
        f"{args.fault} x {args.faults}: RSS {rss[0][1]:.1f} -> {rss[half][1]:.1f} -> {rss[-1][1]:.1f} MiB "
        f"(first half of the faults {rss[half][1] - rss[0][1]:+.1f}, second half {rss[-1][1] - rss[half][1]:+.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
