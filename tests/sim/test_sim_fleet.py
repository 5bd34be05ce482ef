"""The simulated fleet over real HTTP and ZMQ, started as a child process with ``cognitora_sim.launch``.

The KV-event decoder below is written from engines.md section 1 alone (not the project's kvstate/events code), so
these tests check the simulator against the documented wire format, not against our own reader.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from cognitora_sim.harness.process import wait_until
from cognitora_sim.launch import SimFleet, start_fleet

END_SEQ = b"\xff" * 8


# ---- a tiny subscriber, from engines.md section 1 ---------------------------------------------------------------
def decode_payload(payload: bytes) -> tuple[float, int | None, list[dict[str, Any]]]:
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float)
    for e in events:
        assert isinstance(e, dict) and e["type"] in {"BlockStored", "BlockRemoved", "AllBlocksCleared"}, e
    return ts, dp_rank, events


def replay(address: str, start: int, timeout_s: float = 5.0) -> list[tuple[bytes, int, bytes]]:
    """DEALER replay request; returns (topic, seq, payload) until the end marker."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        deadline = time.monotonic() + timeout_s
        while True:
            assert sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), "replay timed out"
            frames = sock.recv_multipart()
            assert frames[0] == b"", frames
            if frames[1:] == [b"", END_SEQ, b""]:
                return out
            assert len(frames) == 4, f"v0.26 replay frames are [b'', topic, seq, payload], got {len(frames)}"
            out.append((frames[1], int.from_bytes(frames[2], "big"), frames[3]))
    finally:
        sock.close()


class Subscriber:
    def __init__(self, address: str, topic: bytes = b"") -> None:
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(address)

    def recv(self, timeout_s: float) -> tuple[bytes, int, bytes] | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        frames = self.sock.recv_multipart()
        assert len(frames) == 3, f"live messages have 3 frames, got {len(frames)}"
        topic, seq, payload = frames
        assert len(seq) == 8
        return topic, int.from_bytes(seq, "big"), payload

    def drain(self, quiet_s: float = 0.3) -> list[tuple[bytes, int, bytes]]:
        out = []
        while (msg := self.recv(quiet_s)) is not None:
            out.append(msg)
        return out

    def close(self) -> None:
        self.sock.close()


# ---- HTTP helpers -----------------------------------------------------------------------------------------------
def chat(url: str, content: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def stream_chat(url: str, content: str, max_tokens: int = 4, **extra: Any) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds to the first content token, and every SSE chunk."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
        **extra,
    }
    chunks: list[dict[str, Any]] = []
    ttft = None
    t0 = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            chunks.append(chunk)
            if ttft is None and any(c.get("delta", {}).get("content") for c in chunk["choices"]):
                ttft = time.monotonic() - t0
    assert ttft is not None
    return ttft, chunks


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics, parsed with prometheus_client's parser, keyed by name (labels dropped)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name if "le" not in s.labels else f"{s.name}{{le={s.labels['le']}}}"
            out[key] = out.get(key, 0.0) + s.value
    return out


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


# ---- fleets -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    """Engine 0 is a slow Mac (visible prefill times), the others H100s; the real SmolLM2 tokenizer."""
    with start_fleet(
        4,
        profile="mac,h100,h100,h100",
        time_scale=20,
        tokenizer=smollm2_dir / "tokenizer.json",
        log_dir=tmp_path_factory.mktemp("sim"),
    ) as f:
        yield f


@pytest.fixture
def small_fleet(tmp_path: Path) -> Iterator[SimFleet]:
    """Two engines whose KV cache holds 64 blocks of 16 tokens; checks the fleet exits 0 on SIGTERM."""
    f = start_fleet(2, time_scale=50, kv_capacity_tokens=1024, log_dir=tmp_path)
    try:
        yield f
    finally:
        assert f.stop() == 0, f.process.log_tail()


