"""``CognitoraRoutingStrategy``: LiteLLM's custom-strategy seam, translated to ``Router.place``.

Per attempt (LiteLLM calls the strategy again for each retry of a request):

1. LiteLLM's own ``async_get_healthy_deployments`` narrows the group (cooldowns, tags, ``order``, context window,
   team-only models); we keep all of that.
2. The healthy deployments with an ``api_base`` become the request's candidate endpoints; the core places the
   request among them and counts it as dispatched in the same step (``Router.admit``, grouped by LiteLLM's trace
   id so a retry finishes the attempts before it that no callback reported).
3. The strategy returns the deployment whose endpoint is the Decision's, or raises the LiteLLM error that matches
   a Rejection's status. The attempt's id goes into the request metadata for the callbacks
   (``litellm_plugin.hooks``), which translate LiteLLM's hooks onto the core's ``Attempt``.

A model group with no engine of the fleet (only hosted providers) is not Cognitora's to place: LiteLLM's default
(``simple-shuffle``) picks there, as it would without the plugin.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import litellm
from litellm.router_strategy.simple_shuffle import simple_shuffle
from litellm.types.router import CustomRoutingStrategyBase

from cognitora import jsonlog
from cognitora.config import CognitoraConfig, ConfigError
from cognitora.core.core import Prepared, prepare
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.decision import Rejection
from cognitora.intent import How, Rewrite
from cognitora.ops.reload import Commit
from cognitora.preflight import check_store, resolve_engines, unresolved_problems
from cognitora.request import InvalidRequest
from cognitora.surface_entry import SurfaceReader
from cognitora.tracing import process_tracing
from litellm_plugin import live
from litellm_plugin.fleet import Fleet, deployment_id, endpoint_id
from litellm_plugin.hooks import CognitoraCallbacks
from litellm_plugin.metrics import MetricsPages, MetricsSettings
from litellm_plugin.proxy import in_proxy
from litellm_plugin.runtime import CoreHost
from litellm_plugin.translate import (
    PLACEMENT_KEY,
    client_trace,
    rejection_error,
    responses_holder,
    route_request,
    set_engine_headers,
    set_prefill_endpoint,
    surface_path,
    trace_id,
    writable_metadata,
)

__all__ = ["CognitoraRoutingStrategy", "preflight"]

log = logging.getLogger("cognitora.litellm")


class CognitoraRoutingStrategy(CustomRoutingStrategyBase):
    """Handed to a ``litellm.Router`` whose ``routing_strategy`` is ``cognitora`` (``litellm_plugin.install``);
    ``litellm_plugin.strategy_for(router)`` returns it."""

    def __init__(
        self, router: Any, fleet: Fleet, host: CoreHost, callbacks: CognitoraCallbacks, pages: MetricsPages
    ) -> None:
        self.router = router
        self.fleet = fleet
        self.host = host
        self._callbacks = callbacks
        self._pages = pages
        self._managed_models = set(fleet.config.model_names())
        self._reloaded = live.ReloadedFleet()

    def watch_config(self, fleet_args: Mapping[str, Any], base_dir: Path | None) -> None:
        """Reload the config when the ``config:`` file the arguments name changes (``litellm_plugin.live``)."""
        source = live.config_source(self.router, fleet_args, base_dir, self._reloaded)
        if source is not None:
            self.host.reload = (source, self.prepare_reload)

    async def prepare_reload(self, config: CognitoraConfig) -> Commit:
        """``LiveRouter``'s adapter step: the new Fleet (deployment ids <-> endpoints) goes in force with it."""
        fleet = self._reloaded.take(config)
        if fleet is None:
            raise ConfigError("internal: the reloaded config came without its fleet")

        async def commit() -> None:
            self.fleet = fleet
            self._managed_models = set(config.model_names())
            self.host.config = config

        return commit

    @classmethod
    def for_fleet(
        cls,
        router: Any,
        fleet: Fleet,
        callbacks: CognitoraCallbacks,
        pages: MetricsPages,
        metrics_settings: MetricsSettings | None = None,
        in_process_collector: bool = False,
    ) -> CognitoraRoutingStrategy:
        """The strategy for ``router`` over ``fleet``, once the core's start-up checks pass (``preflight``), its
        attempts reported by ``callbacks`` and its page served by ``pages`` (the installed ``Plugin``'s).
        ``in_process_collector``: with Redis, this process feeds the store too (``collector: in_process``)."""
        if in_proxy():
            jsonlog.configure_guest()  # ours as JSON lines where the proxy shows them nowhere; never a secret
        else:
            jsonlog.redact_every_handler()  # an SDK script's logging is its own: only redacted
        prepared = preflight(fleet)
        host = CoreHost.for_current_context(fleet.config, prepared, in_process_collector, pace_gc=in_proxy())
        # Deduplicated by LiteLLM: one instance serves every Router in the process.
        litellm.logging_callback_manager.add_litellm_callback(callbacks)
        callbacks.watch(host)
        strategy = cls(router, fleet, host, callbacks, pages)
        pages.attach(host, metrics_settings or MetricsSettings())
        return strategy

    def close(self) -> None:
        self._pages.detach(self.host)
        self._callbacks.unwatch(self.host)
        self.host.close()

    # -- LiteLLM's seam ----------------------------------------------------------------------------------------
    async def async_get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if request_kwargs is None:
            request_kwargs = {}
        healthy = await self.router.async_get_healthy_deployments(
            model=model,
            request_kwargs=request_kwargs,
            messages=messages,
            input=input,
            specific_deployment=specific_deployment,
        )
        if isinstance(healthy, dict):
            return await self._named_deployment(healthy, messages, input, request_kwargs)
        return await self._choose(model, healthy, messages, input, request_kwargs)

    async def _named_deployment(
        self,
        named: dict[str, Any],
        messages: list[dict[str, str]] | None,
        input: str | list[Any] | None,
        request_kwargs: dict[str, Any],
    ) -> dict[str, Any]:
        """The client named a deployment id (``"model": "engine-2"``). For an engine of the fleet, that must not
        skip placement, counting and shedding: the request is placed in the deployment's model group, on the named
        engine only if the core allows this key to pin (``RouteRequest.pinned_endpoint``). For a cloud target
        (``cognitora_cloud``), it must not skip the burst policy: it goes there only if the core allows the key's
        team to name it (``burst.targets[].named_teams``), else it is placed like any request of its group."""
        group = str(named.get("model_name", ""))
        cloud = self.fleet.cloud_by_deployment.get(deployment_id(named))
        if cloud is not None:
            healthy = await self.router.async_get_healthy_deployments(
                model=group, request_kwargs=request_kwargs, messages=messages, input=input
            )
            group_list = [named] if isinstance(healthy, dict) or not healthy else list(healthy)
            return await self._choose(group, group_list, messages, input, request_kwargs, named_cloud=cloud)
        pinned = self._endpoint_of(named)
        if pinned is None or group not in self._managed_models:
            return named  # not one of the fleet's engines nor a cloud target: LiteLLM's own behaviour
        healthy = await self.router.async_get_healthy_deployments(
            model=group, request_kwargs=request_kwargs, messages=messages, input=input
        )
        if isinstance(healthy, dict) or not healthy:
            healthy = [named]
        elif all(self._endpoint_of(d) != pinned for d in healthy):
            healthy = [*healthy, named]
        return await self._choose(group, healthy, messages, input, request_kwargs, pinned=pinned)

    def get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        # LiteLLM's sync Router.completion: the same async path, run on the core's loop (a private thread when
        # the Router was built outside any loop), so sync and async share one core and one store connection.
        async def pick(_: Router) -> dict[str, Any]:
            return await self.async_get_available_deployment(
                model, messages, input, specific_deployment, request_kwargs
            )

        return self.host.call_sync(pick)

    # -- translation --------------------------------------------------------------------------------------------
    async def _choose(
        self,
        model: str,
        healthy: Sequence[dict[str, Any]],
        messages: list[dict[str, str]] | None,
        input: str | list[Any] | None,
        request_kwargs: dict[str, Any],
        pinned: str | None = None,
        named_cloud: str | None = None,
    ) -> dict[str, Any]:
        trace = trace_id(request_kwargs)

        group = str(healthy[0].get("model_name", model)) if healthy else model
        by_endpoint: dict[str, dict[str, Any]] = {}
        clouds: dict[str, dict[str, Any]] = {}
        for deployment in healthy:
            ep = self._endpoint_of(deployment)
            if ep is not None:
                by_endpoint.setdefault(ep, deployment)
            target = self.fleet.cloud_by_deployment.get(deployment_id(deployment))
            if target is not None:
                clouds.setdefault(target, deployment)
        if group not in self._managed_models or (not by_endpoint and named_cloud is None):
            # Not Cognitora's to place (no engine of the fleet here, or none healthy). A cloud target is never
            # picked here: only a cloud decision of the core sends a request to one (docs/burst.md, "Who reaches
            # the cloud"); a managed group left with only its cloud target is placed by the core below.
            others = [d for d in healthy if deployment_id(d) not in self.fleet.cloud_by_deployment]
            if others:
                return self._litellm_default(model, others, request_kwargs)
            if group not in self._managed_models:
                raise rejection_error(_CLOUD_ONLY, model)
        if messages is None and input is None and not request_kwargs:
            # LiteLLM's /v1/messages/count_tokens asks for a deployment with no request at all: nothing to place.
            # Refused, LiteLLM counts with its own tokenizer (an openai/ deployment would be asked at OpenAI's
            # /v1/responses/input_tokens, which vLLM does not serve: docs/litellm.md, "Surfaces").
            raise rejection_error(Rejection(400, "a token count is not placed (no request to place)"), model)
        reader = await self.host.call(_surface_reader) if surface_path(request_kwargs) is not None else None
        holder = responses_holder(request_kwargs)
        holder_endpoint = next(
            (ep for ep, d in by_endpoint.items() if holder is not None and deployment_id(d) == holder), None
        )
        try:
            req = route_request(
                group,
                messages,
                input,
                request_kwargs,
                list(by_endpoint),
                pinned_endpoint=pinned,
                burst_targets=list(clouds),
                named_cloud=named_cloud,
                reader=reader,
                holder=holder_endpoint,
            )
        except InvalidRequest as exc:
            raise rejection_error(Rejection(400, exc.message), model) from None
        if req.rewrite is None and self.fleet.config.intent is not None:
            # LiteLLM has chosen the model group: the core must not choose another model now (the proxy's pre-call
            # hook decides the rewrite, before the group is chosen; an SDK Router has no such hook).
            req = replace(req, rewrite=Rewrite(group, group, How.KEPT, detail=_NO_HOOK))
        traceparent, tracestate = client_trace(request_kwargs)
        with process_tracing("cognitora-litellm").decision(req, traceparent, tracestate) as span:
            decision, attempt = await self.host.call(lambda router: router.admit(req, group=trace))
            span.record(decision)
        if decision.rejection is not None or attempt is None:
            raise rejection_error(decision.rejection or _NO_PICK, model)
        # A burst goes to the group's cloud deployment (LiteLLM calls it with its own model name and api_key).
        chosen = by_endpoint.get(attempt.endpoint) if decision.cloud is None else clouds.get(decision.cloud.target)
        if chosen is None:
            attempt.finish(Outcome(OutcomeKind.FAILED, detail="placed outside LiteLLM's healthy deployments"))
            raise RuntimeError(
                f"cognitora placed {req.request_id} on {decision.endpoint!r}, which is not among LiteLLM's healthy "
                f"deployments {sorted(by_endpoint)}: a core bug, please report it with this message"
            )
        writable_metadata(request_kwargs)[PLACEMENT_KEY] = decision.request_id
        set_prefill_endpoint(request_kwargs, decision)
        set_engine_headers(request_kwargs, span.engine_headers())  # the engine continues the decision's trace
        return chosen

    def _endpoint_of(self, deployment: Mapping[str, Any]) -> str | None:
        known = self.fleet.endpoint_by_deployment.get(deployment_id(deployment))
        if known is not None:
            return known
        api_base = (deployment.get("litellm_params") or {}).get("api_base")
        # A deployment added after the strategy was built: usable only if its engine is one the core knows.
        if api_base:
            ep = endpoint_id(str(api_base))
            if self.fleet.config.endpoint(ep) is not None:
                return ep
        return None

    def _litellm_default(
        self, model: str, healthy: Sequence[dict[str, Any]], request_kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        chosen: dict[str, Any] = simple_shuffle(
            resolve_model_alias=self.router.get_model_from_alias,
            healthy_deployments=healthy,
            model=model,
            request_kwargs=request_kwargs,
        )
        return chosen


async def _surface_reader(router: Router) -> SurfaceReader:
    return router.surfaces


def preflight(fleet: Fleet) -> Prepared:
    """The core's start-up checks (``cognitora.preflight``), run when a Router installs the strategy, so the proxy
    does not start on a setup that cannot work: each model's tokenizer and chat template load and the rewrite policy
    (its file, the classifier and its extra) is fitted, all handed to the core that starts on the first request
    (``cognitora.core.core.prepare``); no engine is listed twice under two spellings, Redis accepts the password. An
    engine host that does not resolve, or a Redis that does not answer, is a warning: both are resolved and retried
    on every connection, and may come up after the proxy."""
    prepared = prepare(fleet.config)
    for problem in unresolved_problems(resolve_engines(fleet.config, fleet.endpoint_sources)):
        log.warning("%s; placing on it anyway (LiteLLM resolves the name on every connection)", problem)
    store_warning = check_store(fleet.config)
    if store_warning is not None:
        log.warning("%s", store_warning)
    return prepared


_NO_PICK = Rejection(503, "no endpoint was picked", 5)
_CLOUD_ONLY = Rejection(
    503, "this model group has only cloud targets, which only Cognitora's burst policy sends requests to", 5
)
_NO_HOOK = "no rewrite before LiteLLM chose the model group (it runs in the proxy's pre-call hook)"
