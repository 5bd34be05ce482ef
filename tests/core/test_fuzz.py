"""Property-based fuzzing of everything that reads outside input: zero crashes, only the documented errors.

What a client, an engine or an operator can hand Cognitora, and what each reader may answer:

- the Envoy service's body parser (``envoy_extproc.openai_body``): a ``ParsedBody`` or ``BadRequest``; and the
  body it rewrites from a parsed one is valid JSON (it goes to the engine);
- the LiteLLM translation (``litellm_plugin.translate``): a ``RouteRequest`` / ``Outcome``, never an exception;
- the KV-event decoders (``kvstate.events.vllm`` / ``.sglang``): an ``EventBatch`` or ``EventDecodeError``;
- the config loader (``cognitora.config``): a ``CognitoraConfig`` or a ``ConfigError`` that names a key;
- the core end to end (``Router.admit`` with the shipped tokenizer): a placed decision or a 400, and
  ``stats.internal_errors`` stays 0 (an internal error would mean the request fell through to ``on_error``).

CI runs a fixed profile (``ci``: derandomized, no deadline, no example database, a bounded number of examples) so
the module stays well under a minute and a failure reproduces on every machine. ``COGNITORA_FUZZ_PROFILE=deep``
runs many more random examples locally to hunt for new crashes.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cognitora.config import CognitoraConfig, ConfigError, config_from_dict, load_config
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.request import InvalidRequest, RouteRequest
from cognitora_sim.tokenizer import SMOLLM2_DIR
from envoy_extproc.openai_body import BadRequest, ParsedBody, parse_body, rewrite_body
from kvstate.events import sglang, vllm
from kvstate.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, EventDecodeError
from kvstate.memory_store import MemoryStore

settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep",
    max_examples=5000,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("COGNITORA_FUZZ_PROFILE", "ci"))

MODEL = "smollm2"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# -- strategies ----------------------------------------------------------------------------------------------

ANY_CHAR = st.characters(exclude_categories=())
"""Every code point, lone surrogates included (JSON's "\\ud800" escape decodes to one)."""
TEXT = st.text(ANY_CHAR, max_size=40) | st.sampled_from(
    ["", "user", "system", "assistant", "tool", "\ud800", "x\udfffy"]
)
HUGE_INTS = st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**40, -(10**40), 2**1000])
NUMBERS = (
    st.integers()
    | HUGE_INTS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e20, 1e308, -0.0, 0.5, 16.0])
)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT


def _json_values(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
        max_leaves=12,
    )


JSON = _json_values(SCALARS)
"""Any JSON value (NaN and Infinity included: Python's json reads and writes them)."""


