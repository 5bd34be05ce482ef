"""The ext_proc service behind a real Envoy running ``examples/envoy.yaml``, with throwaway aiohttp engines.

The placement core is a recording stand-in here (the adapter is under test: what reaches the core, what Envoy does
with the pick); tests/e2e/test_envoy_e2e.py runs the real Router, Redis and a simulated fleet.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import pytest
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.decision import Decision, Rejection
from cognitora.request import RouteRequest
from cognitora.surface_entry import SurfaceReader
from cognitora_sim.harness.envoy_launch import render_config, start_envoy
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from envoy_extproc.addresses import AddressBook
from envoy_extproc.server import start_server
from envoy_extproc.settings import ExtprocSettings

T = TypeVar("T")
USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}


class BackgroundLoop:
    """An event loop in a thread: the engines and the ext_proc server live there; tests talk HTTP to Envoy."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


async def start_engine(name: str, port: int) -> web.AppRunner:
    """A fake OpenAI engine that reports what it received (model, content-length, stream_options, headers)."""

    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        seen = {
            "served": name,
            "model": body["model"],
            "content_length": request.headers.get("content-length"),
            "body_length": len(raw),
            "stream_options": body.get("stream_options"),
            "destination_header": request.headers.get("x-gateway-destination-endpoint"),
        }
        if not body.get("stream"):
            return web.json_response({"choices": [{"message": {"content": "ok"}}], "usage": USAGE, "seen": seen})
        response = web.StreamResponse(headers={"content-type": "text/event-stream", "x-seen": json.dumps(seen)})
        await response.prepare(request)
        if body["model"] == "late-first":  # headers now, the first token much later
            await asyncio.sleep(1.5)
        words = ("Hel", "lo") if body["model"] != "slow-stream" else ("tok",) * 50
        for word in words:
            await response.write(f'data: {{"choices":[{{"delta":{{"content":"{word}"}}}}]}}\n\n'.encode())
            if body["model"] == "slow-stream":
                await asyncio.sleep(0.1)
        if (body.get("stream_options") or {}).get("include_usage"):
            await response.write(f"data: {json.dumps({'choices': [], 'usage': USAGE})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}], "served": name})

    app = web.Application(client_max_size=64 << 20)
    for path in (
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/embeddings",
    ):
        app.router.add_post(path, chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


@dataclass
class Ended:
    """One attempt's end as the adapter reported it."""

    endpoint: str
    outcome: Outcome
    first_token: bool

    @property
    def ok(self) -> bool:
        return self.outcome.ok


class RecordingAttempt:
    """Stands in for the core's Attempt: records what the adapter reports on it."""

    def __init__(self, core: RecordingCore, request_id: str, endpoint: str) -> None:
        self.core, self.request_id, self.endpoint = core, request_id, endpoint
        self.saw_first_token = False
        self.finished = False

    def first_token(self) -> None:
        if self.saw_first_token or self.finished:
            return
        self.saw_first_token = True
        self.core.events.append(("first_token", self.request_id))

    def finish(self, outcome: Outcome) -> None:
        if self.finished:
            return  # the core's contract: the first finish wins
        self.finished = True
        self.core.events.append(("finished", self.request_id))
        self.core.outcomes.append(Ended(self.endpoint, outcome, self.saw_first_token))
        if outcome.kind.marks_unhealthy(outcome.status):
            self.core.unhealthy.append((self.endpoint, outcome.detail))

    def rerouted(self, endpoint: str, outcome: Outcome) -> RecordingAttempt:
        self.finished = True
        self.core.events.append(("rerouted", self.request_id))
        if outcome.kind.marks_unhealthy(outcome.status):
            self.core.unhealthy.append((self.endpoint, outcome.detail))
        moved = RecordingAttempt(self.core, self.request_id, endpoint)
        moved.saw_first_token = self.saw_first_token
        return moved

    async def settled(self) -> None:
        return None


@dataclass
class RecordingCore:
    """Stands in for the Router: picks what the test says, records every call the adapter makes."""

    pick: str = ""
    runner_up: str | None = None
    model: str | None = None
    rejection: Rejection | None = None
    fail: bool = False
    placed: list[RouteRequest] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    outcomes: list[Ended] = field(default_factory=list)
    unhealthy: list[tuple[str, str]] = field(default_factory=list)
    surfaces: SurfaceReader = field(default_factory=lambda: SurfaceReader({}))
    """The core's surface reader (``Router.surfaces``): Messages, Responses and embeddings bodies are read by it."""

    async def admit(self, request: RouteRequest, **_: Any) -> tuple[Decision, RecordingAttempt | None]:
        self.placed.append(request)
        if self.fail:
            raise RuntimeError("placement bug")
        decision = Decision(
            request_id=request.request_id,
            model=self.model or request.model,
            endpoint=None if self.rejection else self.pick,
            url=None,
            prompt_tokens=10,
            fallbacks=() if self.runner_up is None else (self.runner_up,),
            rejection=self.rejection,
        )
        if decision.endpoint is None:
            return decision, None
        self.events.append(("dispatched", request.request_id))
        return decision, RecordingAttempt(self, request.request_id, decision.endpoint)

    def reset(self, pick: str) -> None:
        """Forget everything recorded; pick ``pick`` (the object itself stays: the server holds it)."""
        self.__dict__.update(RecordingCore(pick=pick).__dict__)


@dataclass
class Stack:
    url: str
    core: RecordingCore
    engines: dict[str, str]
    """name -> IP:port; "dead" is listed in Envoy's cluster but nothing listens there."""

    def wait_outcomes(self, count: int) -> list[Ended]:
        wait_until(lambda: len(self.core.outcomes) >= count, 10.0, f"{count} outcome(s) reported")
        return self.core.outcomes


@contextmanager
def recording_stack(
    workdir: Path, live: Sequence[str], dead: Sequence[str] = (), jwks: str | None = None
) -> Iterator[Stack]:
    """The real Envoy on examples/envoy.yaml before the service with a recording core, aiohttp engines named
    ``live`` (and addresses named ``dead`` that Envoy lists but nothing serves); ``jwks``: keep the example's auth
    filter with that signing key (``render_config``)."""
    bg = BackgroundLoop()
    ports = {name: free_port() for name in (*live, *dead)}
    engines = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    runners = [bg.run(start_engine(name, ports[name])) for name in live]
    core = RecordingCore(pick=engines[live[0]])
    settings = ExtprocSettings(config_path=Path("unused.yaml"), listen="127.0.0.1:0")
    server = bg.run(start_server(core, settings, AddressBook({})))
    listen, admin = free_port(), free_port()
    config = render_config(
        listen_port=listen,
        admin_port=admin,
        extproc_port=server.port,
        engines=list(engines.values()),
        jwks=jwks,
        expose_upstream_host=True,  # these tests read which engine answered
    )
    envoy = start_envoy(config, workdir, admin)
    try:
        yield Stack(url=f"http://127.0.0.1:{listen}", core=core, engines=engines)
    finally:
        envoy.stop()
        bg.run(server.stop(0))
        for runner in runners:
            bg.run(runner.cleanup())
        bg.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with recording_stack(tmp_path_factory.mktemp("envoy"), ("a", "b"), ("dead",)) as s:
        yield s


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], **extra}


