"""dashboard/index.html in a real headless Chromium, against a running simulated fleet and Cognitora.

A fleet of 2 simulated engines, ``cognitora extproc --collector --metrics-listen`` behind the real Envoy, real
requests through Envoy; the page is opened from disk (``file://.../dashboard/index.html?metrics=...``) in Debian's
``chromium`` driven over the DevTools protocol (tests/support/chromium.py). The test
reads the numbers the page shows (the
text of its ``data-metric`` elements) and compares them with a parse of the same ``/metrics`` page: decisions,
nodes and their state, TTFT quantiles (histogram_quantile computed here), the cache hit rate, fleet power and energy
per token; and it sees the live rates move while the requests run.

``COGNITORA_DASHBOARD_SCREENSHOT=docs/dashboard.png`` also saves a screenshot taken under a second wave of traffic
(how docs/dashboard.png is made).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from cognitora.metrics.cors import CorsPolicy
from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.harness.process import free_port
from cognitora_sim.launch import start_fleet
from tests.e2e.test_metrics_e2e import by_label, fleet_models, metrics, send, total
from tests.support.chromium import Chromium

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboard" / "index.html"
NONE_SHOWN = "\u2013"  # what the page shows for a figure it does not have (an en dash)
REQUESTS = 30

# Everything the page shows: each [data-metric] outside the node rows, and each node row's cells.
READ_PAGE = """(() => {
  const shown = {};
  for (const el of document.querySelectorAll('[data-metric]')) {
    if (!el.closest('[data-endpoint]') && !(el.dataset.metric in shown)) shown[el.dataset.metric] = el.textContent;
  }
  const nodes = {};
  for (const row of document.querySelectorAll('tr[data-endpoint]')) {
    const cells = {};
    for (const el of row.querySelectorAll('[data-metric]')) cells[el.dataset.metric] = el.textContent;
    nodes[row.dataset.endpoint] = cells;
  }
  const sources = [...document.querySelectorAll('[data-source]')].map((el) => el.dataset.state);
  const history = window.cognitoraDashboard ? window.cognitoraDashboard.state.history : [];
  const last = history[history.length - 1];
  const stamp = last && last.map.get('dashboard_test_fetch_started_ms{}');  // STAMP_FETCHES's
  const fetched = stamp ? stamp.value : null;
  return {shown, nodes, sources, fetched, ready: !!document.body && document.body.dataset.ready === '1'};
})()"""

# Installed in the page once it runs: every /metrics body the page fetches from then on ends with one more sample,
# the time (the browser's Date.now(), ms) its fetch started. The page parses it like any other line and keeps it in
# the snapshot it renders (the newest of state.history), so READ_PAGE's "fetched" says when the scrape behind the
# figures shown was asked for: the test can tell a poll sent after its own read of /metrics from one sent before.
STAMP_FETCHES = """(() => {
  const fetch0 = window.fetch.bind(window);
  window.fetch = async (...args) => {
    const started = Date.now();
    const r = await fetch0(...args);
    const body = await r.text();
    const stamped = body + '\\ndashboard_test_fetch_started_ms ' + started + '\\n';
    return new Response(stamped, {status: r.status, statusText: r.statusText, headers: r.headers});
  };
  return true;
})()"""


def number(text: str) -> float:
    """A number as the page shows it: '24', '1.5 k', '12.3 ms', '250 µs', '1.234 s', '41.7 %'; NONE_SHOWN is NaN."""
    text = text.strip()
    if text in (NONE_SHOWN, ""):
        return math.nan
    m = re.fullmatch(r"(-?[\d.]+)\s*(k|M|µs|ms|s|%)?", text)
    assert m, f"not a number the page shows: {text!r}"
    scale = {None: 1, "k": 1e3, "M": 1e6, "µs": 1e-6, "ms": 1e-3, "s": 1, "%": 0.01}[m.group(2)]
    return float(m.group(1)) * scale


def histogram_quantile(q: float, page: dict[tuple[str, frozenset[tuple[str, str]]], float], family: str) -> float:
    """Prometheus's histogram_quantile over every series of ``family`` summed by ``le`` (what the page computes)."""
    by_le: dict[float, float] = {}
    for (name, labels), value in page.items():
        if name == f"{family}_bucket":
            le = float(dict(labels)["le"])
            by_le[le] = by_le.get(le, 0.0) + value
    bounds = sorted(by_le)
    counts = [by_le[b] for b in bounds]
    rank = q * counts[-1]
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    start, below = (0.0, 0.0) if b == 0 else (bounds[b - 1], counts[b - 1])
    return start + (bounds[b] - start) * (rank - below) / (counts[b] - below)