def _maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: a plausible one, or anything at all (a wrong type for every field)."""
    return good | JSON


CONTENT_PART = st.fixed_dictionaries(
    {"type": _maybe(st.sampled_from(["text", "image_url", "input_audio", "refusal", "file"]))},
    optional={"text": _maybe(TEXT), "image_url": JSON, "refusal": JSON},
)
CONTENT = _maybe(TEXT | st.lists(CONTENT_PART | TEXT, max_size=3))
TOOL_CALL = st.fixed_dictionaries(
    {"type": _maybe(st.just("function"))},
    optional={
        "id": _maybe(TEXT),
        "function": _maybe(
            st.fixed_dictionaries(
                {"name": _maybe(TEXT)},
                optional={"arguments": _maybe(TEXT | st.just('{"a": 1}') | st.just("{not json"))},
            )
        ),
    },
)
MESSAGE = st.fixed_dictionaries(
    {"role": _maybe(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))},
    optional={
        "content": CONTENT,
        "name": _maybe(TEXT),
        "tool_calls": _maybe(st.lists(TOOL_CALL, max_size=2)),
        "tool_call_id": _maybe(TEXT),
    },
)
MESSAGES = _maybe(st.lists(_maybe(MESSAGE), max_size=4))
TOKEN_IDS = st.lists(st.integers(min_value=-5, max_value=200_000) | HUGE_INTS | st.booleans(), max_size=40)
PROMPT = _maybe(TEXT | st.lists(TEXT, max_size=3) | TOKEN_IDS | st.lists(TOKEN_IDS, max_size=3))
TOOL = st.fixed_dictionaries(
    {"type": _maybe(st.just("function"))},
    optional={
        "function": _maybe(
            st.fixed_dictionaries({"name": _maybe(TEXT)}, optional={"description": JSON, "parameters": JSON})
        )
    },
)
TOOLS = _maybe(st.lists(_maybe(TOOL), max_size=3))
FLAG = _maybe(st.booleans())
MAX_TOKENS = _maybe(NUMBERS)
STREAM_OPTIONS = _maybe(st.fixed_dictionaries({}, optional={"include_usage": _maybe(st.booleans())}))

BODY_FIELDS = {
    "messages": MESSAGES,
    "prompt": PROMPT,
    "tools": TOOLS,
    "stream": FLAG,
    "stream_options": STREAM_OPTIONS,
    "max_tokens": MAX_TOKENS,
    "max_completion_tokens": MAX_TOKENS,
    "add_special_tokens": FLAG,
    "add_generation_prompt": FLAG,
    "continue_final_message": FLAG,
    "chat_template_kwargs": _maybe(st.dictionaries(TEXT, JSON, max_size=3)),
    "user": _maybe(TEXT),
    "temperature": _maybe(NUMBERS),
}
BODIES = st.fixed_dictionaries({"model": _maybe(st.just(MODEL) | TEXT)}, optional=BODY_FIELDS) | JSON
"""OpenAI-shaped request objects with every field possibly of the wrong type, or any JSON value at all."""
PATHS = st.sampled_from([CHAT, COMPLETIONS, "/api/v1/chat/completions", "/v1/embeddings", ""]) | TEXT


def _dump(value: Any, ensure_ascii: bool) -> bytes:
    """JSON bytes as a client could send them: ASCII-escaped (lone surrogates become "\\ud800" escapes) or raw
    UTF-8 (a lone surrogate cannot be raw UTF-8: then its bytes are what a careless encoder writes)."""
    text = json.dumps(value, ensure_ascii=ensure_ascii)
    return text.encode("utf-8", "surrogatepass")


def _nested(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


DEEP_BODIES = [
    _nested(200_000).encode(),
    ('{"model": "m", "messages": ' + _nested(100_000) + "}").encode(),
    ('{"model": "m", "messages": [{"role": "user", "content": ' + _nested(5_000) + "}]}").encode(),
    ('{"model": "m", "prompt": ' + _nested(50_000) + "}").encode(),
    b'{"model": "m", "messages": [{"role": "user", "content": "x\\ud800y"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x\\udfff\\ud800"}], "stream": true}',
    b'{"model": "m", "prompt": "hi", "max_tokens": 1e20}',
    b'{"model": "m", "prompt": "hi", "max_tokens": 16.0}',
    b'{"model": "m", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"model": "m", "prompt": "hi", "max_tokens": NaN, "temperature": Infinity}',
    b'{"model": "m", "model": 5}',
    b"\xff\xfe{\x00}",
    b"\xef\xbb\xbf{}",
]


# -- (a) the Envoy service's body parser -----------------------------------------------------------------------


def _check_parse(raw: bytes, path: str) -> None:
    try:
        parsed = parse_body(raw, path)
    except BadRequest as exc:
        assert exc.message, "a 400 must say what was wrong"
        return
    assert isinstance(parsed, ParsedBody)
    assert isinstance(parsed.model, str) and parsed.model
    assert parsed.max_tokens is None or (type(parsed.max_tokens) is int and parsed.max_tokens >= 0)
    assert isinstance(parsed.stream, bool)
    # The service may rewrite what it parsed (new model, include_usage); the engine must get valid JSON.
    for model, usage in ((None, True), ("rewritten", False), ("rewritten", True)):
        new = rewrite_body(parsed, raw, model=model, include_usage=usage)
        if new is not None:
            body = json.loads(new)
            assert body["model"] == (model or parsed.model)
            if usage:
                assert body["stream_options"]["include_usage"] is True


@given(raw=st.binary(max_size=300), path=PATHS)
@example(raw=b"", path=CHAT)
@example(raw=b"   \n", path=CHAT)
def test_parse_body_of_arbitrary_bytes_is_a_body_or_a_400(raw: bytes, path: str) -> None:
    _check_parse(raw, path)


@given(body=BODIES, path=PATHS, ensure_ascii=st.booleans())
def test_parse_body_of_arbitrary_json_is_a_body_or_a_400(body: Any, path: str, ensure_ascii: bool) -> None:
    _check_parse(_dump(body, ensure_ascii), path)


@pytest.mark.parametrize("raw", DEEP_BODIES, ids=lambda raw: raw[:40].decode("latin-1"))
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_parse_body_of_hostile_bodies_is_a_body_or_a_400(raw: bytes, path: str) -> None:
    _check_parse(raw, path)


def test_a_rewritten_body_with_a_lone_surrogate_outside_the_prompt_is_still_json() -> None:
    # The prompt is checked for lone surrogates by the core (400); any other field goes to the engine as sent. A
    # rewrite (new model, or include_usage beside the client's own stream_options) used to raise UnicodeEncodeError.
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "x\\ud800", "stream": true, '
    raw += b'"stream_options": {}}'
    parsed = parse_body(raw, CHAT)
    new = rewrite_body(parsed, raw, model="other", include_usage=True)
    assert new is not None
    body = json.loads(new)
    assert body["user"] == "x\ud800" and body["model"] == "other"
    assert body["stream_options"] == {"include_usage": True}


def test_parse_body_refuses_float_and_huge_max_tokens() -> None:
    for value in (b"1e20", b"16.5", b"-1", b"true", b'"16"'):
        with pytest.raises(BadRequest) as info:
            parse_body(b'{"model": "m", "prompt": "hi", "max_tokens": ' + value + b"}", COMPLETIONS)
        assert info.value.param == "max_tokens"


# -- (b) the LiteLLM translation -------------------------------------------------------------------------------

ADMIN_METADATA = st.fixed_dictionaries(
    {},
    optional={
        "cognitora_priority": JSON,
        "cognitora_allow_pinning": JSON,
    },
)
METADATA = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "user_api_key_team_id": JSON,
            "user_api_key_hash": JSON,
            "user_api_key": JSON,
            "user_api_key_user_id": JSON,
            "user_api_key_end_user_id": JSON,
            "user_api_key_metadata": _maybe(ADMIN_METADATA),
            "user_api_key_team_metadata": _maybe(ADMIN_METADATA),
            "cognitora_request_id": JSON,
        },
    )
)
REQUEST_KWARGS = st.fixed_dictionaries(
    {},
    optional={
        "metadata": METADATA,
        "litellm_metadata": METADATA,
        "proxy_server_request": _maybe(st.fixed_dictionaries({}, optional={"body": _maybe(BODIES)})),
        "extra_body": _maybe(st.fixed_dictionaries({}, optional=BODY_FIELDS)),
        "litellm_trace_id": JSON,
        **BODY_FIELDS,
    },
)
INPUT = _maybe(TEXT | st.lists(_maybe(MESSAGE), max_size=3))
MESSAGES_ARG = st.none() | st.lists(_maybe(MESSAGE), max_size=4)
"""LiteLLM hands the strategy ``messages`` as a list (or None); what is in it is the client's."""


