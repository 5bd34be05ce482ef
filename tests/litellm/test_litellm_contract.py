"""Contract tests: the LiteLLM internals litellm_plugin relies on, each failing with WHAT moved and where to look.

They hold for the whole tested range, the ``litellm`` extra's (``make test`` runs them on its oldest and its newest
version). When one fails after an upgrade, read docs/litellm.md, section "What breaks on upgrade", before touching
the plugin.
No engines and no network: deployments answer with LiteLLM's own ``mock_response``, or a refused port.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: skip the cost-map download retries

import asyncio
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import litellm
import pytest
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

import litellm_plugin
from cognitora.core.outcome import OutcomeKind
from cognitora_sim.harness.process import free_port
from litellm_plugin.translate import failure_outcome

SEE = "see docs/litellm.md ('What breaks on upgrade')"


def _params(fn: Any) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _requires(condition: bool, what_moved: str) -> None:
    if not condition:
        pytest.fail(f"{what_moved}; {SEE}", pytrace=False)


def test_installed_litellm_is_in_the_tested_range() -> None:
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    from cognitora.distribution import DISTRIBUTION
    from litellm_plugin.register import SUPPORTED_LITELLM

    extra = [Requirement(r) for r in requires(DISTRIBUTION) or [] if Requirement(r).name == "litellm" and "extra" in r]
    assert [str(r.specifier) for r in extra] == [str(Requirement(f"litellm{SUPPORTED_LITELLM}").specifier)], (
        f"the installed {DISTRIBUTION}'s litellm extra {[str(r) for r in extra]} is not "
        f"litellm_plugin.register.SUPPORTED_LITELLM ({SUPPORTED_LITELLM}): change both together"
    )
    _requires(
        extra[0].specifier.contains(version("litellm")),
        f"litellm {version('litellm')} is installed, outside the tested range {SUPPORTED_LITELLM} "
        "(pyproject extra 'litellm')",
    )


def test_strategy_names_are_a_module_global_read_at_call_time() -> None:
    try:
        from litellm.router_utils import routing_groups
    except ImportError:
        pytest.fail(
            "litellm.router_utils.routing_groups is gone: LiteLLM >= 1.110 moved it to "
            f"litellm.litellm_core_utils.routing_groups and added Router.register_plugin; {SEE}",
            pytrace=False,
        )
    _requires(
        hasattr(routing_groups, "VALID_ROUTING_STRATEGIES"),
        "litellm.router_utils.routing_groups.VALID_ROUTING_STRATEGIES is gone: LiteLLM >= 1.110 moved strategies "
        "to Router.register_plugin",
    )
    litellm_plugin.install()
    _requires(
        "cognitora" in routing_groups.VALID_ROUTING_STRATEGIES,
        "install() could not add 'cognitora' to VALID_ROUTING_STRATEGIES",
    )
    try:
        routing_groups.validate_routing_strategy("cognitora")
    except ValueError:
        pytest.fail(
            "validate_routing_strategy no longer reads VALID_ROUTING_STRATEGIES at call time "
            f"(litellm/router_utils/routing_groups.py); {SEE}",
            pytrace=False,
        )


def test_install_keeps_the_router_argument_list_the_proxy_reads() -> None:
    # The proxy passes only router_settings keys found by getfullargspec(Router.__init__): a wrapper that hides
    # the signature makes it drop every router setting silently (routing_strategy included). install() leaves
    # __init__ alone; this keeps it so.
    litellm_plugin.install()
    valid = litellm.Router.get_valid_args()
    for key in ("model_list", "routing_strategy", "routing_strategy_args", "num_retries", "fallbacks"):
        _requires(
            key in valid,
            f"Router.get_valid_args() lacks {key!r} after install(): a wrapper hid the signature, or "
            "LiteLLM renamed the argument (litellm/router.py Router.__init__)",
        )
    argspec = inspect.getfullargspec(litellm.Router.__init__)
    _requires(len(argspec.args) + len(argspec.kwonlyargs) > 20, "Router.__init__ argspec collapsed to *args/**kwargs")


def test_a_router_takes_its_strategy_in_routing_strategy_init() -> None:
    # install() wraps Router.routing_strategy_init, the one method through which a Router takes a strategy: from
    # __init__ (once its model list and cache exist) and from update_settings on a strategy change.
    _requires(
        _params(litellm.Router.routing_strategy_init) == ["routing_strategy", "routing_strategy_args"],
        "Router.routing_strategy_init changed its parameters (litellm/router.py): update "
        "litellm_plugin.register._bind_seam_args",
    )
    init = inspect.getsource(litellm.Router.__init__)
    takes_at = init.find("self.routing_strategy_init(")
    _requires(
        -1 < init.find("self.set_model_list(model_list)") < takes_at and -1 < init.find("self.cache = ") < takes_at,
        "Router.__init__ no longer calls routing_strategy_init after setting its model list and cache: the "
        "Cognitora strategy would be built without the fleet (litellm_plugin.register, module docstring)",
    )
    switch = inspect.getsource(litellm.Router._switch_routing_strategy)
    update = inspect.getsource(litellm.Router.update_settings)
    _requires(
        "self.routing_strategy_init(" in switch and "self._switch_routing_strategy(" in update,
        "Router.update_settings no longer takes a new strategy through routing_strategy_init: switching to or from "
        "cognitora at runtime would go unnoticed",
    )
    reset = inspect.getsource(litellm.Router.routing_strategy_init)
    _requires(
        "self._reset_custom_routing_strategy()" in reset,
        "Router.routing_strategy_init no longer drops a custom strategy first: review "
        "litellm_plugin.register.Plugin._took_strategy",
    )


def test_custom_strategy_seam() -> None:
    _requires(
        hasattr(litellm.Router, "set_custom_routing_strategy"),
        "Router.set_custom_routing_strategy is gone (LiteLLM >= 1.110: Router.register_plugin)",
    )
    expected = ["model", "messages", "input", "specific_deployment", "request_kwargs"]
    for name in ("async_get_available_deployment", "get_available_deployment"):
        _requires(
            _params(getattr(CustomRoutingStrategyBase, name)) == expected,
            f"litellm.types.router.CustomRoutingStrategyBase.{name} no longer takes {expected}",
        )
    _requires(
        _params(litellm.Router.async_get_healthy_deployments)[:5]
        == ["model", "request_kwargs", "messages", "input", "specific_deployment"],
        "Router.async_get_healthy_deployments changed its parameters (LiteLLM >= 1.110: Router.select(kind='healthy'))",
    )
    from litellm.router_strategy import simple_shuffle

    # The strategy hands model groups without engines to simple_shuffle with the Router's public alias resolver
    # (before 1.106 only the private _get_model_from_alias existed: 1.104 and 1.105 failed there, at a request).
    _requires(
        callable(getattr(litellm.Router, "get_model_from_alias", None)),
        "Router.get_model_from_alias is gone (the strategy passes it to simple_shuffle)",
    )
    _requires(
        _params(simple_shuffle.simple_shuffle)
        == ["resolve_model_alias", "healthy_deployments", "model", "request_kwargs"],
        "litellm.router_strategy.simple_shuffle.simple_shuffle changed its parameters (used for model groups "
        "without engines)",
    )


def test_callback_hooks_exist_with_the_parameters_used() -> None:
    hooks = {
        "async_post_call_failure_deployment_hook": ["request_data", "exception", "call_type", "fallback_depth"],
        "async_post_call_success_deployment_hook": ["request_data", "response", "call_type"],
        "async_log_success_event": ["kwargs", "response_obj", "start_time", "end_time"],
        "async_log_failure_event": ["kwargs", "response_obj", "start_time", "end_time"],
        "log_success_event": ["kwargs", "response_obj", "start_time", "end_time"],
        "log_failure_event": ["kwargs", "response_obj", "start_time", "end_time"],
    }
    for name, params in hooks.items():
        _requires(
            hasattr(CustomLogger, name) and _params(getattr(CustomLogger, name)) == params,
            f"CustomLogger.{name}{tuple(params)} moved or changed (litellm/integrations/custom_logger.py)",
        )
    _requires(
        hasattr(litellm, "logging_callback_manager")
        and hasattr(litellm.logging_callback_manager, "add_litellm_callback"),
        "litellm.logging_callback_manager.add_litellm_callback is gone",
    )


def test_rate_limit_error_carries_headers_and_no_retry() -> None:
    params = _params(litellm.RateLimitError.__init__)
    for p in ("headers", "num_retries", "category"):
        _requires(p in params, f"litellm.RateLimitError.__init__ lost {p!r} (litellm/exceptions.py)")
    err = litellm.RateLimitError("x", "cognitora", "m", headers={"retry-after": "3"}, num_retries=0)
    _requires(err.headers == {"retry-after": "3"} and err.status_code == 429, "RateLimitError drops its headers")


def _proxy_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"{module} is not installed"
    return Path(spec.origin).read_text()


def test_proxy_loads_callbacks_before_it_builds_the_router() -> None:
    # Read, not imported: importing the proxy costs ~10 s. The e2e test runs the real proxy.
    source = _proxy_source("litellm.proxy.proxy_server")
    callbacks_at = source.find('key == "callbacks"')
    router_at = source.find("router = litellm.Router(\n            **router_params")
    _requires(
        callbacks_at != -1 and router_at != -1 and callbacks_at < router_at,
        "litellm/proxy/proxy_server.py no longer imports litellm_settings.callbacks before building the Router "
        "(load_config): the callback line cannot install the plugin in time; use "
        "LITELLM_WORKER_STARTUP_HOOKS=litellm_plugin.register:bootstrap",
    )


def test_proxy_strips_client_supplied_identity() -> None:
    # Team and key identity are read from user_api_key_* metadata: only safe because the proxy strips those keys
    # from the client's metadata before writing the authenticated ones.
    source = _proxy_source("litellm.proxy.litellm_pre_call_utils")
    _requires(
        'k.startswith("user_api_key_")' in source
        and "user_api_key_team_id=user_api_key_dict.team_id" in source
        and '["user_api_key_metadata"] = strip_callback_config(user_api_key_dict.metadata)' in source,
        "litellm/proxy/litellm_pre_call_utils.py no longer strips client-sent user_api_key_* metadata, or no "
        "longer writes user_api_key_team_id / user_api_key_metadata (cognitora_priority) from the authenticated "
        "key: identity and priority could be forged",
    )


# -- behaviour of the router around a custom strategy ------------------------------------------------------------


class _Recorder(CustomLogger):
    def __init__(self, events: list[tuple[str, ...]]) -> None:
        super().__init__()
        self.events = events

    async def async_post_call_failure_deployment_hook(
        self, request_data: Any, exception: Exception, call_type: Any, fallback_depth: int | None = None
    ) -> None:
        self.events.append(("failed", str(request_data.get("metadata", {}).get("attempt")), type(exception).__name__))
        self.last_error = exception

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        meta = kwargs["litellm_params"]["metadata"]
        self.events.append(("ok", str(meta.get("attempt")), str(response_obj.usage.prompt_tokens)))


class _FirstRefusedThenFine(CustomRoutingStrategyBase):
    """Picks the refused deployment first, then the working one, writing an attempt id into the metadata."""

    def __init__(self, router: litellm.Router, events: list[tuple[str, ...]]) -> None:
        self.router = router
        self.events = events
        self.n = 0

    async def async_get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: Any = None,
        input: Any = None,
        specific_deployment: Any = False,
        request_kwargs: Any = None,
    ) -> Any:
        healthy = await self.router.async_get_healthy_deployments(
            model=model, request_kwargs=request_kwargs, messages=messages, input=input
        )
        self.n += 1
        request_kwargs["metadata"]["attempt"] = str(self.n)
        team = request_kwargs["metadata"].get("user_api_key_team_id")
        self.events.append(("pick", str(self.n), str(team), str(request_kwargs.get("litellm_trace_id") is not None)))
        by_id = {d["model_info"]["id"]: d for d in healthy}
        return by_id["refused"] if self.n == 1 else by_id["fine"]


def _model_list() -> list[dict[str, Any]]:
    return [
        {
            "model_name": "m",
            "litellm_params": {"model": "openai/x", "api_base": f"http://127.0.0.1:{free_port()}/v1", "api_key": "k"},
            "model_info": {"id": "refused"},
        },
        {
            "model_name": "m",
            "litellm_params": {
                "model": "openai/x",
                "api_base": "http://127.0.0.1:9/v1",
                "api_key": "k",
                "mock_response": "hello",
            },
            "model_info": {"id": "fine", "cognitora_engine": "vllm"},
        },
    ]


async def test_failure_hook_runs_before_the_retry_reenters_the_strategy() -> None:
    events: list[tuple[str, ...]] = []
    recorder = _Recorder(events)
    litellm.logging_callback_manager.add_litellm_callback(recorder)
    try:
        router = litellm.Router(model_list=_model_list(), num_retries=2)
        _requires(
            router.get_deployment("fine") is not None
            and router.get_deployment("fine").model_info.get("cognitora_engine") == "vllm",  # type: ignore[union-attr]
            "model_info cognitora_* keys no longer survive Router deployment validation (types/router.py ModelInfo)",
        )
        router.set_custom_routing_strategy(_FirstRefusedThenFine(router, events))
        response = await router.acompletion(
            model="m", messages=[{"role": "user", "content": "hi"}], metadata={"user_api_key_team_id": "t1"}
        )
        assert response.choices[0].message.content == "hello"
        await _wait_for(lambda: any(e[0] == "ok" for e in events))
    finally:
        litellm.callbacks.remove(recorder)
    kinds = [e[:2] for e in events]
    _requires(
        kinds == [("pick", "1"), ("failed", "1"), ("pick", "2"), ("ok", "2")],
        f"attempt order is {kinds}: async_post_call_failure_deployment_hook must be awaited before LiteLLM's retry "
        "calls the strategy again (litellm/utils.py wrapper_async), with the strategy's metadata visible to it",
    )
    _requires(events[0][2] == "t1", "request_kwargs['metadata'] no longer carries the caller's metadata")
    _requires(events[0][3] == "True", "request_kwargs no longer carries litellm_trace_id (Router)")
    outcome = failure_outcome(recorder.last_error)
    _requires(
        outcome.kind is OutcomeKind.CONNECT_FAILED,
        f"a refused connection now surfaces as {type(recorder.last_error).__name__}: {recorder.last_error}; "
        "update litellm_plugin.translate.failure_outcome",
    )


class _Refuses(CustomRoutingStrategyBase):
    def __init__(self) -> None:
        self.calls = 0

    async def async_get_available_deployment(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.calls += 1
        raise litellm.RateLimitError("full", "cognitora", "m", num_retries=0, headers={"retry-after": "2"})


async def test_a_refusal_with_num_retries_zero_is_not_retried() -> None:
    router = litellm.Router(model_list=_model_list(), num_retries=3)
    strategy = _Refuses()
    router.set_custom_routing_strategy(strategy)
    with pytest.raises(litellm.RateLimitError):
        await router.acompletion(model="m", messages=[{"role": "user", "content": "hi"}])
    _requires(
        strategy.calls == 1,
        f"the strategy was called {strategy.calls} times: Router.async_function_with_retries no longer honours "
        "the exception's num_retries (litellm/router.py)",
    )


def test_update_settings_resets_a_custom_strategy() -> None:
    router = litellm.Router(model_list=_model_list())
    router.set_custom_routing_strategy(_Refuses())
    _requires("async_get_available_deployment" in vars(router), "set_custom_routing_strategy sets no attribute")
    router.update_settings(routing_strategy="least-busy")
    _requires(
        "async_get_available_deployment" not in vars(router),
        "update_settings(routing_strategy=...) no longer resets a custom strategy (_reset_custom_routing_strategy)",
    )


async def _wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.02)


def _function_source(source: str, header: str) -> str:
    """The text of the function starting at ``header`` in ``source`` (up to the next def at its indentation)."""
    start = source.find(header)
    if start == -1:
        return ""
    indent = header[: len(header) - len(header.lstrip())]
    end = source.find(f"\n{indent}async def ", start + 1)
    other = source.find(f"\n{indent}def ", start + 1)
    ends = [e for e in (end, other) if e != -1]
    return source[start : min(ends) if ends else len(source)]


def test_proxy_workers_inherit_the_worker_count() -> None:
    # proxy.proxy_workers reads NUM_WORKERS: embedded mode under --num_workers > 1 is refused from it.
    source = _proxy_source("litellm.proxy.proxy_cli")
    set_at = source.find('os.environ["NUM_WORKERS"] = str(num_workers)')
    start_at = source.find("uvicorn.run(")
    _requires(
        set_at != -1 and start_at != -1 and set_at < start_at,
        "litellm/proxy/proxy_cli.py no longer sets os.environ['NUM_WORKERS'] to --num_workers before it starts the "
        "workers: update litellm_plugin.proxy.proxy_workers (embedded mode under several workers goes unnoticed)",
    )


def test_proxy_names_its_config_file_before_it_builds_the_router() -> None:
    # proxy.litellm_config_dir reads proxy_server.user_config_file_path: inline relative paths hang on it.
    source = _proxy_source("litellm.proxy.proxy_server")
    from_file = _function_source(source, "    async def _get_config_from_file(")
    get_config = _function_source(source, "    async def get_config(")
    load_config = _function_source(source, "    async def load_config(")
    _requires(
        "user_config_file_path = config_file_path" in from_file
        and "self._get_config_from_file(config_file_path=config_file_path)" in get_config
        and -1
        < load_config.find("await self.get_config(config_file_path=config_file_path)")
        < load_config.find("router = litellm.Router(\n            **router_params"),
        "litellm/proxy/proxy_server.py no longer records user_config_file_path before load_config builds the Router: "
        "update litellm_plugin.proxy.litellm_config_dir (relative paths would fall back to the proxy's cwd)",
    )


def test_proxy_resolves_os_environ_in_router_settings_and_an_unset_one_is_null() -> None:
    # fleet._refuse_nulls rests on both: the args reach the strategy resolved, an unset variable as None.
    from litellm.secret_managers.main import get_secret

    source = _proxy_source("litellm.proxy.proxy_server")
    get_config = _function_source(source, "    async def get_config(")
    _requires(
        "config = self._check_for_os_environ_vars(config=config)" in get_config,
        "litellm/proxy/proxy_server.py get_config no longer resolves os.environ/ in the whole config: "
        "routing_strategy_args may now reach the strategy unresolved (build_fleet resolves them then)",
    )
    os.environ.pop("COGNITORA_CONTRACT_UNSET", None)
    _requires(
        get_secret("os.environ/COGNITORA_CONTRACT_UNSET") is None,
        "litellm.secret_managers.main.get_secret no longer returns None for an unset os.environ/NAME: "
        "review litellm_plugin.fleet._refuse_nulls",
    )


def test_the_proxy_app_takes_routes_and_guards_only_metrics_paths() -> None:
    # litellm_plugin.metrics adds /cognitora/metrics to proxy_server.app after start-up, as LiteLLM's own
    # Prometheus callback mounts its page there; LiteLLM's key check on metrics covers /metrics and /metrics/*.
    source = _proxy_source("litellm.proxy.proxy_server")
    prometheus = _proxy_source("litellm.integrations.prometheus")
    guard = _proxy_source("litellm.proxy.middleware.prometheus_auth_middleware")
    _requires(
        "\napp = FastAPI(" in source
        and "from litellm.proxy.proxy_server import app" in prometheus
        and 'app.mount("/metrics", metrics_app)' in prometheus,
        "litellm/proxy/proxy_server.py no longer exposes its FastAPI app as `app` (or its Prometheus callback mounts "
        "elsewhere): update litellm_plugin.metrics.MetricsPages._add_proxy_route, or use "
        "routing_strategy_args.metrics_listen",
    )
    _requires(
        '_METRICS_MOUNT: Final = "/metrics"' in guard,
        "LiteLLM's PrometheusAuthMiddleware guards other paths than /metrics: check that /cognitora/metrics is still "
        "outside it (docs/metrics.md says no key is asked for)",
    )