def close(shown: float, expected: float, rel: float, abs_: float = 0.0) -> bool:
    return abs(shown - expected) <= rel * abs(expected) + abs_


async def until(browser: Chromium, check: Any, timeout_s: float, what: str) -> dict[str, Any]:
    """Read the page every 0.2 s until ``check(read)`` holds; the last read on timeout, in the failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        read: dict[str, Any] = await browser.evaluate(READ_PAGE)
        if check(read):
            return read
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed {what}: {read}\nconsole: {browser.console}")
        await asyncio.sleep(0.2)


def engine_tokens(engines: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Each engine's own prompt and generated token counters, from its own /metrics page (``engines``: endpoint id
    -> the engine's URL)."""
    counted = {}
    for endpoint, engine_url in engines.items():
        page = metrics(f"{engine_url}/metrics")
        counted[endpoint] = (total(page, "vllm:prompt_tokens_total"), total(page, "vllm:generation_tokens_total"))
    return counted


def exported_tokens(
    page: dict[tuple[str, frozenset[tuple[str, str]]], float], endpoints: list[str]
) -> dict[str, tuple[float, float]]:
    """The same counters as Cognitora's /metrics re-exports them (its collector's latest scrape of each engine)."""
    return {
        ep: (
            total(page, "cognitora_endpoint_prompt_tokens_total", endpoint=ep),
            total(page, "cognitora_endpoint_generation_tokens_total", endpoint=ep),
        )
        for ep in endpoints
    }


