"""Contract with vLLM 0.32's own code: its request models and conversions, and its answer models.

vLLM is imported in its own venv (``python -m cognitora_sim.harness.real_engines.provision`` builds it; a machine
that cannot fails here with the reason, never skips), by ``tests/core/vllm_contract_probe.py`` in one subprocess:

1. every request of tests/support/surface_cases.py, and bodies vLLM refuses, are converted by vLLM's own code
   (``AnthropicServingMessages.to_chat_completion_request``, ``construct_input_messages``/``construct_tool_dicts``,
   ``ChatCompletionRequest``) and by ``kvstate.surfaces``; what the chat template would see (the conversation in both
   content formats, the tools, the template variables, the generation flags) is compared as JSON text, key order
   included; a body vLLM refuses is refused here too;
2. the inline-system probe of vLLM's Messages endpoint answers as ``template_traits`` does;
3. every answer of the simulated engine on ``/v1/messages``, ``/v1/messages/count_tokens`` and ``/v1/responses``
   (JSON and each SSE event) validates against vLLM's pydantic model for it, and has the same field names and event
   sequence as a real vLLM's recorded answers (tests/data/vllm_streams).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cognitora_sim.harness.real_engines.provision import ProvisionError, provision
from cognitora_sim.launch import start_fleet
from kvstate.chat_template import ContentFormat, conversation, tool_schemas
from kvstate.prompt import ChatPrompt
from kvstate.surfaces import SurfaceError, TemplateTraits, read_surface
from tests.support.surface_cases import (
    EFFORT_TEMPLATE,
    SAME_CONVERSATIONS,
    SINGLE_SURFACE,
    SYSTEM,
    SYSTEM_FIRST_TEMPLATE,
    TOOLS_TEMPLATE,
)

PROBE = Path(__file__).parent / "vllm_contract_probe.py"
STREAMS = Path(__file__).parents[1] / "data" / "vllm_streams"
MODEL = "smollm2"

TRAITS = [
    TemplateTraits(merge_inline_system=False, disabled_thinking_effort="low"),
    TemplateTraits(merge_inline_system=True, disabled_thinking_effort="none"),
]

REFUSED = [
    ("messages", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
    ("messages", {"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
    ("messages", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]}),
    ("messages", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}),
    (
        "messages",
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference"}}]}],
        },
    ),
    ("messages", {"model": MODEL, "max_tokens": 5, "messages": [], "tools": [{"name": "f"}]}),
    (
        "messages",
        {"model": MODEL, "max_tokens": 900, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 1024}},
    ),
    (
        "responses",
        {"model": MODEL, "input": [{"type": "reasoning", "id": "r", "summary": [], "encrypted_content": "x"}]},
    ),
    ("responses", {"model": MODEL, "input": [{"type": "item_reference", "id": "x"}]}),
    ("responses", {"model": MODEL, "input": 42}),
    ("chat", {"model": MODEL, "messages": "hi"}),
]


def _cases() -> list[tuple[str, dict[str, Any]]]:
    cases: list[tuple[str, dict[str, Any]]] = []
    for conv in SAME_CONVERSATIONS:
        cases += [(s, conv.body(s)) for s in ("chat", "messages", "responses")]
    cases += [(c.surface, c.full_body()) for c in SINGLE_SURFACE]
    return cases


def _key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every field name of a JSON value, as paths (``usage.input_tokens``; lists as ``[]``)."""
    if isinstance(value, dict):
        out = set()
        for k, v in value.items():
            out |= {f"{prefix}.{k}"} | _key_paths(v, f"{prefix}.{k}")
        return out
    if isinstance(value, list):
        return set().union(*(_key_paths(v, f"{prefix}[]") for v in value)) if value else set()
    return set()


def _sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in data.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.strip().splitlines() if ": " in line)
        if "data" in lines:
            events.append((lines.get("event", ""), json.loads(lines["data"])))
    return events


def _collapsed(names: list[str]) -> list[str]:
    """Event names with runs of one name as one (a stream's delta count depends on its length)."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


@pytest.fixture(scope="module")
def sim_answers(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The simulated engine's answers: whole and streamed, Messages, count_tokens and Responses."""
    work = tmp_path_factory.mktemp("contract-sim")
    tokenizer = smollm2_dir / "tokenizer.json"
    with start_fleet(1, model=MODEL, tokenizer=tokenizer, time_scale=50, log_dir=work) as fleet:
        url = fleet.urls[0]
        ask = {"model": MODEL, "system": SYSTEM, "messages": [{"role": "user", "content": "Why twice?"}]}
        answers = {
            "messages": httpx.post(f"{url}/v1/messages", json={**ask, "max_tokens": 6}, timeout=30).json(),
            "count_tokens": httpx.post(f"{url}/v1/messages/count_tokens", json=ask, timeout=30).json(),
            "messages_sse": httpx.post(
                f"{url}/v1/messages", json={**ask, "max_tokens": 6, "stream": True}, timeout=30
            ).content,
        }
        ask_r = {"model": MODEL, "instructions": SYSTEM, "input": "Why twice?", "max_output_tokens": 6}
        answers["responses"] = httpx.post(f"{url}/v1/responses", json=ask_r, timeout=30).json()
        answers["responses_sse"] = httpx.post(f"{url}/v1/responses", json={**ask_r, "stream": True}, timeout=30).content
        yield answers


