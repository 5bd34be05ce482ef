"""The diagnostic ``litellm-shuffle-logged`` target: LiteLLM's shuffle plus a callback on Cognitora's hooks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from litellm.integrations.custom_logger import CustomLogger

from bench.run_all import resolve_targets
from bench.targets import LoggedLiteLLMTarget
from litellm_plugin.callbacks import CognitoraCallbacks


def _overridden_hooks(cls: type) -> set[str]:
    return {
        name
        for name in vars(CustomLogger)
        if callable(getattr(CustomLogger, name))
        and not name.startswith("_")
        and getattr(cls, name) is not getattr(CustomLogger, name)
    }


def test_the_callback_is_written_beside_the_config_and_overrides_what_cognitoras_does(tmp_path: Path) -> None:
    target = LoggedLiteLLMTarget("m", tmp_path)
    cfg = target.config(type("Fleet", (), {"urls": ["http://127.0.0.1:1", "http://127.0.0.1:2"]})())
    assert cfg["router_settings"]["routing_strategy"] == "simple-shuffle"
    (name,) = cfg["litellm_settings"]["callbacks"]
    module, _, instance = name.rpartition(".")
    # LiteLLM resolves "module.instance" to <config dir>/module.py: the file must be there.
    spec = importlib.util.spec_from_file_location(module, tmp_path / f"{module}.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    callbacks = getattr(loaded, instance)
    assert isinstance(callbacks, CustomLogger)
    # It measures the cost of Cognitora's hooks being there: the same hooks, or the comparison means nothing.
    assert _overridden_hooks(type(callbacks)) == _overridden_hooks(CognitoraCallbacks)


def test_diagnostic_targets_are_run_by_name_only() -> None:
    assert "litellm-shuffle-logged" not in resolve_targets("all")
    assert resolve_targets("litellm-shuffle,litellm-shuffle-logged") == ["litellm-shuffle", "litellm-shuffle-logged"]