async def watch(browser: Chromium, url: str, listen: str, engines: dict[str, str], screenshot: Path | None) -> None:
    endpoints = list(engines)
    query = f"metrics={url}&interval=500&rate_window=3&quantile_window=600"
    await browser.open(f"{DASHBOARD.as_uri()}?{query}")
    await until(browser, lambda r: r["ready"] and r["shown"]["nodes"] == str(len(endpoints)), 30, "both nodes")
    assert await browser.evaluate(STAMP_FETCHES)

    # Live rates while requests run: the page's requests/s and tokens/s move above zero.
    traffic = asyncio.create_task(send(listen, REQUESTS, concurrency=3))
    seen_rps, seen_out = 0.0, 0.0
    done_at: float | None = None
    while True:
        read = await browser.evaluate(READ_PAGE)
        seen_rps = max(seen_rps, number(read["shown"]["requests_per_s"]) or 0.0)
        seen_out = max(seen_out, number(read["shown"]["tokens_out_per_s"]) or 0.0)
        if traffic.done():
            done_at = done_at or time.monotonic()
            if (seen_rps > 0 and seen_out > 0) or time.monotonic() > done_at + 10:
                break
        await asyncio.sleep(0.2)
    assert await traffic == [200] * REQUESTS
    assert seen_rps > 0 and seen_out > 0, (seen_rps, seen_out, browser.console)

    # Once every attempt's end is counted, the page catches up with /metrics; then both are read and compared.
    deadline = time.monotonic() + 30
    while total(metrics(url), "cognitora_attempts_finished_total") < REQUESTS:
        assert time.monotonic() < deadline, "attempts' ends never reached /metrics"
        await asyncio.sleep(0.2)
    settled = metrics(url)
    ttft_count = total(settled, "cognitora_attempt_ttft_achieved_seconds_count")
    read = await until(
        browser,
        lambda r: (
            r["shown"]["decisions_total"] == str(REQUESTS)
            and r["shown"].get("ttft_count") == str(int(ttft_count))
            and r["shown"]["queue_depth"] == "0"
        ),
        15,
        f"{REQUESTS} decisions and {ttft_count} TTFTs",
    )
    # The fleet's figures are the collector's scrapes of the engines, a scrape or more behind the router's counters:
    # wait until /metrics re-exports every token the engines themselves counted (they served every request: their
    # counters are final). Until then energy per token drops when the last requests' tokens land, then climbs again,
    # so a figure read between two reads of /metrics need not lie between them (a loaded CI run showed 0.091 J,
    # outside the band).
    deadline = time.monotonic() + 30
    while (exported := exported_tokens(metrics(url), endpoints)) != (counted := engine_tokens(engines)):
        assert time.monotonic() < deadline, (
            f"/metrics never re-exported the engines' token counts: {exported} {counted}"
        )
        await asyncio.sleep(0.2)
    # From here the fleet is idle and its token counts stay: power only falls to idle, energy per token only rises
    # (the energy window, which starts before the traffic, gains joules over the same tokens). Bracket the figures
    # the page shows between two reads of /metrics, with the page's scrape between them: one whose fetch started
    # after the first read was answered (its Date.now() stamp, STAMP_FETCHES), not merely a later poll (polls
    # overlap, a slow one lands late).
    before = metrics(url)
    mark = await browser.evaluate("Date.now()")
    read = await until(browser, lambda r: (r["fetched"] or 0) > mark, 15, f"a poll fetched after {mark}")
    page = metrics(url)
    shown, nodes = read["shown"], read["nodes"]

    def between(text: str, name: str, rel: float = 0.01, abs_: float = 0.0, **labels: str) -> bool:
        low, high = sorted((total(before, name, **labels), total(page, name, **labels)))
        return low - rel * abs(low) - abs_ <= number(text) <= high + rel * abs(high) + abs_

    assert read["sources"] == ["ok"]

    assert number(shown["decisions_total"]) == total(page, "cognitora_decisions_total") == REQUESTS
    assert number(shown["decisions_placed"]) == total(page, "cognitora_decisions_total", outcome="placed")
    assert number(shown["nodes"]) == len(endpoints)
    healthy = by_label(page, "cognitora_endpoint_healthy", "endpoint")
    assert set(nodes) == set(endpoints) == set(healthy)
    assert number(shown["nodes_healthy"]) == sum(healthy.values())
    for ep in endpoints:
        assert nodes[ep]["healthy"] == ("healthy" if healthy[ep] == 1 else "down"), nodes[ep]
        assert number(nodes[ep]["decisions"]) == total(page, "cognitora_decisions_total", endpoint=ep)
        assert between(nodes[ep]["running"], "cognitora_endpoint_running", endpoint=ep), nodes[ep]
        assert between(nodes[ep]["waiting"], "cognitora_endpoint_waiting", endpoint=ep), nodes[ep]
        assert between(nodes[ep]["kv_use"], "cognitora_endpoint_kv_usage_ratio", 0.0, 0.0006, endpoint=ep), nodes
        assert between(nodes[ep]["power_w"], "cognitora_endpoint_power_watts", 0.0, 0.06, endpoint=ep), nodes
    assert sum(number(nodes[ep]["decisions"]) for ep in endpoints) == REQUESTS

    # Histograms: the page's quantiles are histogram_quantile's over the same buckets (its window covers them all).
    for q in ("p50", "p90", "p99"):
        expected = histogram_quantile(int(q[1:]) / 100, page, "cognitora_attempt_ttft_achieved_seconds")
        assert close(number(shown[f"ttft_{q}"]), expected, 0.01, 1e-4), (q, shown[f"ttft_{q}"], expected)
    assert number(shown["decision_count"]) == REQUESTS

    # Cache, power, energy (the fleet's gauges move between two reads: a tolerance).
    achieved = total(page, "cognitora_attempt_cached_tokens_achieved_total")
    hit = achieved / total(page, "cognitora_attempt_cache_prompt_tokens_total")
    assert achieved > 0 and close(number(shown["kv_hit_rate"]), hit, 0.0, 0.0011), (shown["kv_hit_rate"], hit)
    assert total(page, "cognitora_fleet_power_watts") > 0
    assert between(shown["fleet_power_w"], "cognitora_fleet_power_watts", 0.0, 0.06), shown
    assert total(page, "cognitora_fleet_joules_per_token") > 0
    assert between(shown["joules_per_token"], "cognitora_fleet_joules_per_token", 0.0, 0.0006), shown
    assert between(shown["joules_per_output_token"], "cognitora_fleet_joules_per_output_token", 0.0, 0.0006), shown
    assert number(shown["queue_depth"]) == total(page, "cognitora_endpoint_waiting") == 0
    assert not [line for line in browser.console if line.startswith("exception")], browser.console

    if screenshot is not None:  # under steady traffic for a while, so the charts show it
        stop = time.monotonic() + 25

        async def steady() -> None:
            while time.monotonic() < stop:
                await send(listen, 12, concurrency=4)

        wave = asyncio.create_task(steady())
        await asyncio.sleep(20)
        await browser.screenshot(screenshot)
        await wave