@given(
    model=TEXT,
    messages=MESSAGES_ARG,
    input=st.none() | INPUT,
    request_kwargs=REQUEST_KWARGS,
    candidates=st.lists(TEXT, max_size=3),
    pinned=st.none() | TEXT,
)
@example(model="m", messages=[False], input=None, request_kwargs={}, candidates=[], pinned=None)  # was a TypeError
def test_litellm_route_request_never_raises(
    model: str,
    messages: list[Any] | None,
    input: Any,
    request_kwargs: dict[str, Any],
    candidates: list[str],
    pinned: str | None,
) -> None:
    from litellm_plugin.translate import route_request

    try:
        req = route_request(model, messages, input, request_kwargs, candidates, pinned_endpoint=pinned)
    except InvalidRequest as exc:  # the one documented refusal: a max_tokens the core's rule rejects, field named
        assert exc.param in ("max_tokens", "max_completion_tokens"), exc
        return
    assert isinstance(req, RouteRequest)
    assert req.model == model and tuple(req.candidates or ()) == tuple(candidates)
    assert isinstance(req.priority, str) and req.priority
    assert req.max_tokens is None or (type(req.max_tokens) is int and req.max_tokens >= 0)
    assert req.may_pin in (True, False)
    for name in ("team", "api_key_id", "user"):
        value = getattr(req, name)
        assert value is None or isinstance(value, str)


