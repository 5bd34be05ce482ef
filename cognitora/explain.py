"""``cognitora explain``: where would this prompt go right now, and why?

Reads the live store the config names (Redis at ``redis_url``), places the prompt exactly as a gateway would, and
prints the decision with every candidate's predicted TTFT. Nothing is dispatched or written. With no ``redis_url``
the store is a fresh in-process one, so the answer shows configuration and priors only; the output says so.

    cognitora explain --config cognitora.yaml --model smollm2 --prompt-file prompt.txt
    cognitora explain --config cognitora.yaml --model smollm2 --prompt-file chat.json --messages-json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from cognitora.config import DEFAULT_PRIORITY, CognitoraConfig, ConfigError, load_config
from cognitora.core.router import Router
from cognitora.decision import Decision
from cognitora.flow.margin import most_cautious
from cognitora.flow.redis_leases import RedisLeases
from cognitora.flow.snapshot import wait_explanation
from cognitora.redaction import redact_url
from cognitora.request import RouteRequest
from cognitora.token_agreement import TOKENIZE_ENGINES, engine_token_counts, mismatch_message
from kvstate.redis_store import RedisStore
from kvstate.store import StoreUnavailable

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cognitora explain",
        description="Where would this prompt go right now, and why? Reads the live store; writes nothing.",
    )
    parser.add_argument("--config", required=True, type=Path, help="cognitora.yaml")
    parser.add_argument("--model", required=True, help="the model name a client would send")
    parser.add_argument("--prompt-file", required=True, type=Path, help="the prompt text (or '-' for stdin)")
    parser.add_argument(
        "--messages-json",
        action="store_true",
        help="the prompt file is an OpenAI 'messages' list (or a request body with one), not plain text",
    )
    parser.add_argument("--priority", default=DEFAULT_PRIORITY, help="priority class (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=None, help="the request's max_tokens")
    parser.add_argument("--team", default=None, help="the caller's team (intent allow lists)")
    parser.add_argument("--user", default=None, help="the caller's user id (a weighted rewrite's sticky key)")
    parser.add_argument("--intent-hint", default=None, help="a trusted intent hint (intent rules' `hint`)")
    return parser


class _InputError(ValueError):
    pass


def _read_prompt(path: Path) -> str:
    if str(path) == "-":
        return sys.stdin.read()
    try:
        return path.read_text()
    except OSError as exc:
        raise _InputError(f"{path}: cannot read the prompt file ({exc.strerror or exc})") from None


def _messages(text: str, path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        example = '[{"role": "user", "content": "hi"}]'
        raise _InputError(f"{path}: expected a JSON list of messages like {example}")
    return data


async def explain(router: Router, request: RouteRequest) -> Decision:
    """Place ``request`` without dispatching it."""
    return await router.place(request)


async def wait_line(router: Router, request: RouteRequest, decision: Decision) -> str | None:
    """``would wait: N ahead in band 'X'; ...`` when flow control would hold ``request`` now, else None. This
    process has no queue of its own and times no request: what waits in the gateways' queues is read from the
    Redis leases' published depths (every live replica's, per band) when the store is Redis, else nobody is counted
    ahead; and it decides with the largest prediction margin the live replicas shared (``most_cautious``) when
    ``flow_control.leases`` is on, else (none shared, or Redis down) with its own, 1."""
    gate = router.flow
    flow = router.config.flow_control
    if gate is None or flow is None:
        return None
    store = router.store
    leases = RedisLeases(store.client, router.config.key_prefix, flow.leases) if isinstance(store, RedisStore) else None
    shared = None
    if leases is not None and flow.leases.enabled:
        try:
            shared = most_cautious(await leases.margins(), flow.margin.min_samples)
        except StoreUnavailable:
            shared = None
    why = gate.should_wait(request, decision, margin=None if shared is None else shared.factor)
    if why is None:
        return None
    depth: dict[str, int] = {}
    if leases is not None:
        try:
            depth = await leases.queued()
        except StoreUnavailable:
            depth = {}
    bands = gate.controller.waiting_by_band()  # every band, highest first
    names = list(bands)
    index = names.index(why.band)
    above = sum(depth.get(name, 0) for name in names[:index])
    if shared is None:
        margin, samples, replicas = gate.margin.factor, gate.margin.samples, 0
    else:
        margin, samples, replicas = shared.factor, shared.samples, shared.replicas
    return wait_explanation(
        why.band,
        depth.get(why.band, 0),
        above,
        why.saturation,
        why.max_wait_s,
        margin=margin,
        margin_samples=samples,
        margin_replicas=replicas,
    )


def describe_store(router: Router) -> str:
    url = router.config.redis_url
    if url is None:
        return "store: in-process and empty (no redis_url in the config): no cache or load state, priors only"
    kind = "Redis Cluster" if router.config.redis_cluster else "Redis"
    return f"store: {kind} {redact_url(url)} (key prefix {router.config.key_prefix!r})"


async def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        text = _read_prompt(args.prompt_file)
        messages = _messages(text, args.prompt_file) if args.messages_json else None
    except (ConfigError, _InputError) as exc:
        print(f"cognitora explain: {exc}", file=sys.stderr)
        return 2
    request = RouteRequest(
        model=args.model,
        messages=messages,
        prompt=None if messages is not None else text,
        priority=args.priority,
        max_tokens=args.max_tokens,
        team=args.team,
        user=args.user,
        intent_hint=args.intent_hint,
    )
    try:
        router = Router.from_config(config)  # loads each model's tokenizer and chat template
    except ConfigError as exc:
        print(f"cognitora explain: {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        decision = await explain(router, request)
        waits = await wait_line(router, request, decision)
    finally:
        await router.close()
    print(describe_store(router))
    if decision.keys:
        kind = "token-exact" if decision.exact_keys else "text-approximate"
        print(f"prompt: {decision.prompt_tokens} tokens, {len(decision.keys)} full blocks, {kind} keys")
    print(decision.explain())
    if waits is not None:
        print(waits)
    if decision.exact_keys and decision.rejection is None:
        await _print_tokenizer_check(config, decision, request)
    return 1 if decision.rejection is not None else 0


async def _print_tokenizer_check(config: CognitoraConfig, decision: Decision, request: RouteRequest) -> None:
    """The engines' own counts of this prompt beside the router's: a tokenizer or chat template that is not the
    engines' shows here before any traffic (the gateways report it per answer: cognitora.token_agreement)."""
    model = next((m for m in config.models if m.name == decision.model or decision.model in m.loras), None)
    if model is None:
        return
    servers = {e.id: e.url for e in model.endpoints if e.engine in TOKENIZE_ENGINES}
    if not servers:
        return
    text = request.prompt if isinstance(request.prompt, str) else None
    if request.messages is None and text is None:
        return
    counts = await engine_token_counts(servers, decision.model, messages=request.messages, prompt=text)
    for endpoint, count in counts.items():
        if isinstance(count, str):
            print(f"tokenizer check: {endpoint}: {count}")
        elif count == decision.prompt_tokens:
            print(f"tokenizer check: {endpoint} counts {count} prompt tokens, as the router does")
        else:
            print(f"tokenizer check: {mismatch_message(decision.model, endpoint, decision.prompt_tokens, count)}")


def main(argv: list[str]) -> int:
    """Exit status: 0 placed, 1 rejected (the reason is printed), 2 bad input."""
    args = build_parser().parse_args(argv)
    return asyncio.run(_run(args))