def test_dashboard_in_chromium_shows_what_metrics_says(tmp_path: Path, smollm2_dir: Path) -> None:
    with start_fleet(2, time_scale=10.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet:
        config = {"models": fleet_models(fleet, smollm2_dir), "scrape": {"interval_s": 0.5, "timeout_s": 0.4}}
        config_path = tmp_path / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        metrics_port = free_port()
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        shot = os.environ.get("COGNITORA_DASHBOARD_SCREENSHOT")
        metrics_args = ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
        with start_gateway(config_path, fleet.endpoint_ids, tmp_path, extproc_args=metrics_args) as gateway:
            gateway.extproc.wait_http(url)

            async def run() -> None:
                async with Chromium() as browser:
                    await watch(
                        browser,
                        url,
                        gateway.url,
                        dict(zip(fleet.endpoint_ids, fleet.urls, strict=True)),
                        Path(shot) if shot else None,
                    )

            asyncio.run(run())
        assert gateway.extproc.proc.returncode == 0, gateway.extproc.log_tail(60)


PARSER_CASE = r"""(() => {
  const d = window.cognitoraDashboard;
  const text = [
    '# HELP x_total A "help" line',
    '# TYPE x_total counter',
    'x_total{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",} 3 1700000000000',
    'x_total{path="other"} 2.5e1',
    'g NaN',
    'h_bucket{le="0.1"} 2',
    'h_bucket{le="0.5"} 6',
    'h_bucket{le="+Inf"} 10',
    'not a sample {',
    'y -Inf',
    '# EOF',
  ].join('\n');
  const p = d.parseProm(text);
  const samples = p.samples.map((s) => [s.name, s.labels, String(s.value)]);
  const bs = d.buckets(d.mergePages([p]), 'h');
  const quantiles = [0.25, 0.5, 0.9, 0.99].map((q) => d.histogramQuantile(q, bs));
  // Two gateways' pages: their own counters add up; the fleet's gauges come once, from the freshest snapshot.
  const a = d.parseProm([
    'cognitora_decisions_total{outcome="placed",endpoint="e1"} 3',
    'cognitora_endpoint_snapshot_age_seconds{endpoint="e1"} 1.5',
    'cognitora_endpoint_running{endpoint="e1"} 2',
    'cognitora_endpoint_snapshot_age_seconds{endpoint="e2"} 0.1',
    'cognitora_endpoint_running{endpoint="e2"} 7',
    'cognitora_fleet_power_watts 100',
    'cognitora_flow_prediction_margin 1.2',
  ].join('\n'));
  const b = d.parseProm([
    'cognitora_decisions_total{outcome="placed",endpoint="e1"} 4',
    'cognitora_decisions_total{outcome="shed",endpoint=""} 1',
    'cognitora_endpoint_snapshot_age_seconds{endpoint="e1"} 0.2',
    'cognitora_endpoint_running{endpoint="e1"} 5',
    'cognitora_endpoint_snapshot_age_seconds{endpoint="e2"} 0.9',
    'cognitora_endpoint_running{endpoint="e2"} 6',
    'cognitora_fleet_power_watts 120',
    'cognitora_flow_prediction_margin 1.05',
  ].join('\n'));
  const m = d.mergePages([a, b]);
  const value = (name, labels) => (m.byName[name] || []).filter((s) =>
    Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((x, s) => x + s.value, 0);
  return {
    samples, bad: p.bad, types: p.types, quantiles,
    merged: {
      placed: value('cognitora_decisions_total', {outcome: 'placed'}),
      shed: value('cognitora_decisions_total', {outcome: 'shed'}),
      e1: value('cognitora_endpoint_running', {endpoint: 'e1'}),
      e2: value('cognitora_endpoint_running', {endpoint: 'e2'}),
      power: value('cognitora_fleet_power_watts', {}),
      margin: value('cognitora_flow_prediction_margin', {}),
    },
  };
})()"""


def test_dashboard_parser_merge_and_quantiles_in_chromium() -> None:
    """The page's own functions, in the browser: the tolerant parser, the merge of several pages, the quantiles."""

    async def run() -> dict[str, Any]:
        async with Chromium() as browser:
            await browser.open(DASHBOARD.as_uri())
            deadline = time.monotonic() + 20
            while not await browser.evaluate("!!(window.cognitoraDashboard && document.body)"):
                assert time.monotonic() < deadline, browser.console
                await asyncio.sleep(0.1)
            got: dict[str, Any] = await browser.evaluate(PARSER_CASE)
            assert not browser.console, browser.console
            return got

    got = asyncio.run(run())
    assert got["samples"] == [
        ["x_total", {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb"}, "3"],
        ["x_total", {"path": "other"}, "25"],
        ["g", {}, "NaN"],
        ["h_bucket", {"le": "0.1"}, "2"],
        ["h_bucket", {"le": "0.5"}, "6"],
        ["h_bucket", {"le": "+Inf"}, "10"],
        ["y", {}, "-Infinity"],
    ]
    assert got["bad"] == 1 and got["types"] == {"x_total": "counter"}
    page = {
        ("h_bucket", frozenset({("le", "0.1")})): 2.0,
        ("h_bucket", frozenset({("le", "0.5")})): 6.0,
        ("h_bucket", frozenset({("le", "+Inf")})): 10.0,
    }
    expected = [histogram_quantile(q, page, "h") for q in (0.25, 0.5, 0.9, 0.99)]
    assert got["quantiles"] == pytest.approx(expected) and expected == pytest.approx([0.15, 0.4, 0.5, 0.5])
    # each gateway's own prediction margin: the page shows the highest, not a sum
    assert got["merged"] == {"placed": 7, "shed": 1, "e1": 5, "e2": 7, "power": 100, "margin": 1.2}


def test_a_slow_scrape_that_lands_late_is_not_drawn_after_a_newer_one() -> None:
    """Polls overlap when /metrics answers slower than the interval. A counter read early but answered late must not
    be drawn after one read later (it would read as a restart and spike the rates): the page's history keeps its
    counters in the order they were read, and requests/s never goes negative."""
    served = 0

    async def page(request: web.Request) -> web.Response:
        nonlocal served
        served += 1
        value = served * 10  # the counter as of this read
        if served % 2:
            await asyncio.sleep(0.9)  # answered after the next poll's read (interval 0.3 s)
        body = f"# TYPE cognitora_decisions_total counter\ncognitora_decisions_total {value}\n"
        return web.Response(text=body, headers=CorsPolicy().headers(dict(request.headers)))

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204, headers=CorsPolicy().headers(dict(request.headers), preflight=True))

    async def run() -> dict[str, Any]:
        app = web.Application()
        app.router.add_get("/metrics", page)
        app.router.add_route("OPTIONS", "/metrics", preflight)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with Chromium() as browser:
                await browser.open(f"{DASHBOARD.as_uri()}?metrics=http://127.0.0.1:{port}/metrics&interval=300")
                deadline = time.monotonic() + 30
                while served < 14:
                    assert time.monotonic() < deadline, f"the page polled {served} times in 30 s"
                    await asyncio.sleep(0.1)
                got: dict[str, Any] = await browser.evaluate(
                    """(() => {
                      const s = window.cognitoraDashboard.state;
                      return {
                        history: s.history.map((h) => [h.t, h.map.get('cognitora_decisions_total{}').value]),
                        rates: (s.series.requests_per_s || []).map((p) => p[1]).filter((v) => !Number.isNaN(v)),
                      };
                    })()"""
                )
                return got
        finally:
            await runner.cleanup()

    got = asyncio.run(run())
    history = got["history"]
    assert len(history) >= 5, history
    assert [t for t, _ in history] == sorted(t for t, _ in history)
    counters = [float(v) for _, v in history]
    assert counters == sorted(counters), f"a counter read earlier was drawn after a later one: {counters}"
    assert got["rates"] and min(got["rates"]) >= 0, got["rates"]


# -- governance: budgets, burst and cloud, rewrites by intent ------------------------------------------------------

READ_GOVERNANCE = """(() => {
  const rows = (table, key) => {
    const out = {};
    for (const row of document.querySelectorAll('[data-table="' + table + '"] tbody tr')) {
      const cells = {};
      for (const el of row.querySelectorAll('[data-metric]')) {
        cells[el.dataset.metric] = el.dataset.value !== undefined ? Number(el.dataset.value) : el.textContent;
        if (el.dataset.state !== undefined) cells.state = el.dataset.state;
      }
      out[key(row)] = cells;
    }
    return out;
  };
  return {
    budgets: rows('budgets', (r) => [r.dataset.team, r.dataset.window || '', r.dataset.budgetMetric || ''].join('|')),
    burst: rows('burst', (r) => r.dataset.class),
    cloud: rows('cloud', (r) => r.dataset.target),
    spend: rows('cloud_spend', (r) => r.dataset.team + '|' + r.dataset.target),
    rewrites: rows('rewrites', (r) => [r.dataset.intent, r.dataset.requested, r.dataset.model].join('|')),
    ready: !!document.body && document.body.dataset.ready === '1',
  };
})()"""


def governance_config() -> Any:
    from cognitora.config import config_from_dict

    return config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0, "priorities": {"default": {"ttft_slo_s": 2.0}}},
            "models": [  # "code" is so slow (2 tokens/s) that every request of it misses the SLO
                {"name": "code", "endpoints": [{"url": "http://127.0.0.1:9101", "prefill_tokens_per_s": 2}]},
                {"name": "small", "endpoints": [{"url": "http://127.0.0.1:9201", "prefill_tokens_per_s": 1e6}]},
            ],
            "intent": {
                "rewrite": ["auto"],
                "default": "small",
                "intents": [
                    {"name": "code", "target": "code", "rules": [{"last_user_regex": r"```|\bdef "}]},
                    {"name": "chat", "target": "small", "rules": [{"last_user_keywords": ["hello"]}]},
                ],
            },
            "budgets": {
                "prices": {"code": {"input_per_million_usd": 1.0, "output_per_million_usd": 2.0}},
                "teams": {
                    "research": {"limits": [{"window": "day", "total_tokens": 100_000}]},
                    "ops": {"limits": [{"window": "day", "total_tokens": 5}]},  # every request is refused
                },
            },
            "burst": {
                "targets": [
                    {
                        "name": "sim-cloud",
                        "base_url": "https://cloud.example/v1",
                        "models": {"code": "big-code", "small": "big-small"},
                        "input_usd_per_mtok": 150_000.0,
                        "output_usd_per_mtok": 600_000.0,
                    }
                ],
                "teams": ["research"],
                "priorities": ["default"],
            },
        }
    )