def post(stack: Stack, body: Any = None, *, content: bytes | None = None, **kw: Any) -> httpx.Response:
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, content=content, timeout=30, **kw)


def test_each_request_goes_to_the_pick_and_its_usage_comes_back(stack: Stack) -> None:
    for name in ("a", "b", "a"):
        stack.core.reset(stack.engines[name])
        r = post(stack, chat_body())
        assert r.status_code == 200, r.text
        assert r.json()["seen"]["served"] == name
        assert r.json()["seen"]["destination_header"] == stack.engines[name]  # the ORIGINAL_DST carrier
        assert r.headers["x-cognitora-upstream-host"] == stack.engines[name]
        assert "x-cognitora-response-flags" not in r.headers
        (outcome,) = stack.wait_outcomes(1)
        assert outcome.ok and outcome.endpoint == stack.engines[name]
        assert (outcome.outcome.prompt_tokens, outcome.outcome.completion_tokens, outcome.outcome.cached_tokens) == (
            12,
            3,
            8,
        )
        assert not outcome.first_token  # not observable without streaming
        assert [e for e, _ in stack.core.events] == ["dispatched", "finished"]


def test_model_rewrite_arrives_with_a_matching_content_length(stack: Stack) -> None:
    stack.core.reset(stack.engines["b"])
    stack.core.model = "org/real-model-name-that-is-longer"
    seen = post(stack, chat_body(model="alias")).json()["seen"]
    assert seen["model"] == "org/real-model-name-that-is-longer"
    assert int(seen["content_length"]) == seen["body_length"]


