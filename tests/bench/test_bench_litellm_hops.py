"""Issue 45's hop diagnostic: the proxy's callback goes into a LiteLLM target's config only when asked, and the
joiner turns the client's and the proxy's timestamps into the per-hop figures bench/results/litellm_proxy_hops.md
reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.litellm_hops import hop_rows
from bench.targets import HOP_CALLBACK, _with_hop_callback, litellm_config


def test_the_hop_callback_is_added_only_when_the_environment_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("COGNITORA_BENCH_HOPS", raising=False)
    plain = litellm_config("m", ["http://127.0.0.1:1"], "simple-shuffle")
    assert "callbacks" not in _with_hop_callback(plain, tmp_path)["litellm_settings"]
    monkeypatch.setenv("COGNITORA_BENCH_HOPS", str(tmp_path))
    cfg = litellm_config("m", ["http://127.0.0.1:1"], "cognitora")
    cfg["litellm_settings"]["callbacks"] = ["litellm_plugin.callbacks.cognitora"]
    cfg = _with_hop_callback(cfg, tmp_path)
    assert cfg["litellm_settings"]["callbacks"] == [
        "litellm_plugin.callbacks.cognitora",
        "litellm_hop_callback.callbacks",
    ]
    assert (tmp_path / HOP_CALLBACK.name).read_text() == HOP_CALLBACK.read_text()  # beside the config, for LiteLLM


def _jsonl(path: Path, records: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_hops_join_the_client_and_the_proxy_on_the_request_id(tmp_path: Path) -> None:
    _jsonl(tmp_path / "client-1.jsonl", [{"id": "a-0", "sent": 100.0, "first": 103.0, "ttft": 3.0}])
    _jsonl(
        tmp_path / "proxy-2.jsonl",
        [
            {"ev": "pre", "id": "a-0", "call": "c", "t": 100.5},
            {"ev": "done", "id": None, "call": "c", "t": 104.0, "api_call_start": 100.7, "completion_start": 102.7},
            {"ev": "lag", "t": 101.0, "lag": 0.25},
        ],
    )
    [(target, n, stats)] = hop_rows(tmp_path, ["t"], skip_s=0.0)
    assert (target, n) == ("t", 1)
    assert stats["to_pre"] == "0.50 (0.50)"
    assert stats["pre_to_api"] == "0.20 (0.20)"
    assert stats["engine"] == "2.00 (2.00)"
    assert stats["out"] == "0.30 (0.30)"
    assert stats["proxy"] == "1.00 (1.00)"  # the client's 3 s TTFT less the engine's 2 s
    assert stats["lag"] == "1, 0.25, 0.25"