async def governance_traffic() -> tuple[Any, Any]:
    """A Router over the in-process store, with budgets, burst and intent: research's code questions go to the
    cloud (its engine is too slow), its greetings to the small model; ops is refused by its budget."""
    from cognitora.core.outcome import Outcome, OutcomeKind
    from cognitora.core.router import Router
    from cognitora.request import RouteRequest
    from kvstate.memory_store import MemoryStore

    router = Router(governance_config(), MemoryStore())

    def ask(text: str, team: str) -> RouteRequest:
        return RouteRequest(model="auto", messages=[{"role": "user", "content": text}], team=team, max_tokens=4)

    done = Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=20, completion_tokens=4)
    for i in range(3):
        decision, attempt = await router.admit(ask(f"```python\ndef f{i}(): pass\n```", "research"))
        assert decision.cloud is not None and attempt is not None, decision.reason
        attempt.finish(done)
    for _ in range(2):
        decision, attempt = await router.admit(ask("hello there", "research"))
        assert decision.cloud is None and attempt is not None, decision.reason
        attempt.finish(done)
    for _ in range(2):
        refused, _ = await router.admit(ask("hello again", "ops"))
        assert refused.rejection is not None
    await asyncio.sleep(0)
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    gate.last_usage = await gate.usage_gauges()  # (the gate reads it every few seconds while requests come)
    return router, gate


