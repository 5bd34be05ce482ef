"""What the ext_proc hop costs: Envoy + ``cognitora extproc`` against Envoy alone, in one run, same machine.

    .venv/bin/python bench/extproc_overhead.py [--seconds 6] [--concurrency 16] [--out bench/results/extproc_overhead]

One Envoy (``examples/envoy.yaml``, ``--concurrency 1``) with three listeners in front of the same trivial aiohttp
backend (so the router, not an engine, is what is measured):

- ``envoy``: the example's filter chain without ext_proc (identity strip, router; its API-key filter is left out,
  as ``render_config`` does without a JWKS: these requests carry no key);
- ``extproc-memory``: + ext_proc, ``cognitora extproc`` over an in-process store (one gateway);
- ``extproc-redis``: + ext_proc, ``cognitora extproc`` over Redis (gateway replicas share state);
- ``extproc-redis-x2``: the same with ``--workers 2`` (two processes on one port), and the ext_proc cluster capped
  at ``MULTI_CONNECTION_STREAMS`` streams per HTTP/2 connection so that Envoy opens several connections for the
  kernel to spread over the two.

For each, non-streamed (JSON) and streamed (SSE, 8 token chunks) responses:
- added latency: requests one at a time; p50/p99 of the full response time, minus Envoy alone's;
- throughput: ``--concurrency`` keep-alive connections for ``--seconds``; requests/s.

The load generator is a separate process (a minimal HTTP/1.1 client on asyncio, uvloop when installed), so it
does not share a GIL with anything measured. Every process shares the same 2 cores: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SSE_TOKENS = 8
MULTI_CONNECTION_STREAMS = 2
"""``max_concurrent_streams`` of the ext_proc cluster for ``--workers``: c=16 -> 8 connections over 2 processes."""
PROMPT = "You are a helpful assistant. Answer briefly and precisely."


def _loop_factory() -> Any:
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.new_event_loop
    return None


# -- the trivial backend (its own process) ------------------------------------------------------------------------


def serve_backend(ports: list[int]) -> None:
    from aiohttp import web

    usage = {"prompt_tokens": 20, "completion_tokens": SSE_TOKENS, "prompt_tokens_details": {"cached_tokens": 16}}
    reply = json.dumps(
        {"id": "x", "object": "chat.completion", "choices": [{"message": {"content": "ok"}}], "usage": usage}
    ).encode()
    token = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
    usage_chunk = f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' not in body:
            return web.Response(body=reply, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(SSE_TOKENS):
            await response.write(token)
        if b'"include_usage":true' in body:
            await response.write(usage_chunk)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for port in ports:
            await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


# -- an ext_proc with a trivial core (its own process): the hop's own cost, without placement -------------------


class _NoAttempt:
    """Nothing to count: the trivial core keeps no state."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def first_token(self) -> None: ...

    def finish(self, outcome: Any) -> None: ...

    def rerouted(self, endpoint: str, outcome: Any) -> _NoAttempt:
        return _NoAttempt(endpoint)

    async def settled(self) -> None: ...


