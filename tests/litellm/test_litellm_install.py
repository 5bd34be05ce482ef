"""``litellm_plugin.install()``: nothing happens on import; installing changes exactly two things in LiteLLM (the
strategy name and ``Router.routing_strategy_init``), which ``uninstall()`` puts back; the proxy's documented
callback line installs it; a Router's strategy is public state (``strategy_for``).

Checks that uninstall run in a fresh interpreter: the other LiteLLM tests of this session hold the installed plugin.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: skip the cost-map download retries

import json
import logging
import subprocess
import sys
from typing import Any

import litellm
import pytest

import litellm_plugin
from litellm_plugin.strategy import CognitoraRoutingStrategy
from tests.conftest import ROOT

ENGINES = [
    {
        "model_name": "chat",
        "litellm_params": {"model": "hosted_vllm/smollm2", "api_base": f"http://127.0.0.1:{port}/v1"},
        "model_info": {"id": name},
    }
    for name, port in (("a", 8001), ("b", 8002))
]

# LiteLLM's state the plugin could touch, as a comparable value (run in a fresh interpreter).
SNAPSHOT = """
import json, litellm
from litellm.router_utils import routing_groups
def snapshot():
    return {
        "names": list(routing_groups.VALID_ROUTING_STRATEGIES),
        "router_methods": {k: id(v) for k, v in vars(litellm.Router).items() if callable(v)},
        "valid_args": litellm.Router.get_valid_args(),
        # the plugin's own (a Router adds callbacks of its own to these lists)
        "callbacks": [repr(c) for name in ("callbacks", "success_callback", "failure_callback",
                      "_async_success_callback", "_async_failure_callback", "input_callback")
                      for c in getattr(litellm, name) or [] if type(c).__module__.startswith("litellm_plugin")],
    }
"""


def _run(script: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", SNAPSHOT + script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_importing_the_plugin_changes_nothing_in_litellm() -> None:
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys, litellm_plugin; print('litellm' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert fresh.stdout.strip() == "False"  # `import litellm_plugin` does not even import LiteLLM

    out = _run(
        "before = snapshot()\n"
        "import litellm_plugin, litellm_plugin.callbacks, litellm_plugin.strategy, litellm_plugin.metrics\n"
        "import litellm_plugin.register, litellm_plugin.runtime, litellm_plugin.translate, litellm_plugin.auth\n"
        "print(json.dumps({'same': snapshot() == before, 'installed': litellm_plugin.installed() is not None}))\n"
    )
    assert out == {"same": True, "installed": False}


def test_install_changes_the_name_and_one_router_method_and_uninstall_puts_both_back() -> None:
    out = _run(
        f"ENGINES = {ENGINES!r}\n"
        "before = snapshot()\n"
        "import litellm_plugin\n"
        "plugin = litellm_plugin.install()\n"
        "during = snapshot()\n"
        "again = litellm_plugin.install() is plugin\n"
        "router = litellm.Router(model_list=ENGINES, routing_strategy='cognitora')\n"
        "had = litellm_plugin.strategy_for(router) is not None\n"
        "litellm_plugin.uninstall()\n"
        "after = snapshot()\n"
        "try:\n"
        "    litellm.Router(model_list=ENGINES, routing_strategy='cognitora')\n"
        "    refused = ''\n"
        "except ValueError as exc:\n"
        "    refused = str(exc)\n"
        "changed = sorted(k for k in before['router_methods'] if before['router_methods'][k] != "
        "during['router_methods'][k])\n"
        "print(json.dumps({'changed': changed, 'names': during['names'][len(before['names']):],\n"
        "    'args_same': during['valid_args'] == before['valid_args'], 'again': again, 'had': had,\n"
        "    'restored': after == before, 'left': litellm_plugin.strategy_for(router) is None, 'refused': refused}))\n"
    )
    assert out["changed"] == ["routing_strategy_init"]  # Router.__init__ and update_settings stay LiteLLM's own
    assert out["names"] == ["cognitora"]
    assert out["args_same"] and out["again"] and out["had"]
    assert out["restored"] and out["left"]  # the Router falls back to LiteLLM's default choice
    assert out["refused"].startswith("Invalid routing_strategy: 'cognitora'")


def test_the_documented_callback_line_installs_the_plugin() -> None:
    # The proxy resolves `litellm_settings.callbacks` entries with get_instance_fn before it builds its Router.
    out = _run(
        "from litellm.proxy.types_utils.utils import get_instance_fn\n"
        "import litellm_plugin\n"
        "before = litellm_plugin.installed() is None\n"
        "instance = get_instance_fn('litellm_plugin.callbacks.cognitora')\n"
        "plugin = litellm_plugin.installed()\n"
        "print(json.dumps({'before': before, 'same': plugin is not None and instance is plugin.callbacks,\n"
        "    'name': 'cognitora' in snapshot()['names']}))\n"
    )
    assert out == {"before": True, "same": True, "name": True}


def test_a_router_named_cognitora_gets_the_strategy_and_loses_it_on_a_switch() -> None:
    plugin = litellm_plugin.install()
    assert litellm_plugin.install() is plugin
    args = {"scrape": {"interval_s": 0.5}}
    router = litellm.Router(model_list=ENGINES, routing_strategy="cognitora", routing_strategy_args=args)
    first = litellm_plugin.strategy_for(router)
    try:
        assert isinstance(first, CognitoraRoutingStrategy) and first in plugin.strategies()
        assert first.fleet.config.scrape.interval_s == 0.5
        router.update_settings(routing_strategy="simple-shuffle")
        assert litellm_plugin.strategy_for(router) is None and first not in plugin.strategies()
        router.update_settings(routing_strategy="cognitora")  # back, with the Router's own args
        second = litellm_plugin.strategy_for(router)
        assert isinstance(second, CognitoraRoutingStrategy) and second is not first
        assert second.fleet.config.scrape.interval_s == 0.5
    finally:
        router.update_settings(routing_strategy="simple-shuffle")
    assert litellm_plugin.strategy_for(router) is None


async def test_a_switch_on_the_routers_own_loop_stops_its_collector_before_it_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Router built in a running loop (the proxy's) runs the core on that loop, where a switch's synchronous
    close cannot await the core's close: it was left to a task, and the in-process collector's thread went on
    collecting, and logged "collector stopped" after the strategy (in CI, the test) was gone."""
    litellm_plugin.install()
    router = litellm.Router(model_list=ENGINES, routing_strategy="cognitora", routing_strategy_args={})
    strategy = litellm_plugin.strategy_for(router)
    assert isinstance(strategy, CognitoraRoutingStrategy)

    async def nothing(_: Any) -> None:
        return None

    try:
        await strategy.host.call(nothing)  # the core starts, and with it the collector's thread
        caplog.set_level(logging.INFO, logger="cognitora.collector")
        router.update_settings(routing_strategy="simple-shuffle")
        assert "collector stopped" in [r.getMessage() for r in caplog.records]
    finally:
        router.update_settings(routing_strategy="simple-shuffle")


def test_a_bad_strategy_name_is_still_litellms_error_and_keeps_the_strategy() -> None:
    litellm_plugin.install()
    router = litellm.Router(model_list=ENGINES, routing_strategy="cognitora")
    try:
        with pytest.raises(ValueError, match="Invalid routing_strategy: 'cognitoria'"):
            router.update_settings(routing_strategy="cognitoria")
        assert litellm_plugin.strategy_for(router) is not None
    finally:
        router.update_settings(routing_strategy="simple-shuffle")