def test_the_page_shows_budgets_burst_cloud_spend_and_rewrites() -> None:
    from cognitora.metrics.exporter import Exporter
    from cognitora.metrics.serve import MetricsServer
    from tests.metrics.test_metrics import value

    async def run() -> tuple[dict[str, Any], str]:
        router, _ = await governance_traffic()
        exporter = Exporter(router.config, "extproc", router=router)
        server = MetricsServer(exporter.page)  # the default CORS policy: the dashboard from disk may read it
        await server.start("127.0.0.1:0")
        try:
            page = (await exporter.page()).decode()
            async with Chromium() as browser:
                await browser.open(f"{DASHBOARD.as_uri()}?metrics=http://127.0.0.1:{server.port}/metrics&interval=500")
                deadline = time.monotonic() + 30
                while True:
                    got: dict[str, Any] = await browser.evaluate(READ_GOVERNANCE)
                    if got["ready"] and got["rewrites"] and got["cloud"]:
                        return got, page
                    assert time.monotonic() < deadline, f"the governance panel stayed empty: {got} {browser.console}"
                    await asyncio.sleep(0.2)
        finally:
            await server.stop()
            await router.close()

    got, page = asyncio.run(run())
    # Budgets: usage against the limit per team, and ops' refusals.
    research = got["budgets"]["research|day|total_tokens"]
    assert research["budget_limit"] == 100_000
    assert research["budget_used"] == value(page, "cognitora_budget_usage", team="research") > 0
    assert 0 < research["budget_use"] < 0.01
    assert got["budgets"]["ops|day|total_tokens"]["budget_refused"] == 2
    # Burst: the class, what went out, the cloud target's breaker and spend, per team.
    code = got["burst"]["code · default"]
    assert code["burst_out"] == 3 and code["burst_state"] == "in burst"
    cloud = got["cloud"]["sim-cloud"]
    assert cloud["state"] == "closed" and cloud["cloud_ok"] == 3 and cloud["cloud_inflight"] == 0
    spend = value(page, "cognitora_cloud_cost_usd_total", team="research", target="sim-cloud")
    assert spend == pytest.approx(3 * (20 * 0.15 + 4 * 0.6)) and cloud["cloud_spend"] == pytest.approx(spend)
    assert got["spend"]["research|sim-cloud"]["cloud_team_requests"] == 3
    # Rewrites by intent: the model asked for ("auto") and the one that served.
    assert got["rewrites"]["code|auto|code"]["rewrites"] == 3
    assert got["rewrites"]["chat|auto|small"]["rewrites"] == 4  # research's two greetings and ops' two