class FirstEndpointCore:
    """Always the first endpoint; no store. Measures the ext_proc transport and translation alone."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def admit(self, request: Any, **_: Any) -> tuple[Any, _NoAttempt]:
        from cognitora.decision import Decision

        decision = Decision(request.request_id, request.model, self.endpoint, None, prompt_tokens=20)
        return decision, _NoAttempt(self.endpoint)


def serve_trivial_extproc(port: int, endpoint: str, profile: Path | None) -> None:
    import signal

    from envoy_extproc.addresses import AddressBook
    from envoy_extproc.server import start_server
    from envoy_extproc.settings import ExtprocSettings

    async def main() -> None:
        settings = ExtprocSettings(config_path=Path("-"), listen=f"127.0.0.1:{port}")
        server = await start_server(FirstEndpointCore(endpoint), settings, AddressBook({}))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0)

    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    factory = None if os.environ.get("BENCH_NO_UVLOOP") else _loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
    if profiler is not None and profile is not None:
        profiler.disable()
        profiler.dump_stats(str(profile))


# -- the load generator (its own process) ---------------------------------------------------------------------------


def request_bytes(port: int, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": "bench",
            "max_tokens": SSE_TOKENS,
            "stream": stream,
            "messages": [{"role": "system", "content": PROMPT}, {"role": "user", "content": "What is 2+2?"}],
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    i = lower.find(b"content-length:")
    if i >= 0:
        await reader.readexactly(int(lower[i + 15 : lower.index(b"\r\n", i)]))
        return status
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


async def _connection(port: int, payload: bytes, deadline: float, latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            writer.write(payload)
            status = await _read_response(reader)
            latencies.append(time.perf_counter() - start)
            if status != 200:
                errors.append(status)
    finally:
        writer.close()


def loadgen(port: int, stream: bool, concurrency: int, seconds: float) -> dict[str, Any]:
    payload = request_bytes(port, stream)
    latencies: list[float] = []
    errors: list[int] = []

    async def main() -> float:
        warm_until = time.perf_counter() + min(1.0, seconds / 5)
        await asyncio.gather(*(_connection(port, payload, warm_until, [], []) for _ in range(concurrency)))
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.gather(*(_connection(port, payload, deadline, latencies, errors) for _ in range(concurrency)))
        return time.perf_counter() - start

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        elapsed = runner.run(main())
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    return {
        "requests": len(latencies),
        "errors": len(errors),
        "rps": len(latencies) / elapsed,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
    }


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``--workers`` runs the service in child processes)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            pids += process_tree(int(child))
    return pids


def cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of a process and each descendant, threads included (Linux /proc), by pid."""
    seconds = {}
    for p in process_tree(pid):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        seconds[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def run_loadgen(port: int, stream: bool, concurrency: int, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--loadgen", str(port), str(int(stream)), str(concurrency), str(seconds)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


# -- orchestration ------------------------------------------------------------------------------------------------


def add_listeners(
    listeners: dict[str, tuple[int, int | None]], multi_connection: frozenset[str] = frozenset()
) -> Callable[[dict[str, Any]], None]:
    """A config edit: one copy of the example's listener per entry (name -> (port, ext_proc port or None)).

    Listeners in ``multi_connection`` get an ext_proc cluster that opens a connection per
    ``MULTI_CONNECTION_STREAMS`` concurrent streams (for ``--workers``).
    """

    def edit(config: dict[str, Any]) -> None:
        import copy

        resources = config["static_resources"]
        template = resources["listeners"][0]
        extproc_cluster = next(c for c in resources["clusters"] if c["name"] == "cognitora_extproc")
        resources["listeners"] = []
        for name, (port, extproc_port) in listeners.items():
            listener = copy.deepcopy(template)
            listener["name"] = name
            listener["address"]["socket_address"]["port_value"] = port
            hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
            hcm["stat_prefix"] = name
            filters = hcm["http_filters"]
            ext = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
            if extproc_port is None:
                filters.remove(ext)
            else:
                cluster = copy.deepcopy(extproc_cluster)
                cluster["name"] = cluster["load_assignment"]["cluster_name"] = f"extproc_{name}"
                endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                endpoint["address"]["socket_address"]["port_value"] = extproc_port
                if name in multi_connection:
                    options = cluster["typed_extension_protocol_options"]
                    http = options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
                    http["http2_protocol_options"]["max_concurrent_streams"] = MULTI_CONNECTION_STREAMS
                resources["clusters"].append(cluster)
                ext["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] = cluster["name"]
            resources["listeners"].append(listener)

    return edit


def cognitora_config(path: Path, backend_ports: list[int], redis_url: str | None) -> None:
    import yaml

    model: dict[str, Any] = {
        "name": "bench",
        "endpoints": [{"url": f"http://127.0.0.1:{p}", "engine": "openai"} for p in backend_ports],
    }
    from cognitora_sim.tokenizer import SMOLLM2_DIR

    model["tokenizer"] = str(SMOLLM2_DIR / "tokenizer.json")
    model["chat_template"] = str(SMOLLM2_DIR / "chat_template.jinja")
    config: dict[str, Any] = {"models": [model]}
    if redis_url is not None:
        config |= {"redis_url": redis_url, "key_prefix": f"cogbench-{os.getpid()}"}
    path.write_text(yaml.safe_dump(config))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per throughput measurement")
    parser.add_argument("--latency-seconds", type=float, default=4.0, help="per latency measurement")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--profile", type=Path, default=None, help="cProfile the trivial ext_proc into this file")
    parser.add_argument("--only", default=None, help="measure only listeners whose name contains this")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "extproc_overhead")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]

    from cognitora_sim.harness.envoy_launch import render_config, start_envoy, wait_listening
    from cognitora_sim.harness.process import ManagedProcess, free_port

    work = Path(tempfile.mkdtemp(prefix="extproc-bench-"))
    backend_ports = [free_port() for _ in range(4)]
    procs: list[ManagedProcess] = []
    try:
        procs.append(
            ManagedProcess(
                [sys.executable, __file__, "--backend", *map(str, backend_ports)], work / "backend.log", cwd=ROOT
            )
        )
        extproc_ports: dict[str, int] = {}
        extproc_procs: dict[str, ManagedProcess] = {}
        extproc_ports["extproc-trivial"] = free_port()
        trivial = [sys.executable, __file__, "--trivial-extproc", str(extproc_ports["extproc-trivial"])]
        trivial.append(f"127.0.0.1:{backend_ports[0]}")
        if args.profile is not None:
            trivial.append(str(args.profile))
        extproc_procs["extproc-trivial"] = ManagedProcess(trivial, work / "trivial.log", cwd=ROOT)
        variants = (("extproc-memory", None, 1), ("extproc-redis", args.redis_url, 1))
        variants += (("extproc-redis-x2", args.redis_url, 2),)
        for name, redis_url, workers in variants:
            cognitora_config(work / f"{name}.yaml", backend_ports, redis_url)
            extproc_ports[name] = free_port()
            argv = ["extproc", "--config", str(work / f"{name}.yaml"), "--listen", f"127.0.0.1:{extproc_ports[name]}"]
            argv += ["--workers", str(workers)]
            if redis_url is None:  # the hop's cost is measured; there is no engine state to collect from the backend
                argv.append("--without-collector")
            extproc_procs[name] = ManagedProcess(
                [sys.executable, "-m", "cognitora.cli", *argv, "--log-level", "warning"], work / f"{name}.log", cwd=ROOT
            )
        procs.extend(extproc_procs.values())
        listeners: dict[str, tuple[int, int | None]] = {"envoy": (free_port(), None)}
        listeners |= {name: (free_port(), port) for name, port in extproc_ports.items()}
        for port in backend_ports:
            wait_listening(port, procs[0])
        for name, port in extproc_ports.items():
            wait_listening(port, extproc_procs[name])
        admin = free_port()
        config = render_config(
            listen_port=1,
            admin_port=admin,
            extproc_port=1,
            engines=[f"127.0.0.1:{p}" for p in backend_ports],
            edit=add_listeners(listeners, frozenset({"extproc-redis-x2"})),
        )
        procs.append(start_envoy(config, work / "envoy", admin, concurrency=1))

        extproc_pids = {name: proc.pid for name, proc in extproc_procs.items()}
        results: dict[str, Any] = {}
        for stream in (False, True):
            kind = "streamed" if stream else "non-streamed"
            for name, (port, _) in listeners.items():
                if args.only and args.only not in name and name != "envoy":
                    continue
                lat = run_loadgen(port, stream, 1, args.latency_seconds)
                pid = extproc_pids.get(name)
                cpu_before = cpu_seconds(pid) if pid else {}
                thr = run_loadgen(port, stream, args.concurrency, args.seconds)
                if pid:
                    used = {p: s - cpu_before.get(p, 0.0) for p, s in cpu_seconds(pid).items()}
                    thr["extproc_cpu_ms_per_request"] = sum(used.values()) * 1000 / thr["requests"]
                    if len(used) > 1:  # --workers: how evenly Envoy's connections spread over the processes
                        thr["extproc_cpu_share_per_process"] = sorted(
                            (round(s / max(sum(used.values()), 1e-9), 2) for p, s in used.items() if p != pid),
                            reverse=True,
                        )
                results[f"{kind}/{name}"] = {"latency_c1": lat, f"throughput_c{args.concurrency}": thr}
                print(
                    f"{kind:13} {name:15} c=1 p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms | "
                    f"c={args.concurrency} {thr['rps']:.0f} req/s p50 {thr['p50_ms']:.1f} ms "
                    f"cpu/req {thr.get('extproc_cpu_ms_per_request', 0):.2f} ms "
                    f"errors {lat['errors'] + thr['errors']}"
                    + (
                        f" cpu share {thr['extproc_cpu_share_per_process']}"
                        if "extproc_cpu_share_per_process" in thr
                        else ""
                    ),
                    flush=True,
                )
        write_results(args, results, load_before)
    finally:
        for proc in reversed(procs):
            proc.stop()
    return 0


def write_results(args: argparse.Namespace, results: dict[str, Any], load_before: float) -> None:
    conc = args.concurrency
    meta = {
        "command": "python bench/extproc_overhead.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after "
        f"the run, {platform.platform()}",
        "python": platform.python_version(),
        "seconds": args.seconds,
        "concurrency": conc,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    lines = [
        "# ext_proc overhead: Envoy + `cognitora extproc` vs Envoy alone",
        "",
        f"`{meta['command']}` ({meta['when']}; {meta['machine']}; Python {meta['python']}).",
        "Trivial aiohttp backend; Envoy `--concurrency 1`; load generator in its own process; all on the same cores.",
        "",
        f"| response | path | p50 ms c=1 | p99 ms c=1 | added p50 | added p99 | req/s c={conc} | vs Envoy | CPU/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("non-streamed", "streamed"):
        base = results[f"{kind}/envoy"]
        for name in ("envoy", "extproc-trivial", "extproc-memory", "extproc-redis", "extproc-redis-x2"):
            r = results.get(f"{kind}/{name}")
            if r is None:
                continue
            lat, thr = r["latency_c1"], r[f"throughput_c{conc}"]
            added = "" if name == "envoy" else f"{lat['p50_ms'] - base['latency_c1']['p50_ms']:+.2f}"
            added99 = "" if name == "envoy" else f"{lat['p99_ms'] - base['latency_c1']['p99_ms']:+.2f}"
            ratio = thr["rps"] / base[f"throughput_c{conc}"]["rps"]
            cpu = thr.get("extproc_cpu_ms_per_request")
            lines.append(
                f"| {kind} | {name} | {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} | {added} | {added99} | "
                f"{thr['rps']:.0f} | {ratio:.0%} | {'' if cpu is None else f'{cpu:.2f} ms'} |"
            )
    lines += [
        "",
        "Targets (non-streamed, this machine): added p50 <= 1.5 ms and >= 1,500 req/s through Envoy + ext_proc.",
    ]
    for name in ("extproc-trivial", "extproc-memory", "extproc-redis", "extproc-redis-x2"):
        r = results.get(f"non-streamed/{name}")
        if r is None:
            continue
        added = r["latency_c1"]["p50_ms"] - results["non-streamed/envoy"]["latency_c1"]["p50_ms"]
        rps = r[f"throughput_c{conc}"]["rps"]
        cpu = r[f"throughput_c{conc}"].get("extproc_cpu_ms_per_request", float("nan"))
        lines.append(
            f"- {name}: added p50 {added:.2f} ms ({'met' if added <= 1.5 else 'not met'}), {rps:.0f} req/s "
            f"({'met' if rps >= 1500 else 'not met'}); {cpu:.2f} ms of ext_proc CPU per request, i.e. at most "
            f"~{1000 / cpu:.0f} req/s for one process given a whole core"
            + (
                f"; CPU shares of the worker processes {r[f'throughput_c{conc}']['extproc_cpu_share_per_process']}"
                if "extproc_cpu_share_per_process" in r[f"throughput_c{conc}"]
                else ""
            )
        )
    lines += [
        "",
        "`extproc-trivial` is the ext_proc exchange alone (a core that always picks the first engine): the hop's own",
        "cost. `extproc-memory` and `extproc-redis` add the real Router (prompt tokenization with the chat template,",
        "placement, in-flight accounting) over the in-process store and over Redis. c=1 latencies include the",
        "scheduling delays of a machine shared with other work (see the load average); CPU per request is the",
        "steadier figure. docs/envoy.md discusses the numbers.",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--backend":
        serve_backend([int(p) for p in sys.argv[2:]])
    elif len(sys.argv) > 1 and sys.argv[1] == "--trivial-extproc":
        serve_trivial_extproc(int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]) if len(sys.argv) > 4 else None)
    elif len(sys.argv) > 1 and sys.argv[1] == "--loadgen":
        port, stream, concurrency, seconds = sys.argv[2:6]
        print(json.dumps(loadgen(int(port), stream == "1", int(concurrency), float(seconds))))
    else:
        raise SystemExit(main())
