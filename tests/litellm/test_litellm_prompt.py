"""What LiteLLM hands the strategy -> the client's own prompt fields in RouteRequest (the core reads them)."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from typing import Any

from litellm_plugin.fleet import build_fleet
from litellm_plugin.translate import route_request

TOOLS = [{"type": "function", "function": {"name": "refund"}}]


def via_proxy(body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return {"proxy_server_request": {"url": "http://proxy/v1/completions", "body": body}, **kwargs}


def test_a_text_completion_is_its_prompt_not_the_user_message_litellm_makes_of_it() -> None:
    # Router.atext_completion calls the strategy with messages=[{"role": "user", "content": prompt}].
    for prompt in ("once upon", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        req = route_request("chat", [{"role": "user", "content": prompt}], None, via_proxy({"prompt": prompt}), [])
        assert (req.messages, req.prompt) == (None, prompt)
    # Outside the proxy there is no body: token ids cannot be chat content, so they are still a prompt.
    req = route_request("chat", [{"role": "user", "content": [[1, 2], [3]]}], None, {}, [])
    assert (req.messages, req.prompt) == (None, [[1, 2], [3]])


def test_a_chat_keeps_its_messages_tools_and_vllm_fields() -> None:
    messages = [{"role": "user", "content": "hi"}]
    kwargs = {"tools": TOOLS, "extra_body": {"add_generation_prompt": False, "chat_template_kwargs": {"x": 1}}}
    req = route_request("chat", messages, None, kwargs, ["a:1"])
    assert (req.messages, req.prompt, req.tools) == (messages, None, TOOLS)
    assert (req.add_generation_prompt, req.chat_template_kwargs, req.add_special_tokens) == (False, {"x": 1}, None)
    body = {"messages": messages, "add_special_tokens": True}
    assert route_request("chat", messages, None, via_proxy(body, add_special_tokens=True), []).add_special_tokens


def test_input_is_passed_as_sent() -> None:
    assert route_request("emb", None, ["a", "b"], {}, []).prompt == ["a", "b"]  # not joined with newlines
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    assert route_request("resp", None, items, {}, []).messages == items  # Responses API message items


def test_a_lora_group_is_a_name_of_its_base_model() -> None:
    def dep(group: str, api_base: str, **info: Any) -> dict[str, Any]:
        params = {"model": f"hosted_vllm/{group}", "api_base": api_base}
        return {"model_name": group, "litellm_params": params, "model_info": {"id": f"{group}@{api_base}", **info}}

    fleet = build_fleet(
        [
            dep("base", "http://127.0.0.1:8001/v1", cognitora_loras=["sql"]),
            dep("base", "http://127.0.0.1:8002/v1", cognitora_loras=["sql"]),
            dep("sql", "http://127.0.0.1:8001/v1"),
        ],
        {},
    )
    base = fleet.config.model("sql")
    assert (
        base is not None
        and base.name == "base"
        and [e.id for e in base.endpoints]
        == [
            "127.0.0.1:8001",
            "127.0.0.1:8002",
        ]
    )
    assert fleet.endpoint_by_deployment["sql@http://127.0.0.1:8001/v1"] == "127.0.0.1:8001"
    assert fleet.config.model_names() == ["base", "sql"]