# ---- tests ------------------------------------------------------------------------------------------------------
def test_repeated_prompt_reports_cached_tokens_and_a_far_shorter_ttft(fleet: SimFleet) -> None:
    """TTFT in engine time (the engine's own histogram) and as the client sees it (wall time, noisier: the
    machine is shared, so only a factor of two is asserted there)."""
    url = fleet.urls[0]
    prompt = words(1500, "ttft")  # about 9,000 tokens: seconds of prefill on the Mac profile

    def engine_ttft_sum() -> float:
        return metrics(url)["vllm:time_to_first_token_seconds_sum"]

    t0 = engine_ttft_sum()
    first_wall, first = stream_chat(url, prompt, stream_options={"include_usage": True})
    t1 = engine_ttft_sum()
    second_wall, second = stream_chat(url, prompt, stream_options={"include_usage": True})
    t2 = engine_ttft_sum()
    assert first[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    prompt_tokens = second[-1]["usage"]["prompt_tokens"]
    assert prompt_tokens > 3000 and cached == (prompt_tokens - 1) // 16 * 16
    first_engine, second_engine = t1 - t0, t2 - t1
    assert first_engine > 3.0 and second_engine < first_engine / 50, (first_engine, second_engine)
    assert second_wall < first_wall / 2, (first_wall, second_wall)


def test_a_prompt_longer_than_the_context_is_refused_at_once_while_the_fleet_serves(fleet: SimFleet) -> None:
    """A 10 MB prompt (5M tokens) is vLLM's 400, found after counting past the context length (~0.3 s), not after
    tokenizing all of it on the fleet's event loop (11 to 30 s during which no engine of the process answered)."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "a " * 5_000_000}], "max_tokens": 4}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        big = pool.submit(httpx.post, f"{fleet.urls[1]}/v1/chat/completions", json=body, timeout=120)
        latencies = []
        while not big.done():
            t0 = time.monotonic()
            chat(fleet.urls[2], "still there?", max_tokens=1)
            latencies.append(time.monotonic() - t0)
        took = time.monotonic() - started
        resp = big.result()
    assert resp.status_code == 400, resp.text
    assert "maximum context length is 131072 tokens" in resp.json()["error"]["message"]
    assert took < 15.0, took  # ~1 s measured, most of it sending and parsing the 10 MB body
    assert max(latencies, default=0.0) < 3.0, latencies


def test_streamed_usage_only_when_include_usage_is_set(fleet: SimFleet) -> None:
    url = fleet.urls[1]
    _, with_usage = stream_chat(url, "usage please", max_tokens=5, stream_options={"include_usage": True})
    _, without = stream_chat(url, "usage please", max_tokens=5)
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"] == 5
    assert all("usage" not in c for c in without)
    assert with_usage[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in with_usage if c["choices"])
    assert len(text.split()) == 5
    assert [c["choices"][0]["finish_reason"] for c in without][-1] == "length"
    _, continuous = stream_chat(
        url, "usage please", max_tokens=3, stream_options={"include_usage": True, "continuous_usage_stats": True}
    )
    sent = 0
    for c in continuous:  # usage in every chunk counts the tokens streamed so far
        if c["choices"] and c["choices"][0]["delta"].get("content"):
            sent += len(c["choices"][0]["delta"]["content"].split())
            assert c["usage"]["completion_tokens"] == sent
    assert sent == 3


def test_completions_ignore_unknown_fields_and_accept_max_completion_tokens(fleet: SimFleet) -> None:
    url = fleet.urls[1]
    body = {
        "model": "smollm2",
        "prompt": "hello world",
        "max_tokens": 3,
        "no_stop_trim": True,
        "ignore_eos": False,
        "return_hidden_states": False,
        "echo": False,
    }
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()
    assert resp["object"] == "text_completion" and resp["usage"]["completion_tokens"] == 3
    got = chat(url, "hi", max_tokens=None, max_completion_tokens=2, separate_reasoning=True)
    assert got["usage"]["completion_tokens"] == 2
    missing = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]}
    )
    assert missing.status_code == 404 and "does not exist" in missing.json()["error"]["message"]
    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", timeout=10)
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
    models = httpx.get(f"{url}/v1/models").json()
    assert models["data"][0]["id"] == "smollm2"


def test_next_turn_reuses_the_blocks_the_reply_filled(fleet: SimFleet) -> None:
    url = fleet.urls[1]
    messages = [{"role": "user", "content": words(60, "turn")}]
    first = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "smollm2", "messages": messages, "max_tokens": 64}, timeout=30
    ).json()
    reply = first["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "and then?"}]
    second = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "smollm2", "messages": messages, "max_tokens": 4}, timeout=30
    ).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # beyond the first prompt: blocks filled while decoding the reply were cached and hit
    assert cached > first["usage"]["prompt_tokens"] + 32


def test_tokenize_and_render_endpoints_agree_with_the_engine(fleet: SimFleet) -> None:
    url = fleet.urls[2]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is a block?"}]
    tokens = httpx.post(f"{url}/tokenize", json={"model": "smollm2", "messages": messages}).json()
    render = httpx.post(f"{url}/v1/chat/completions/render", json={"model": "smollm2", "messages": messages}).json()
    usage = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "smollm2", "messages": messages, "max_tokens": 1}
    ).json()["usage"]
    assert tokens["tokens"] == render["token_ids"] and tokens["count"] == usage["prompt_tokens"]
    comp = httpx.post(f"{url}/v1/completions/render", json={"model": "smollm2", "prompt": "abc def"}).json()
    assert isinstance(comp, list) and comp[0]["token_ids"]


def test_every_event_decodes_and_blocks_carry_the_prompt_tokens(fleet: SimFleet) -> None:
    i = 3
    url, address = fleet.urls[i], fleet.replay_addresses[i]
    content = words(100, "events")
    prompt_ids = httpx.post(
        f"{url}/tokenize", json={"model": "smollm2", "messages": [{"role": "user", "content": content}]}
    ).json()["tokens"]
    chat(url, content, max_tokens=40)
    wait_until(lambda: bool(replay(address, 0)), 10, "events published")
    batches = replay(address, 0)
    assert [seq for _, seq, _ in batches] == list(range(len(batches)))  # sequence numbers from 0, no holes
    assert all(topic == fleet.topics[i].encode() for topic, _, _ in batches)
    stored: list[dict[str, Any]] = []
    for _, _, payload in batches:
        _, dp_rank, events = decode_payload(payload)
        assert dp_rank == 0
        stored += [e for e in events if e["type"] == "BlockStored"]
    chain: list[int] = []
    tokens: list[int] = []
    for e in stored:
        assert e["block_size"] == 16 and e["medium"] == "GPU" and "lora_id" in e and "lora_name" in e
        assert len(e["token_ids"]) == 16 * len(e["block_hashes"])
        assert e["parent_block_hash"] == (chain[-1] if chain else None)  # chained on the previous block
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in e["block_hashes"])
        chain += e["block_hashes"]
        tokens += e["token_ids"]
    n_prompt_blocks = len(prompt_ids) // 16
    assert tokens[: n_prompt_blocks * 16] == prompt_ids[: n_prompt_blocks * 16]
    # decode-filled blocks are announced too: prompt + 40 generated tokens, the last one without KV
    assert len(chain) == (len(prompt_ids) + 39) // 16


def test_a_gap_is_filled_by_replay(fleet: SimFleet) -> None:
    i = 2
    url = fleet.urls[i]
    chat(url, words(80, "before-subscribing"), max_tokens=2)  # published before anyone listens
    sub = Subscriber(fleet.events_addresses[i])
    try:
        first = None
        deadline = time.monotonic() + 15
        n = 0
        while first is None and time.monotonic() < deadline:  # until our subscription is live
            chat(url, words(40, f"live{n}"), max_tokens=2)
            n += 1
            first = sub.recv(0.5)
        assert first is not None, "no live event received"
        topic, seq, payload = first
        assert topic == fleet.topics[i].encode() and seq > 0  # a gap: seq 0.. were missed
        decode_payload(payload)
        missed = replay(fleet.replay_addresses[i], 0)
        assert [s for _, s, _ in missed][:seq] == list(range(seq))
        assert any(p == payload for _, s, p in missed if s == seq)  # replay repeats the live payload byte for byte
    finally:
        sub.close()


def test_filling_capacity_evicts_and_announces_block_removed(small_fleet: SimFleet) -> None:
    url, address = small_fleet.urls[0], small_fleet.replay_addresses[0]
    a = words(200, "a")  # builtin tokenizer: ~210 tokens, 13 blocks of the 64
    first = chat(url, a, max_tokens=1)
    assert chat(url, a, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    for k in range(6):  # distinct prompts push the first one out (6 x 13 blocks > 64)
        chat(url, words(200, f"b{k}"), max_tokens=1)
    events = [e for _, _, p in replay(address, 0) for e in decode_payload(p)[2]]
    stored_a = [h for e in events[:2] if e["type"] == "BlockStored" for h in e["block_hashes"]]
    removed = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
    assert stored_a and set(stored_a) <= set(removed)
    state = httpx.get(f"{url}/sim/state").json()
    assert state["cached_blocks"] <= 64
    assert chat(url, a, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["usage"]["prompt_tokens"] > 200


def test_metrics_parse_and_track_load(small_fleet: SimFleet) -> None:
    url = small_fleet.urls[1]
    before = metrics(url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:cache_config_info",
        "DCGM_FI_DEV_POWER_USAGE",
    ):
        assert name in before, name
    text = httpx.get(f"{url}/metrics").text
    assert 'num_gpu_blocks="64"' in text and 'block_size="16"' in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text

    small_fleet.fault(1, "slow", factor=10.0)  # ~0.5 s of wall time at --time-scale 50: long enough to scrape
    with httpx.Client(timeout=60) as client:
        body = {"model": "smollm2", "prompt": "load " * 10, "max_tokens": 400, "stream": True}
        with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            it = resp.iter_lines()
            next(it)
            busy = metrics(url)
            assert busy["vllm:num_requests_running"] == 1 and busy["vllm:kv_cache_usage_perc"] > 0
            assert busy["DCGM_FI_DEV_GPU_UTIL"] > 0 and busy["DCGM_FI_DEV_POWER_USAGE"] > 75
            for _ in it:
                pass
    small_fleet.fault(1, "recover")
    wait_until(lambda: metrics(url)["vllm:num_requests_running"] == 0, 10, "engine idle again")
    after = metrics(url)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 400
    assert after["vllm:e2e_request_latency_seconds_count"] == before["vllm:e2e_request_latency_seconds_count"] + 1
    assert after["vllm:inter_token_latency_seconds_count"] - before["vllm:inter_token_latency_seconds_count"] == 399
    assert after["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"] > before["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"]


def test_time_scale_is_honoured_and_metrics_stay_in_engine_time(small_fleet: SimFleet) -> None:
    """At --time-scale 50, 400 decode steps of ~6.6 ms engine time take ~53 ms of wall time."""
    url = small_fleet.urls[0]
    before = metrics(url)
    t0 = time.monotonic()
    chat(url, "time", max_tokens=400)
    wall = time.monotonic() - t0
    after = metrics(url)
    engine_e2e = after["vllm:e2e_request_latency_seconds_sum"] - before["vllm:e2e_request_latency_seconds_sum"]
    assert 2.0 < engine_e2e < 4.0  # 400 tokens at ~6.6 ms each, in engine seconds
    assert engine_e2e / 50 * 0.8 < wall < engine_e2e / 50 + 0.5


def test_faults(small_fleet: SimFleet) -> None:
    url = small_fleet.urls[1]
    sub_address = small_fleet.replay_addresses[1]
    chat(url, words(60, "fault"), max_tokens=2)

    small_fleet.fault(1, "crash")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)
    small_fleet.fault(1, "recover")
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    assert small_fleet.state(1)["next_event_seq"] == 0 and small_fleet.state(1)["cached_blocks"] == 0

    small_fleet.fault(1, "hang")
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{url}/health", timeout=0.5)
    small_fleet.fault(1, "recover")
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200

    prompt = words(60, "slow")
    base = metrics(url)["vllm:time_to_first_token_seconds_sum"]
    chat(url, prompt, max_tokens=1)
    normal = metrics(url)["vllm:time_to_first_token_seconds_sum"] - base
    small_fleet.fault(1, "slow", factor=4.0)
    base = metrics(url)["vllm:time_to_first_token_seconds_sum"]
    chat(url, prompt + " again", max_tokens=1)
    slow = metrics(url)["vllm:time_to_first_token_seconds_sum"] - base
    assert 3.0 < slow / normal < 5.0
    small_fleet.fault(1, "recover")

    chat(url, prompt, max_tokens=1)
    small_fleet.fault(1, "clear_cache")
    events = [e for _, _, p in replay(sub_address, 0) for e in decode_payload(p)[2]]
    assert events[-1] == {"type": "AllBlocksCleared"}
    assert chat(url, prompt, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    small_fleet.fault(1, "restart")
    assert small_fleet.state(1)["next_event_seq"] == 0
    assert replay(sub_address, 0) == []
    with pytest.raises(ValueError, match="kind"):
        small_fleet.fault(1, "explode")


def test_full_kv_preempts_and_a_full_batch_queues(tmp_path: Path) -> None:
    """64 blocks and two seats: three concurrent long requests queue for a seat, and the two running ones outgrow
    the cache, so one is preempted and recomputes; every request still completes in full."""
    # time_scale 5, not 20: each request lasts ~1 s, so three sent together still overlap on a loaded CI machine
    # (at 20 the first could finish before the third arrived, and no request ever waited).
    with start_fleet(
        1, time_scale=5, kv_capacity_tokens=1024, extra_args=["--max-num-seqs", "2"], log_dir=tmp_path
    ) as f:
        url = f.urls[0]
        most_waiting = 0.0
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(chat, url, words(150, f"p{i}"), 500) for i in range(3)]
            # Watched while they run (the wait is over once they are done): on a loaded machine the three may not
            # arrive together, so the queue is seen on the engine's own gauge, not inferred from a queue-time sum.
            while not all(fut.done() for fut in futures):
                most_waiting = max(most_waiting, metrics(url)["vllm:num_requests_waiting"])
            results = [fut.result() for fut in futures]
        assert [r["usage"]["completion_tokens"] for r in results] == [500, 500, 500]
        m = metrics(url)
        assert m["vllm:num_preemptions_total"] >= 1
        assert most_waiting >= 1, "no request ever waited for a seat: the batch of two never filled"
        assert m["vllm:request_queue_time_seconds_sum"] > 0.0  # the one that waited counted its wait
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0


def test_without_scale_out_the_render_routes_answer_403_as_vllm_does(tmp_path: Path) -> None:
    # vLLM 0.32 serves /render only with --enable-scale-out; routers that use it (vllm-router's cache_aware) must
    # meet the same refusal on the sim, or the sim credits them with a cache affinity they lack on real engines.
    with start_fleet(1, extra_args=["--disable-scale-out"], log_dir=tmp_path) as fleet:
        url = fleet.urls[0]
        messages = [{"role": "user", "content": "hello there"}]
        for path, body in (
            ("/v1/chat/completions/render", {"model": "smollm2", "messages": messages}),
            ("/v1/completions/render", {"model": "smollm2", "prompt": "abc def"}),
        ):
            resp = httpx.post(f"{url}{path}", json=body, timeout=30)
            assert resp.status_code == 403, resp.text
            assert "--enable-scale-out" in resp.json()["error"]["message"]
        # what does not need scale-out still answers: tokenize and a completion
        assert httpx.post(f"{url}/tokenize", json={"model": "smollm2", "prompt": "abc def"}).json()["count"] > 0
        assert chat(url, "hello there")["usage"]["prompt_tokens"] > 0
