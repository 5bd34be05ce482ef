"""Engine kind -> ``EngineSpec``. Registering a kind twice is an error, never a silent overwrite."""

from __future__ import annotations

from collections.abc import Iterable

from kvstate.engines.base import EngineSpec

__all__ = ["DuplicateEngineError", "EngineRegistry", "UnknownEngineError", "builtin_engines"]


class DuplicateEngineError(ValueError):
    """Two engine modules claim the same kind."""


class UnknownEngineError(KeyError):
    """A configuration names an engine kind nobody registered."""

    def __str__(self) -> str:  # KeyError's default repr-quotes the message
        return str(self.args[0])


class EngineRegistry:
    def __init__(self, specs: Iterable[EngineSpec] = ()) -> None:
        self._specs: dict[str, EngineSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: EngineSpec) -> None:
        if spec.kind in self._specs:
            raise DuplicateEngineError(f"engine kind {spec.kind!r} is already registered")
        self._specs[spec.kind] = spec

    def get(self, kind: str) -> EngineSpec:
        try:
            return self._specs[kind]
        except KeyError:
            known = ", ".join(sorted(self._specs))
            raise UnknownEngineError(f"unknown engine kind {kind!r}; known kinds: {known}") from None

    def kinds(self) -> list[str]:
        return sorted(self._specs)

    def __contains__(self, kind: object) -> bool:
        return kind in self._specs


def builtin_engines() -> EngineRegistry:
    """A fresh registry holding every engine kind shipped with Cognitora."""
    from kvstate.engines import llamacpp, mlx, openai, sglang, trtllm, vllm

    return EngineRegistry(module.SPEC for module in (vllm, sglang, llamacpp, trtllm, mlx, openai))