class _Usage:
    """A response's usage as LiteLLM's pydantic objects carry it: attributes, not keys."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


USAGE = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": _maybe(NUMBERS),
            "completion_tokens": _maybe(NUMBERS),
            "prompt_tokens_details": _maybe(st.fixed_dictionaries({}, optional={"cached_tokens": _maybe(NUMBERS)})),
        },
    )
)
RESPONSE = _maybe(st.fixed_dictionaries({}, optional={"usage": USAGE})) | USAGE.map(
    lambda usage: _Usage(usage=_Usage(**usage) if isinstance(usage, dict) else usage)
)
TIMES = st.none() | JSON | st.datetimes(timezones=st.none() | st.timezones())
CALLBACK_KWARGS = st.fixed_dictionaries(
    {},
    optional={
        "standard_logging_object": _maybe(
            st.fixed_dictionaries({}, optional={"prompt_tokens": JSON, "completion_tokens": JSON})
        ),
        "api_call_start_time": TIMES,
        "completion_start_time": TIMES,
    },
)


def _litellm_errors() -> st.SearchStrategy[Any]:
    import httpx
    import litellm

    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    response = httpx.Response(500, request=request)

    def make(kind: str, message: str, status: Any) -> BaseException:
        if kind == "cancelled":
            return asyncio.CancelledError(message)
        if kind == "timeout":
            return litellm.Timeout(message=message, model="m", llm_provider="openai")
        if kind == "connection":
            return litellm.APIConnectionError(message=message, llm_provider="openai", model="m", request=request)
        if kind == "internal":
            return litellm.InternalServerError(message=message, llm_provider="openai", model="m", response=response)
        if kind == "unavailable":
            return litellm.ServiceUnavailableError(message=message, llm_provider="openai", model="m", response=response)
        error = RuntimeError(message)
        error.status_code = status  # type: ignore[attr-defined]
        return error

    kinds = st.sampled_from(["cancelled", "timeout", "connection", "internal", "unavailable", "other"])
    return st.builds(make, kinds, TEXT | st.just("Connection error"), JSON)


@given(kwargs=CALLBACK_KWARGS, response=RESPONSE)
@example(  # was a TypeError: one naive, one aware time
    kwargs={
        "api_call_start_time": datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC),
        "completion_start_time": datetime.datetime(2000, 1, 1),
    },
    response={},
)
@example(kwargs={}, response={"usage": {"prompt_tokens": math.inf, "completion_tokens": math.nan}})  # OverflowError
def test_litellm_success_outcome_never_raises(kwargs: dict[str, Any], response: Any) -> None:
    from litellm_plugin.translate import success_outcome

    outcome = success_outcome(kwargs, response)
    assert isinstance(outcome, Outcome) and outcome.kind is OutcomeKind.COMPLETED
    for value in (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens):
        assert value is None or type(value) is int
    assert outcome.ttft_s is None or (isinstance(outcome.ttft_s, float) and outcome.ttft_s >= 0)


@given(error=st.none() | TEXT | st.deferred(_litellm_errors))
def test_litellm_failure_outcome_never_raises(error: Any) -> None:
    from litellm_plugin.translate import failure_outcome

    outcome = failure_outcome(error)
    assert isinstance(outcome, Outcome) and outcome.kind is not OutcomeKind.COMPLETED
    assert outcome.status is None or type(outcome.status) is int
    assert outcome.detail is None or isinstance(outcome.detail, str)


# -- (c) the KV-event decoders ---------------------------------------------------------------------------------

HASH = st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.binary(max_size=12) | HUGE_INTS | JSON
MSGPACK_SCALARS = st.none() | st.booleans() | NUMBERS | TEXT.filter(lambda t: _utf8(t)) | st.binary(max_size=12)


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _packed_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(MSGPACK_SCALARS.filter(_hashable), inner, max_size=3)


ANY_PACKED = st.recursive(MSGPACK_SCALARS, _packed_containers, max_leaves=12)


def _field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return good | ANY_PACKED


TAGS = _field(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "LoadStat"]))
STORED_ARRAY = st.tuples(
    st.just("BlockStored"),
    _field(st.lists(HASH, max_size=4)),
    _field(st.none() | HASH),
    _field(TOKEN_IDS),
    _field(st.sampled_from([0, 1, 16, -16, 2**70])),
    _field(st.none() | st.integers()),
    _field(st.none() | st.sampled_from(["GPU", "cpu", "DISK", "weird"])),
    _field(st.none() | TEXT.filter(_utf8)),
).flatmap(lambda fields: st.integers(1, len(fields)).map(lambda n: list(fields[:n])))
REMOVED_ARRAY = st.tuples(st.just("BlockRemoved"), _field(st.lists(HASH, max_size=4)), _field(st.none() | TEXT)).map(
    list
)
EVENT_MAP = st.fixed_dictionaries(
    {"type": TAGS},
    optional={
        "block_hashes": _field(st.lists(HASH, max_size=4)),
        "parent_block_hash": _field(st.none() | HASH),
        "token_ids": _field(TOKEN_IDS),
        "block_size": _field(st.sampled_from([0, 16, -1])),
        "lora_id": _field(st.none() | st.integers()),
        "lora_name": _field(st.none() | TEXT),
        "medium": _field(st.none() | TEXT),
    },
)
EVENT = STORED_ARRAY | REMOVED_ARRAY | EVENT_MAP | st.lists(TAGS, min_size=1, max_size=2) | ANY_PACKED
BATCH = (
    st.tuples(_field(NUMBERS), _field(st.lists(EVENT, max_size=4)), _field(st.none() | st.integers())).flatmap(
        lambda fields: st.integers(0, 3).map(lambda n: list(fields[:n]))
    )
    | st.fixed_dictionaries(
        {},
        optional={
            "ts": _field(NUMBERS),
            "events": _field(st.lists(EVENT, max_size=4)),
            "data_parallel_rank": _field(st.none() | st.integers()),
            "attn_dp_rank": _field(st.none() | st.integers()),
        },
    )
    | ANY_PACKED
)

DECODERS: dict[str, Callable[[bytes], EventBatch]] = {"vllm": vllm.decode_batch, "sglang": sglang.decode_batch}


def _pack(value: Any) -> bytes | None:
    """msgpack of ``value``, or None where msgpack itself cannot write it (ints beyond 64 bits, strings that are
    not Unicode): an engine cannot send those either."""
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (OverflowError, TypeError, ValueError, UnicodeEncodeError):
        return None


def _check_decode(decode: Callable[[bytes], EventBatch], payload: bytes) -> None:
    try:
        batch = decode(payload)
    except EventDecodeError as exc:
        assert str(exc)
        return
    assert isinstance(batch, EventBatch)
    assert isinstance(batch.ts, float)
    assert batch.dp_rank is None or type(batch.dp_rank) is int
    for event in batch.events:
        assert isinstance(event, BlockStored | BlockRemoved | AllBlocksCleared)
        if isinstance(event, BlockStored | BlockRemoved):
            assert all(type(h) is int and 0 <= h < 2**64 for h in event.block_hashes)
        if isinstance(event, BlockStored):
            assert event.parent_block_hash is None or 0 <= event.parent_block_hash < 2**64
            assert all(type(t) is int and 0 <= t < 2**32 for t in event.token_ids)
            assert type(event.block_size) is int


DEEP_PAYLOADS = [
    b"\x91" * 100_000 + b"\xc0",  # 100k nested one-element arrays
    b"\x81\xa1k" * 50_000 + b"\xc0",  # 50k nested maps
    msgpack.packb([1.0, [["BlockStored", [1], None, [1] * 16, 16]] * 3, None]) + b"\x00",  # trailing bytes
    b"\xdd\xff\xff\xff\xff",  # an array header claiming 4 billion entries
    b"\xc1",  # the one byte msgpack never uses
]


@pytest.mark.parametrize("engine", sorted(DECODERS))
@pytest.mark.parametrize("payload", DEEP_PAYLOADS, ids=lambda p: p[:8].hex())
def test_event_decoders_on_hostile_payloads(engine: str, payload: bytes) -> None:
    _check_decode(DECODERS[engine], payload)


@given(engine=st.sampled_from(sorted(DECODERS)), payload=st.binary(max_size=200))
def test_event_decoders_on_arbitrary_bytes(engine: str, payload: bytes) -> None:
    _check_decode(DECODERS[engine], payload)


@given(engine=st.sampled_from(sorted(DECODERS)), batch=BATCH)
def test_event_decoders_on_arbitrary_batches(engine: str, batch: Any) -> None:
    payload = _pack(batch)
    if payload is not None:
        _check_decode(DECODERS[engine], payload)


# -- (d) the config loader -------------------------------------------------------------------------------------

TOKENIZER = SMOLLM2_DIR / "tokenizer.json"
CONFIG_KEYS = st.sampled_from(
    [
        "models",
        "name",
        "endpoints",
        "url",
        "id",
        "engine",
        "kv_events",
        "tokenizer",
        "chat_template",
        "block_size",
        "loras",
        "placement",
        "priorities",
        "ttft_slo_s",
        "redis_url",
        "key_prefix",
        "scrape",
        "on_error",
        "modles",
    ]
)
CONFIG_LEAVES = SCALARS | st.sampled_from(
    [
        "http://127.0.0.1:8001",
        "http://[::1]:99999",
        "tcp://127.0.0.1:5557",
        "redis://:pw@127.0.0.1:6379/0",
        "os.environ/",
        "os.environ/COGNITORA_FUZZ_UNSET",
        str(TOKENIZER),
        "does/not/exist.json",
        "~",
        "vllm",
    ]
)


def _config_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(CONFIG_KEYS | TEXT, inner, max_size=4)


CONFIG_VALUES = st.recursive(CONFIG_LEAVES, _config_containers, max_leaves=16)
ENDPOINT = st.fixed_dictionaries(
    {"url": _maybe(st.just("http://127.0.0.1:8001") | CONFIG_LEAVES)},
    optional={
        "id": CONFIG_VALUES,
        "engine": CONFIG_VALUES,
        "kv_events": CONFIG_VALUES,
        "prefill_tokens_per_s": CONFIG_VALUES,
    },
)
MODEL_ENTRY = st.fixed_dictionaries(
    {"name": _maybe(st.just(MODEL)), "endpoints": _maybe(st.lists(ENDPOINT | CONFIG_VALUES, max_size=3))},
    optional={
        "tokenizer": CONFIG_VALUES,
        "chat_template": CONFIG_VALUES,
        "block_size": CONFIG_VALUES,
        "loras": CONFIG_VALUES,
    },
)
CONFIGS = (
    st.fixed_dictionaries(
        {"models": _maybe(st.lists(MODEL_ENTRY | CONFIG_VALUES, max_size=2))},
        optional={
            "placement": CONFIG_VALUES,
            "scrape": CONFIG_VALUES,
            "redis_url": CONFIG_VALUES,
            "key_prefix": CONFIG_VALUES,
            "redis_cluster": CONFIG_VALUES,
        },
    )
    | st.dictionaries(CONFIG_KEYS | TEXT | NUMBERS, CONFIG_VALUES, max_size=4)
    | CONFIG_VALUES
)
"""Config-shaped mappings (any value may be of the wrong type), arbitrary nested dicts, or not a mapping at all."""


def _check_config_error(exc: ConfigError, source: str, data: Any) -> None:
    """The message starts with the source, then names where each problem is: a key of ``data`` (the start of a
    key path like ``models[0].endpoints[1].url``) or a key the schema requires, the top level, or a line of the
    YAML text."""
    text = str(exc)
    assert text.startswith(f"{source}: "), text
    assert "Traceback" not in text and "pydantic" not in text and "errors.pydantic.dev" not in text, text
    body = text[len(source) + 2 :]
    if body.startswith(("not valid YAML", "line ")):
        assert "line " in body or "nested too deeply" in body, text
        return
    problems = body.split("\n  - ")[1:] if re.match(r"\d+ problems:\n  - ", body) else [body]
    roots = [*CognitoraConfig.model_fields, *(str(k) for k in data)] if isinstance(data, dict) else []
    for problem in problems:
        assert problem.startswith(("(top level)", "the top level", *roots)), (problem, roots)


@given(data=CONFIGS)
@example(data={0: None})  # was "[0]: Keys should be strings", as if 0 were a list index
@example(data={"models": [{"name": "m", "tokenizer": "a\x00b", "endpoints": [{"url": "http://127.0.0.1:1"}]}]})
@example(data={"models": [{"name": "m", "tokenizer": "\ud800", "endpoints": [{"url": "http://127.0.0.1:1"}]}]})
def test_config_from_dict_is_a_config_or_an_error_naming_a_key(data: Any) -> None:
    try:
        config = config_from_dict(data, source="fuzz.yaml", base_dir=Path("/"))
    except ConfigError as exc:
        _check_config_error(exc, "fuzz.yaml", data)
        return
    assert isinstance(config, CognitoraConfig)


YAML_SNIPPETS = st.sampled_from(
    [
        "models:\n",
        "  - name: smollm2\n",
        "    endpoints:\n",
        "      - url: http://127.0.0.1:8001\n",
        "      - {url: http://127.0.0.1:8002, engine: sglang}\n",
        "placement: {on_error: reject}\n",
        "models: []\n",
        "models: 5\n",
        "&a [*a]\n",
        "!!python/object:os.system x\n",
        "key: !!binary aGVsbG8=\n",
        "? [a, b]\n: c\n",
        "models:\n  - name: a\n    name: b\n",
        "\t- tab\n",
        "--- \n...\n",
        "%YAML 1.1\n---\n",
        "x: &x {a: *x}\n",
        "[" * 500 + "]" * 500 + "\n",
        "{" * 500 + "}" * 500 + "\n",
        "a: 1e400\n",
        "a: .nan\n",
        "2001-01-01: x\n",
        "null: x\n",
        "\ufeff",
        "\x00",
    ]
)
YAML_TEXT = st.lists(YAML_SNIPPETS | st.text(ANY_CHAR.filter(lambda c: _utf8(c)), max_size=30), max_size=6).map("".join)


@pytest.fixture(scope="module")
def yaml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-yaml")


@given(text=YAML_TEXT)
@example(text="\x1f")  # a character YAML forbids: the error had no line
@example(text="? [a, b]\n: c\n")  # an unhashable key: was a TypeError
@example(text="[" * 600 + "]" * 600)  # was a RecursionError
def test_load_config_of_arbitrary_yaml_is_a_config_or_an_error_naming_a_key(text: str, yaml_dir: Path) -> None:
    path = yaml_dir / "cognitora.yaml"
    path.write_text(text)
    try:
        config = load_config(path)
    except ConfigError as exc:
        try:
            data = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError):
            data = None
        data = {} if data is None else data  # load_config reads an empty file as an empty mapping
        _check_config_error(exc, str(path), data)
        return
    assert isinstance(config, CognitoraConfig)


def test_load_config_of_a_yaml_bomb_is_an_error() -> None:
    # "Billion laughs": aliases expand to ~10^9 entries if a reader walks them naively.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    lines.append("models: *a8")
    text = "\n".join(lines) + "\n"
    data = yaml.safe_load(text)  # fast: the aliases are shared references until a reader walks them
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source="bomb.yaml")
    _check_config_error(info.value, "bomb.yaml", data)
    assert "more than" in str(info.value)


# -- (e) the core, end to end ----------------------------------------------------------------------------------

CORE_MESSAGES = st.lists(_maybe(MESSAGE), min_size=1, max_size=4)


@pytest.fixture(scope="module")
def core() -> Iterator[tuple[Router, asyncio.Runner]]:
    config = config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0},
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(TOKENIZER),
                    "endpoints": [{"url": "http://127.0.0.1:8001"}, {"url": "http://127.0.0.1:8002"}],
                }
            ],
        }
    )
    with asyncio.Runner() as runner:
        yield Router(config, MemoryStore()), runner


def _admit(core: tuple[Router, asyncio.Runner], request: RouteRequest) -> None:
    router, runner = core
    errors = router.stats.internal_errors
    decision, attempt = runner.run(router.admit(request))
    assert router.stats.internal_errors == errors, f"placement raised for {request!r}"
    if decision.rejection is not None:
        assert decision.rejection.status == 400, decision.rejection
        assert decision.rejection.message
        assert attempt is None
    else:
        assert decision.endpoint in ("127.0.0.1:8001", "127.0.0.1:8002")
        assert attempt is not None
        assert math.isfinite(decision.predicted_ttft_s)
        attempt.finish(Outcome(OutcomeKind.COMPLETED, status=200))


@given(
    messages=CORE_MESSAGES,
    tools=st.none() | TOOLS,
    template_kwargs=st.none() | _maybe(st.dictionaries(TEXT, JSON, max_size=3)),
    add_generation_prompt=st.booleans(),
    continue_final_message=st.booleans(),
    add_special_tokens=st.none() | st.booleans(),
)
def test_router_admits_any_chat_as_placed_or_400(
    core: tuple[Router, asyncio.Runner],
    messages: list[Any],
    tools: Any,
    template_kwargs: Any,
    add_generation_prompt: bool,
    continue_final_message: bool,
    add_special_tokens: bool | None,
) -> None:
    request = RouteRequest(
        model=MODEL,
        messages=messages,
        tools=tools,
        chat_template_kwargs=template_kwargs,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        add_special_tokens=add_special_tokens,
    )
    _admit(core, request)


@given(
    prompt=PROMPT,
    add_special_tokens=st.none() | st.booleans(),
    max_tokens=st.none() | st.integers(0, 2**40) | HUGE_INTS.filter(lambda n: n >= 0),
)
def test_router_admits_any_completion_as_placed_or_400(
    core: tuple[Router, asyncio.Runner], prompt: Any, add_special_tokens: bool | None, max_tokens: int | None
) -> None:
    _admit(core, RouteRequest(model=MODEL, prompt=prompt, add_special_tokens=add_special_tokens, max_tokens=max_tokens))


@pytest.mark.parametrize("raw", DEEP_BODIES, ids=lambda raw: raw[:40].decode("latin-1"))
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_router_admits_hostile_bodies_as_the_envoy_service_reads_them(
    core: tuple[Router, asyncio.Runner], raw: bytes, path: str
) -> None:
    """What the Envoy service hands the core for each hostile body it parses (model set to the configured one)."""
    try:
        parsed = parse_body(raw.replace(b'"model": "m"', b'"model": "smollm2"'), path)
    except BadRequest:
        return
    request = parsed.route_request()
    _admit(core, request)