@pytest.fixture(scope="module")
def probe(sim_answers: dict[str, Any]) -> dict[str, Any]:
    try:
        install = provision(say=print)
    except ProvisionError as exc:
        pytest.fail(f"vLLM could not be provisioned on this machine: {exc}", pytrace=False)
    convert = [
        {
            "surface": s,
            "body": b,
            "merge_inline_system": t.merge_inline_system,
            "disabled_effort": t.disabled_thinking_effort,
        }
        for t in TRAITS
        for s, b in [*_cases(), *REFUSED]
    ]
    validate = [
        {"kind": "messages", "payload": sim_answers["messages"]},
        {"kind": "count_tokens", "payload": sim_answers["count_tokens"]},
        {"kind": "responses", "payload": sim_answers["responses"]},
        *({"kind": "messages_event", "payload": e} for _, e in _sse(sim_answers["messages_sse"])),
        *({"kind": "responses_event", "payload": e} for _, e in _sse(sim_answers["responses_sse"])),
    ]
    templates = [
        TOOLS_TEMPLATE,
        SYSTEM_FIRST_TEMPLATE,
        EFFORT_TEMPLATE,
        "{% generation %}{{ messages }}{% endgeneration %}",
    ]
    job = {"convert": convert, "validate": validate, "merge_probe": templates}
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    done = subprocess.run(
        [str(install.python), str(PROBE)], input=json.dumps(job), capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    result["job"] = job
    return result


def _seen_by_template(prompt: ChatPrompt, fmt: ContentFormat) -> str:
    return json.dumps(conversation(prompt.messages, fmt))


def test_every_request_converts_to_what_vllm_renders(probe: dict[str, Any]) -> None:
    checked = 0
    for case, theirs in zip(probe["job"]["convert"], probe["convert"], strict=True):
        traits = TemplateTraits(case["merge_inline_system"], case["disabled_effort"])
        where = f"{case['surface']} {json.dumps(case['body'])[:150]} {traits}"
        if "refused" in theirs:
            with pytest.raises(SurfaceError):
                read_surface(case["surface"], case["body"], traits=traits)
            continue
        ours = read_surface(case["surface"], case["body"], traits=traits).chat
        assert ours is not None, where
        vllm_prompt = ChatPrompt(theirs["messages"])
        for fmt in ("string", "openai"):
            assert _seen_by_template(ours, fmt) == _seen_by_template(vllm_prompt, fmt), where  # type: ignore[arg-type]
        assert json.dumps(tool_schemas(ours.tools)) == json.dumps(theirs["tools"]), where
        kwargs = dict(theirs["kwargs"])
        assert kwargs.pop("add_generation_prompt", True) == ours.add_generation_prompt, where
        assert kwargs.pop("continue_final_message", False) == ours.continue_final_message, where
        assert kwargs == dict(ours.chat_template_kwargs or {}), where
        checked += 1
    assert checked == len(TRAITS) * len(_cases())


def test_the_inline_system_probe_answers_as_vllm_s(probe: dict[str, Any]) -> None:
    from kvstate.chat_template import ChatTemplate
    from kvstate.surfaces import template_traits

    ours = [template_traits(ChatTemplate(source)).merge_inline_system for source in probe["job"]["merge_probe"]]
    assert ours == probe["merge_probe"] == [False, True, False, True]


def test_the_sim_s_answers_validate_against_vllm_s_models(probe: dict[str, Any]) -> None:
    failures = [(v["kind"], err) for v, err in zip(probe["job"]["validate"], probe["validate"], strict=True) if err]
    assert not failures
    assert len(probe["validate"]) > 10


@pytest.mark.parametrize("surface", ["messages", "responses"])
def test_the_sim_s_answers_have_a_real_vllm_s_fields_and_event_sequence(
    surface: str, sim_answers: dict[str, Any]
) -> None:
    real_json = json.loads((STREAMS / f"{surface}_cached.json").read_text())
    assert _key_paths(sim_answers[surface]) == _key_paths(real_json)
    real, sim = _sse((STREAMS / f"{surface}_cached.sse").read_bytes()), _sse(sim_answers[f"{surface}_sse"])
    assert _collapsed([n for n, _ in sim]) == _collapsed([n for n, _ in real])
    real_fields = {n: _key_paths(e) for n, e in real}
    for name, event in sim:
        assert name == event["type"]
        assert _key_paths(event) == real_fields[name], name
    if surface == "responses":
        assert [e["sequence_number"] for _, e in sim] == list(range(len(sim)))


def test_count_tokens_has_a_real_vllm_s_fields(sim_answers: dict[str, Any]) -> None:
    assert _key_paths(sim_answers["count_tokens"]) == {
        ".input_tokens",
        ".context_management",
        ".context_management.original_input_tokens",
    }
