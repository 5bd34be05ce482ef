"""NVIDIA GPUs through NVML (``pynvml``, from the ``nvidia-ml-py`` package: ``pip install 'cognitora-router[nvml]'``).

Per GPU and sample: ``nvmlDeviceGetPowerUsage`` (mW; a 1 s average on Ampere and newer except GA100, engines.md
7.1), ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded; Volta and newer),
``nvmlDeviceGetUtilizationRates`` (GPU and memory %), ``nvmlDeviceGetMemoryInfo`` (bytes, served in MiB), and once
per GPU its UUID, name and PCI bus id. Every call is guarded on its own: a GPU that fails one call (an older GPU
without the energy counter answers ``NVML_ERROR_NOT_SUPPORTED``) still reports the others, and each failure is
logged once per GPU and call, not once per second.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from cognitora.distribution import install_hint
from cognitora.node_agent.exposition import BYTES_PER_MIB, GpuReading

__all__ = ["NvmlSource", "NvmlUnavailable"]

log = logging.getLogger(__name__)

T = TypeVar("T")

INSTALL_HINT = f"install NVML's Python bindings (the nvidia-ml-py package): {install_hint('nvml')}"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: the bindings are not installed, or no NVIDIA driver answers."""


def import_pynvml() -> ModuleType:
    """The ``pynvml`` module, or ``NvmlUnavailable`` saying how to install it."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(f"--source nvml needs the pynvml module, which is not installed: {INSTALL_HINT}") from exc


def _text(value: Any) -> str:
    """Older bindings return bytes for strings."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Reads every GPU NVML sees. ``open()`` once (``nvmlInit``), ``read()`` per sample, ``close()`` at the end."""

    name = "nvml"

    def __init__(self, pynvml: ModuleType | None = None) -> None:
        self._nvml = pynvml if pynvml is not None else import_pynvml()
        self._error: type[BaseException] = getattr(self._nvml, "NVMLError", Exception)
        self._identity: dict[int, tuple[str | None, str | None, str | None]] = {}
        self._failing: set[tuple[int, str]] = set()
        self._open = False

    def open(self) -> None:
        try:
            self._nvml.nvmlInit()
        except self._error as exc:
            raise NvmlUnavailable(f"NVML did not initialize (is an NVIDIA driver loaded?): {exc}") from exc
        self._open = True
        count = self._call(-1, "nvmlDeviceGetCount", self._nvml.nvmlDeviceGetCount)
        log.info("NVML ready", extra={"gpus": count})

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._error as exc:
                log.warning("nvmlShutdown failed", extra={"reason": str(exc)})

    def _call(self, gpu: int, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None when NVML raises (logged once per GPU and call until it works again)."""
        try:
            value = fn(*args)
        except self._error as exc:
            if (gpu, what) not in self._failing:
                self._failing.add((gpu, what))
                log.warning(
                    "NVML call failed; reporting the rest", extra={"gpu": gpu, "call": what, "reason": str(exc)}
                )
            return None
        if (gpu, what) in self._failing:
            self._failing.discard((gpu, what))
            log.info("NVML call works again", extra={"gpu": gpu, "call": what})
        return value

    def read(self) -> list[GpuReading]:
        """One reading per GPU whose handle NVML gives (a GPU without a handle has nothing to report)."""
        nvml = self._nvml
        count = self._call(-1, "nvmlDeviceGetCount", nvml.nvmlDeviceGetCount)
        readings: list[GpuReading] = []
        for index in range(count or 0):
            handle = self._call(index, "nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is not None:
                readings.append(self._read_one(index, handle))
        return readings

    def _identity_of(self, index: int, handle: Any) -> tuple[str | None, str | None, str | None]:
        known = self._identity.get(index)
        if known is not None and None not in known:
            return known
        nvml = self._nvml
        uuid = self._call(index, "nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, handle)
        name = self._call(index, "nvmlDeviceGetName", nvml.nvmlDeviceGetName, handle)
        pci = self._call(index, "nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo, handle)
        bus_id = None if pci is None else getattr(pci, "busId", None)
        identity = (
            None if uuid is None else _text(uuid),
            None if name is None else _text(name),
            None if bus_id is None else _text(bus_id),
        )
        self._identity[index] = identity
        return identity

    def _read_one(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml
        uuid, name, bus_id = self._identity_of(index, handle)
        milliwatts = self._call(index, "nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, handle)
        energy = self._call(
            index, "nvmlDeviceGetTotalEnergyConsumption", nvml.nvmlDeviceGetTotalEnergyConsumption, handle
        )
        util = self._call(index, "nvmlDeviceGetUtilizationRates", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._call(index, "nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, handle)
        return GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            pci_bus_id=bus_id,
            power_w=None if milliwatts is None else milliwatts / 1000.0,
            energy_mj=None if energy is None else float(energy),
            gpu_util_pct=None if util is None else float(util.gpu),
            mem_copy_util_pct=None if util is None else float(util.memory),
            fb_used_mib=None if memory is None else memory.used / BYTES_PER_MIB,
            fb_free_mib=None if memory is None else memory.free / BYTES_PER_MIB,
        )