# -- the gateway queue (flow_control) ----------------------------------------------------------------------------

READ_FLOW = """(() => {
  const rows = (table, key) => {
    const out = {};
    for (const row of document.querySelectorAll('[data-table="' + table + '"] tbody tr')) {
      const cells = {};
      for (const el of row.querySelectorAll('[data-metric]')) {
        cells[el.dataset.metric] = el.dataset.value !== undefined ? Number(el.dataset.value) : el.textContent;
      }
      if (key(row)) out[key(row)] = cells;
    }
    return out;
  };
  return {
    bands: rows('flow', (r) => r.dataset.band),
    teams: rows('flow_teams', (r) => r.dataset.flow),
    margin: Number((document.querySelector('[data-metric="flow_margin"]') || {dataset: {}}).dataset.value),
    ready: !!document.body && document.body.dataset.ready === '1',
  };
})()"""


def test_the_page_shows_the_gateway_queue_per_band_and_team() -> None:
    """A router whose two one-seat engines are taken: team alpha's request waits in band default, a batch request
    timed out, and one default request was dispatched after a seat freed; its prediction margin learned 1.3. The
    panel shows each, as /metrics says."""
    from cognitora.core.outcome import Outcome, OutcomeKind
    from cognitora.metrics.exporter import Exporter
    from cognitora.metrics.serve import MetricsServer
    from tests.core.test_flow_admission import fleet, req, saturated
    from tests.support.flow_core import until, waiting

    async def run() -> dict[str, Any]:
        router, holders = await saturated(fleet({"classes": {"batch": {"max_wait_s": 0.2}}}))
        assert router.flow is not None
        for late in (1.0, 1.0, 1.1, 1.1, 1.2, 1.2, 1.2, 1.2, 1.3, 1.4):  # first tokens against 1 s predicted
            router.flow.margin.observe(1.0, late)  # the 0.9 quantile of ten: the ninth, 1.3
        first = asyncio.ensure_future(router.admit(req("first", team="beta")))
        await until(lambda: waiting(router) == 1)
        timed_out, _ = await router.admit(req("late", "batch"))
        assert timed_out.rejection is not None
        holders[0].finish(Outcome(OutcomeKind.COMPLETED))
        await asyncio.wait_for(first, 2)
        queued = asyncio.ensure_future(router.admit(req("queued", team="alpha")))
        await until(lambda: waiting(router) == 1)
        exporter = Exporter(router.config, "extproc", router=router)
        server = MetricsServer(exporter.page)
        await server.start("127.0.0.1:0")
        try:
            async with Chromium() as browser:
                await browser.open(f"{DASHBOARD.as_uri()}?metrics=http://127.0.0.1:{server.port}/metrics&interval=500")
                deadline = time.monotonic() + 30
                while True:
                    got: dict[str, Any] = await browser.evaluate(READ_FLOW)
                    if got["ready"] and got["teams"]:
                        return got
                    assert time.monotonic() < deadline, f"the queue panel stayed empty: {got} {browser.console}"
                    await asyncio.sleep(0.2)
        finally:
            queued.cancel()
            await server.stop()
            await router.close()

    got = asyncio.run(run())
    default, batch = got["bands"]["default"], got["bands"]["batch"]
    assert default["flow_waiting"] == 1 and default["flow_oldest"] > 0
    assert default["flow_dispatched"] == 1 and default["flow_mean_wait"] > 0
    assert batch["flow_timeouts"] == 1 and batch["flow_waiting"] == 0
    assert list(got["bands"]) == ["interactive", "default", "batch"]  # highest band first
    assert got["teams"] == {"default|team:alpha": {"flow_team_waiting": 1}}
    assert got["margin"] == pytest.approx(1.3)