def read_stream(stack: Stack, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=30) as r:
        text = r.read().decode()
    return r, [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def test_stream_usage_is_read_without_handing_the_client_a_chunk_it_did_not_ask_for(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    r, events = read_stream(stack, chat_body(stream=True))
    assert json.loads(r.headers["x-seen"])["stream_options"] == {"include_usage": True}  # asked of the engine
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["Hel", "lo"]  # no usage-only chunk
    (outcome,) = stack.wait_outcomes(1)
    assert outcome.ok and outcome.outcome.cached_tokens == 8 and outcome.outcome.completion_tokens == 3
    assert outcome.first_token
    assert [e for e, _ in stack.core.events] == ["dispatched", "first_token", "finished"]


def test_stream_usage_chunk_reaches_a_client_that_asked_for_it(stack: Stack) -> None:
    stack.core.reset(stack.engines["b"])
    _, events = read_stream(stack, chat_body(stream=True, stream_options={"include_usage": True}))
    usage_chunks = [json.loads(e) for e in events[:-1] if json.loads(e)["choices"] == []]
    assert usage_chunks == [{"choices": [], "usage": USAGE}]
    assert stack.wait_outcomes(1)[0].outcome.cached_tokens == 8


def test_client_gone_mid_stream_is_reported_as_incomplete(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    body = chat_body(model="slow-stream", stream=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=30) as r:
        first = next(r.iter_lines())
        assert first.startswith("data: ")
    (outcome,) = stack.wait_outcomes(1)  # reported although the stream never ended
    assert outcome.outcome.kind is OutcomeKind.CLIENT_CANCELLED
    assert outcome.first_token  # the first token did arrive


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"messages":[{"role":"user","content":"x"}]}', "missing 'model'"),
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e20}', "'max_tokens' must be a whole"),
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":100000000000000000000}', "'max_tok"),
        # the core's body rule (cognitora.request.check_body): LiteLLM's proxy answers the same (test_litellm_e2e)
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}', "must be an object"),
    ],
)
def test_bad_body_gets_an_openai_400_and_reaches_no_engine(stack: Stack, content: bytes, says: str) -> None:
    stack.core.reset(stack.engines["a"])
    r = post(stack, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert says in error["message"] and error["type"] == "invalid_request_error"
    assert stack.core.placed == []


def test_an_absurd_max_tokens_is_a_400_naming_the_field(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    r = post(stack, chat_body(max_completion_tokens=10**20))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_completion_tokens"
    assert error["message"].startswith("'max_completion_tokens' is 100000000000000000000: more than any model's")
    assert stack.core.placed == []


def test_oversized_body_gets_a_json_413_from_envoy(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * (17 << 20)}])).encode()
    r = post(stack, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert stack.core.placed == []


def test_an_oversized_chunked_body_gets_a_json_413_from_envoy_too(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * (17 << 20)}])).encode()

    def chunks() -> Iterator[bytes]:  # no content-length: sent chunked
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    r = post(stack, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert stack.core.placed == []


def test_the_services_own_413_keeps_its_message(stack: Stack) -> None:
    # A prompt over limits.exact_prompt_max_chars (the core refuses it; its body fits Envoy's buffer): Envoy's
    # mapper for its own 413 must not replace the message saying how large the prompt was and what the limit is.
    stack.core.reset(stack.engines["a"])
    message = "the prompt is too large for this gateway: 300,000 characters, the limit is 262,144; shorten it"
    stack.core.rejection = Rejection(413, message)
    r = post(stack, chat_body())
    assert r.status_code == 413
    assert r.json()["error"]["message"] == message
    stack.core.rejection = None


def test_rejection_is_answered_by_envoy_with_retry_after(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    stack.core.rejection = Rejection(429, "fleet saturated for priority 'batch': retry later", retry_after_s=3)
    r = post(stack, chat_body())
    assert r.status_code == 429
    assert r.headers["retry-after"] == "3"
    assert r.json()["error"]["message"].startswith("fleet saturated")
    assert r.json()["error"]["type"] == "rate_limit_exceeded"


def test_unreachable_pick_is_retried_on_the_runner_up_and_marked_unhealthy(stack: Stack) -> None:
    stack.core.reset(stack.engines["dead"])
    stack.core.runner_up = stack.engines["b"]
    r = post(stack, chat_body())
    assert r.status_code == 200, r.text
    assert r.json()["seen"]["served"] == "b"
    assert r.headers["x-envoy-attempt-count"] == "2"
    (outcome,) = stack.wait_outcomes(1)
    assert outcome.ok and outcome.endpoint == stack.engines["b"]
    wait_until(lambda: bool(stack.core.unhealthy), 5.0, "mark_unhealthy")
    assert stack.core.unhealthy[0][0] == stack.engines["dead"]


def test_an_adapter_that_cannot_place_fails_closed_with_a_json_503(stack: Stack) -> None:
    """The core answers its own failures (placement.on_error); if placing still raises, nothing goes unplaced."""
    stack.core.reset(stack.engines["a"])
    stack.core.fail = True
    r = post(stack, chat_body())
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "server_error" and "retry" in r.json()["error"]["message"]
    assert stack.core.events == []  # nothing was dispatched


def test_other_paths_pass_through_unplaced(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    r = httpx.get(f"{stack.url}/v1/models", timeout=10)
    assert r.status_code == 200 and r.json()["data"] == [{"id": "m"}]
    assert stack.core.placed == [] and stack.core.events == []


def test_extproc_down_fails_closed_with_a_json_error(tmp_path: Path) -> None:
    listen, admin, nothing_there = free_port(), free_port(), free_port()
    config = render_config(listen_port=listen, admin_port=admin, extproc_port=nothing_there, engines=["127.0.0.1:9"])
    envoy: ManagedProcess = start_envoy(config, tmp_path, admin)
    try:
        r = httpx.post(f"http://127.0.0.1:{listen}/v1/chat/completions", json=chat_body(), timeout=10)
    finally:
        envoy.stop()
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"] == {
        "message": "the placement service (cognitora extproc) is unavailable: retry shortly",
        "type": "server_error",
        "code": "placement_unavailable",
    }


class HungService(ep_grpc.ExternalProcessorServicer):
    """An ext_proc service that accepts the stream and never answers (a wedged process)."""

    async def Process(self, request_iterator: Any, context: Any) -> None:  # the gRPC method's name
        await asyncio.Event().wait()


def test_a_hung_extproc_is_the_same_json_503_after_the_message_timeout(tmp_path: Path) -> None:
    bg = BackgroundLoop()
    port = free_port()

    async def start() -> grpc.aio.Server:
        server = grpc.aio.server()
        ep_grpc.add_ExternalProcessorServicer_to_server(HungService(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        return server

    server = bg.run(start())
    listen, admin = free_port(), free_port()
    config = render_config(listen_port=listen, admin_port=admin, extproc_port=port, engines=["127.0.0.1:9"])
    envoy: ManagedProcess = start_envoy(config, tmp_path, admin)
    try:
        r = httpx.post(f"http://127.0.0.1:{listen}/v1/chat/completions", json=chat_body(), timeout=10)
    finally:
        envoy.stop()
        bg.run(server.stop(0))
        bg.close()
    assert r.status_code == 503 and r.headers["retry-after"] == "1"  # Envoy's own would be a 504 with no message
    assert r.json()["error"]["code"] == "placement_unavailable"
    assert "the placement service (cognitora extproc) is unavailable" in r.json()["error"]["message"]


def test_redis_down_placement_degrades_and_requests_still_flow(tmp_path: Path) -> None:
    """The real Router over a Redis that does not answer: decisions are made degraded, every request is served."""
    from cognitora.config import config_from_dict
    from cognitora.core.router import Router

    bg = BackgroundLoop()
    ports = [free_port(), free_port()]
    runners = [bg.run(start_engine(f"e{i}", port)) for i, port in enumerate(ports)]
    config = config_from_dict(
        {
            "redis_url": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
            "models": [{"name": "m", "endpoints": [{"url": f"http://127.0.0.1:{p}"} for p in ports]}],
        }
    )
    router = Router.from_config(config)
    settings = ExtprocSettings(config_path=Path("unused.yaml"), listen="127.0.0.1:0")
    server = bg.run(start_server(router, settings, AddressBook({})))
    listen, admin = free_port(), free_port()
    engines = [f"127.0.0.1:{p}" for p in ports]
    envoy = start_envoy(
        render_config(
            listen_port=listen, admin_port=admin, extproc_port=server.port, engines=engines, expose_upstream_host=True
        ),
        tmp_path,
        admin,
    )
    try:
        served = [
            httpx.post(f"http://127.0.0.1:{listen}/v1/chat/completions", json=chat_body(), timeout=10) for _ in range(4)
        ]
    finally:
        envoy.stop()
        bg.run(server.stop(0))
        bg.run(router.close())
        for runner in runners:
            bg.run(runner.cleanup())
        bg.close()
    assert [r.status_code for r in served] == [200] * 4
    assert {r.headers["x-cognitora-upstream-host"] for r in served} <= set(engines)
    assert router.stats.placed == 4 and router.stats.degraded == 4


def test_every_address_unreachable_is_a_json_503_and_the_pick_is_marked(tmp_path: Path) -> None:
    bg = BackgroundLoop()
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    core = RecordingCore(pick=dead[0], runner_up=dead[1])
    settings = ExtprocSettings(config_path=Path("unused.yaml"), listen="127.0.0.1:0")
    server = bg.run(start_server(core, settings, AddressBook({})))
    listen, admin = free_port(), free_port()
    envoy = start_envoy(
        render_config(listen_port=listen, admin_port=admin, extproc_port=server.port, engines=dead), tmp_path, admin
    )
    try:
        r = httpx.post(f"http://127.0.0.1:{listen}/v1/chat/completions", json=chat_body(), timeout=10)
        wait_until(lambda: len(core.outcomes) == 1, 10.0, "the outcome")
    finally:
        envoy.stop()
        bg.run(server.stop(0))
        bg.close()
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "server_error"
    assert core.unhealthy and core.unhealthy[0][0] == dead[0]
    assert core.outcomes[0].outcome.kind is OutcomeKind.CONNECT_FAILED
    assert "could not reach" in core.outcomes[0].outcome.detail


def test_engine_addresses_are_kept_from_clients(tmp_path: Path) -> None:
    """The example's response_mutations: the client never sees the header, the service still reads it."""
    bg = BackgroundLoop()
    port, dead = free_port(), free_port()
    runner = bg.run(start_engine("a", port))
    core = RecordingCore(pick=f"127.0.0.1:{dead}", runner_up=f"127.0.0.1:{port}")
    settings = ExtprocSettings(config_path=Path("unused.yaml"), listen="127.0.0.1:0")
    server = bg.run(start_server(core, settings, AddressBook({})))

    listen, admin = free_port(), free_port()
    engines = [f"127.0.0.1:{port}", f"127.0.0.1:{dead}"]
    config = render_config(listen_port=listen, admin_port=admin, extproc_port=server.port, engines=engines)
    envoy = start_envoy(config, tmp_path, admin)
    try:
        r = httpx.post(f"http://127.0.0.1:{listen}/v1/chat/completions", json=chat_body(), timeout=10)
        wait_until(lambda: bool(core.outcomes), 10.0, "the outcome")
    finally:
        envoy.stop()
        bg.run(server.stop(0))
        bg.run(runner.cleanup())
        bg.close()
    assert r.status_code == 200 and "x-cognitora-upstream-host" not in r.headers
    assert core.outcomes[0].endpoint == f"127.0.0.1:{port}"  # the service saw who answered
    assert core.unhealthy and core.unhealthy[0][0] == f"127.0.0.1:{dead}"


def test_the_real_core_is_left_with_nothing_counted_however_the_request_ends(tmp_path: Path) -> None:
    """The real Router behind Envoy: a stream the client abandons, a pick that refuses the connection, and a stream
    whose first token comes after the core's deadline for it: every attempt ends, every count returns to zero."""
    from cognitora.config import config_from_dict
    from cognitora.core.router import Router
    from kvstate.memory_store import MemoryStore
    from kvstate.store import InFlight

    bg = BackgroundLoop()
    live, dead = free_port(), free_port()
    runner = bg.run(start_engine("live", live))
    live_ep, dead_ep = f"127.0.0.1:{live}", f"127.0.0.1:{dead}"
    config = config_from_dict(
        {
            "placement": {"prefill_report_min_s": 0.3, "prefill_report_factor": 1.0},
            "models": [
                {
                    "name": name,
                    "endpoints": [
                        # The dead one looks far faster (beyond the tie band): the core picks it until marked.
                        {"url": f"http://{dead_ep}", "prefill_tokens_per_s": 1e6},
                        {"url": f"http://{live_ep}", "prefill_tokens_per_s": 10},
                    ],
                }
                for name in ("m", "slow-stream", "late-first")
            ],
        }
    )
    store = MemoryStore()
    router = Router(config, store)
    settings = ExtprocSettings(config_path=Path("unused.yaml"), listen="127.0.0.1:0")
    server = bg.run(start_server(router, settings, AddressBook({})))
    listen, admin = free_port(), free_port()
    envoy = start_envoy(
        render_config(listen_port=listen, admin_port=admin, extproc_port=server.port, engines=[dead_ep, live_ep]),
        tmp_path,
        admin,
    )
    url = f"http://127.0.0.1:{listen}/v1/chat/completions"

    def settled() -> bool:
        counts = bg.run(store.inflight([live_ep, dead_ep]))
        return not router.open_attempts() and counts == {live_ep: InFlight(), dead_ep: InFlight()}

    try:
        # 0. Input that used to make placement raise (and so go on unplaced, skipping shedding) is a 400.
        surrogate = b'{"model": "m", "messages": [{"role": "user", "content": "x\\ud800y"}]}'
        r = httpx.post(url, content=surrogate, headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == 400 and "not valid Unicode" in r.json()["error"]["message"], r.text
        nested = b'{"model": "m", "messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
        r = httpx.post(url, content=nested, headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"], r.text
        assert router.stats.internal_errors == 0 and not router.open_attempts()

        # 1. The pick refuses the connection: Envoy retries on the fallback, the core marks the pick.
        r = httpx.post(url, json=chat_body(), timeout=10)
        assert r.status_code == 200 and r.json()["seen"]["served"] == "live"
        wait_until(settled, 10.0, "every count back to zero after the refused connection")
        kinds = [o.kind for o in router.recent_outcomes()]
        assert kinds == [OutcomeKind.CONNECT_FAILED, OutcomeKind.COMPLETED]
        assert router.stats.marked_unhealthy == 1

        # 2. The client abandons a stream after its first chunk.
        with httpx.stream("POST", url, json=chat_body(model="slow-stream", stream=True), timeout=10) as stream:
            assert next(stream.iter_lines()).startswith("data: ")
        wait_until(settled, 10.0, "every count back to zero after the abandoned stream")
        assert router.recent_outcomes()[-1].kind is OutcomeKind.CLIENT_CANCELLED

        # 3. A stream whose first token is late: its prefill stops counting at the deadline, before the token.
        with httpx.stream("POST", url, json=chat_body(model="late-first", stream=True), timeout=10) as stream:
            wait_until(
                lambda: bg.run(store.inflight([live_ep]))[live_ep] == InFlight(1, 0, 0),
                1.2,
                "the prefill deadline while the engine has sent no token",
            )
            assert stream.read()
        wait_until(settled, 10.0, "every count back to zero after the late stream")
        assert router.recent_outcomes()[-1].kind is OutcomeKind.COMPLETED
    finally:
        envoy.stop()
        bg.run(server.stop(0))
        bg.run(router.close())
        bg.run(runner.cleanup())
        bg.close()


@pytest.mark.parametrize(
    "path",
    [
        "/%761/chat/completions",
        "/v1//chat/completions",
        "/v1/./chat/completions",
        "/x/../v1/chat/completions",
        "/v1/chat%2Fcompletions",
        "/v1/chat/completions/",
        "/V1/chat/completions",
    ],
)
def test_no_spelling_of_an_inference_path_reaches_an_engine_unplaced(stack: Stack, path: str) -> None:
    stack.core.reset(stack.engines["a"])
    r = httpx.post(f"{stack.url}{path}", json=chat_body(), timeout=10)
    if r.status_code == 200:
        assert len(stack.core.placed) == 1, f"{path} was served without placement"
    else:
        assert r.status_code in (400, 404), (path, r.status_code, r.text)
        assert stack.core.placed == []


SURFACE_BODIES: dict[str, dict[str, Any]] = {
    "messages": {"model": "m", "max_tokens": 4, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "instructions": "be brief", "input": "hi"},
    "embeddings": {"model": "m", "input": ["one", "two"]},
}


@pytest.mark.parametrize(
    ("path", "surface"),
    [
        ("/v1//messages", "messages"),
        ("/v1/./messages", "messages"),
        ("/x/../v1/messages", "messages"),
        ("/v1/messages/", "messages"),
        ("/V1/messages", "messages"),
        ("/v1%2Fmessages", "messages"),
        ("/v1/messages/count_tokens/..", "messages"),
        ("/v1//responses", "responses"),
        ("/%761/responses", "responses"),
        ("/v1/responses/", "responses"),
        ("/v1/./embeddings", "embeddings"),
        ("/v1/embeddings%2F", "embeddings"),
    ],
)
def test_no_spelling_of_a_surface_path_reaches_an_engine_unplaced(stack: Stack, path: str, surface: str) -> None:
    stack.core.reset(stack.engines["a"])
    r = httpx.post(f"{stack.url}{path}", json=SURFACE_BODIES[surface], timeout=10)
    if r.status_code == 200:
        assert len(stack.core.placed) == 1, f"{path} was served without placement"
        assert stack.core.placed[0].surface == surface
    else:
        assert r.status_code in (400, 404), (path, r.status_code, r.text)
        assert stack.core.placed == []


@pytest.mark.parametrize("surface", ["messages", "responses", "embeddings"])
def test_each_surface_is_placed_as_its_engine_renders_it(stack: Stack, surface: str) -> None:
    stack.core.reset(stack.engines["b"])
    r = httpx.post(f"{stack.url}/v1/{surface}", json=SURFACE_BODIES[surface], timeout=10)
    assert r.status_code == 200 and r.json()["seen"]["served"] == "b", r.text
    (placed,) = stack.core.placed
    assert placed.surface == surface and placed.surface_request is not None
    if surface == "embeddings":
        assert placed.prompt == ["one", "two"] and placed.messages is None
    else:  # the top-level system / instructions are part of the prompt placement keys
        assert placed.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert placed.max_tokens == (4 if surface == "messages" else None)


def test_count_tokens_reaches_an_engine_without_placement(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{stack.url}/v1/messages/count_tokens", json=body, timeout=10)
    assert r.status_code == 200 and r.json()["seen"]["served"] in ("a", "b"), r.text
    assert stack.core.placed == []  # nothing generated: no placement, no budget, no in-flight count


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ("/v1/messages", {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ("/v1/messages", {"max_tokens": 3, "messages": []}, "model"),
        ("/v1/responses", {"model": "m", "input": [{"type": "bogus"}]}, "input[0]"),
        ("/v1/responses", {"model": "m", "input": "x", "max_output_tokens": 1e20}, "max_output_tokens"),
        ("/v1/embeddings", {"model": "m", "input": {"not": "text"}}, "input"),
    ],
)
def test_a_surface_body_that_cannot_be_read_is_a_400_naming_the_field(
    stack: Stack, path: str, body: dict[str, Any], param: str
) -> None:
    stack.core.reset(stack.engines["a"])
    r = httpx.post(f"{stack.url}{path}", json=body, timeout=10)
    assert r.status_code == 400, (path, r.text)
    assert param in (r.json()["error"]["param"] or ""), r.text
    assert stack.core.placed == []


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/metrics"), ("POST", "/sim/fault"), ("POST", "/reset_prefix_cache"), ("GET", "/")]
)
def test_engine_administration_is_not_reachable_through_the_gateway(stack: Stack, method: str, path: str) -> None:
    stack.core.reset(stack.engines["a"])
    r = httpx.request(method, f"{stack.url}{path}", timeout=10)
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    assert "not an inference path" in r.json()["error"]["message"]


def test_a_path_under_a_route_prefix_is_placed_too(tmp_path: Path) -> None:
    """An Envoy that serves the API under /api/ (a route with prefix_rewrite): the service sees the client's path,
    /api/v1/chat/completions, and places it; before, such a request reached an engine unplaced."""
    bg = BackgroundLoop()
    ports = {"a": free_port(), "b": free_port()}
    runners = [bg.run(start_engine(name, port)) for name, port in ports.items()]
    core = RecordingCore()
    settings = ExtprocSettings(config_path=Path("unused.yaml"), listen="127.0.0.1:0")
    server = bg.run(start_server(core, settings, AddressBook({})))

    def serve_under_api(config: dict[str, Any]) -> None:
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        chat = next(r for r in routes if r["match"].get("path") == "/v1/chat/completions")
        prefixed = {**chat, "match": {"prefix": "/api/v1/"}, "route": {**chat["route"], "prefix_rewrite": "/v1/"}}
        routes.insert(0, prefixed)

    listen, admin = free_port(), free_port()
    engines = [f"127.0.0.1:{port}" for port in ports.values()]
    config = render_config(
        listen_port=listen, admin_port=admin, extproc_port=server.port, engines=engines, edit=serve_under_api
    )
    envoy = start_envoy(config, tmp_path, admin)
    served: list[str] = []
    try:
        for name in ("b", "a", "b"):
            core.reset(f"127.0.0.1:{ports[name]}")
            r = httpx.post(f"http://127.0.0.1:{listen}/api/v1/chat/completions", json=chat_body(), timeout=10)
            assert r.status_code == 200, r.text
            served.append(r.json()["seen"]["served"])
            assert [p.messages for p in core.placed] == [[{"role": "user", "content": "hello"}]]
    finally:
        envoy.stop()
        bg.run(server.stop(0))
        for runner in runners:
            bg.run(runner.cleanup())
        bg.close()
    assert served == ["b", "a", "b"]  # each went to the pick, not to the cluster's least-request fallback


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"],
)
def test_another_method_on_an_inference_path_never_reaches_an_engine(stack: Stack, method: str, path: str) -> None:
    # The routes matched the path alone: a GET or PUT went to an engine unplaced (its own 405, from the engine).
    stack.core.reset(stack.engines["a"])
    r = httpx.request(method, f"{stack.url}{path}", json=chat_body(), timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "POST", (method, path, r.text)
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert "x-cognitora-upstream-host" not in r.headers  # answered by Envoy itself
    assert stack.core.placed == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_post_without_a_body_is_refused_not_sent_unplaced(stack: Stack, path: str) -> None:
    stack.core.reset(stack.engines["a"])
    r = httpx.post(f"{stack.url}{path}", timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("the request has no body")
    assert "x-cognitora-upstream-host" not in r.headers
    assert stack.core.placed == []


def test_the_services_own_5xx_reaches_the_client_as_it_wrote_it(stack: Stack) -> None:
    # The 5xx local-reply mapper wrapped it: {"error": {"message": "gateway error: {\"error\": ...}"}}.
    stack.core.reset(stack.engines["a"])
    stack.core.rejection = Rejection(503, "budget store unavailable and budgets.on_store_error is fail_closed", 2)
    r = post(stack, chat_body())
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert r.json()["error"]["message"] == "budget store unavailable and budgets.on_store_error is fail_closed"
    # Envoy's own 5xx (nothing placed: the service failed) is still JSON.
    stack.core.reset(stack.engines["a"])
    stack.core.fail = True
    failed = post(stack, chat_body())
    assert failed.status_code == 503 and failed.json()["error"]["message"].startswith("the gateway could not place")
