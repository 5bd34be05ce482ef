"""The lean /metrics parse gives exactly what prometheus_client's parser gives, on real and real-shaped vLLM pages."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cognitora_sim.metrics import EngineMetrics
from kvstate.engines import ENGINES, MetricsParseError, parse_prometheus_text

REAL_PAGE = Path(__file__).resolve().parent.parent / "data" / "vllm_0.32_metrics.txt"  # see tests/data/PROVENANCE.md


def vllm_page() -> str:
    """What a vLLM 0.32 server's /metrics holds: its vllm:* families (the sim mirrors their names and labels) with
    observations in every histogram, and prometheus_client's process, platform and GC collectors."""
    metrics = EngineMetrics("smollm2", 0)
    rng = random.Random(7)
    for hist in (metrics.ttft, metrics.itl, metrics.e2e, metrics.queue_time, metrics.request_prompt_tokens):
        for _ in range(40):
            metrics.child(hist).observe(rng.random() * 2000)
    metrics.child(metrics.prompt_tokens).inc(123_456)
    metrics.child(metrics.running).set(3)
    return generate_latest(REGISTRY).decode() + metrics.exposition().decode()


def reference(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """prometheus_client's own parse of the page, without the samples no engine module reads."""
    index: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")) and sample.labels:
                continue
            if math.isfinite(float(sample.value)):
                index.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return index


def as_dict(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples = parse_prometheus_text(text)
    return {name: samples.series(name) for name in samples.names()}


def test_real_shaped_page_parses_as_prometheus_client_does() -> None:
    page = vllm_page()
    parsed = as_dict(page)
    assert parsed == reference(page)
    assert parsed["vllm:prompt_tokens_total"] == [({"model_name": "smollm2", "engine": "0"}, 123_456.0)]
    load = ENGINES.get("vllm").load_from(parse_prometheus_text(page))
    assert load.running == 3 and load.prompt_tokens_total == 123_456


def test_real_vllm_page_parses_as_prometheus_client_does() -> None:
    page = REAL_PAGE.read_text()
    assert as_dict(page) == reference(page)
    load = ENGINES.get("vllm").load_from(parse_prometheus_text(page))
    assert load.prompt_tokens_total is not None and load.prompt_tokens_total > 0
    assert load.running == 0 and load.waiting == 0


@pytest.mark.parametrize(
    "line",
    [
        'm{path="C:\\\\dir",q="say \\"hi\\"",n="a\\nb"} 1',  # escapes: prometheus_client's parse
        'm{a="1" , b="2"} 2',  # spaces in the label set
        "m 3 1700000000000",  # a timestamp
        'm{a="1",} 4',  # a trailing comma
        "m NaN",
    ],
)
def test_unusual_lines_parse_as_prometheus_client_does(line: str) -> None:
    page = f"vllm:num_requests_running 1\n{line}\n"
    assert as_dict(page) == reference(page)


@pytest.mark.parametrize("line", ['m{a="1"b="2"} 1', "m 1_000", "m{a=1} 1", "9m 1"])
def test_malformed_lines_are_a_parse_error(line: str) -> None:
    with pytest.raises(MetricsParseError, match="not Prometheus text"):
        parse_prometheus_text(f"vllm:num_requests_running 1\n{line}\n")
