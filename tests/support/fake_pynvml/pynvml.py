"""A stand-in for ``pynvml`` (nvidia-ml-py) with two fake GPUs: only the NVML calls are faked.

The function names, argument order, units and return shapes are nvidia-ml-py's: power in mW, energy in mJ,
utilization as a struct with ``gpu`` and ``memory`` (%), memory info in bytes, strings as ``str``. Tests change
``GPUS`` and ``FAIL`` (a set of ``(gpu index, function name)`` that raise ``NVMLError``) to shape what NVML says.
It lives on its own path so that a subprocess can import it too (``PYTHONPATH=tests/support/fake_pynvml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_UNINITIALIZED = 1


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 1: "Uninitialized"}.get(self.value, f"NVML error {self.value}")


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Pci:
    busId: str  # nvidia-ml-py spells it so


GPUS: list[dict[str, Any]] = [
    {
        "uuid": "GPU-0e6a1a61-53a6-4c4a-8f6d-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "bus": "00000000:18:00.0",
        "mw": 250_000,
        "mj": 1_000_000,
        "util": (12, 3),
        "used": 2 * GIB,
        "total": 80 * GIB,
    },
    {
        "uuid": "GPU-0e6a1a61-53a6-4c4a-8f6d-111111111111",
        "name": "NVIDIA H100 80GB HBM3",
        "bus": "00000000:2A:00.0",
        "mw": 310_500,
        "mj": 7_250_000,
        "util": (87, 41),
        "used": 60 * GIB,
        "total": 80 * GIB,
    },
]
FAIL: set[tuple[int, str]] = set()
CALLS: list[str] = []
initialized = False


def _gpu(handle: int, call: str) -> dict[str, Any]:
    CALLS.append(call)
    if not initialized:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    if (handle, call) in FAIL:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return GPUS[handle]


def nvmlInit() -> None:
    global initialized
    initialized = True


def nvmlShutdown() -> None:
    global initialized
    initialized = False


def nvmlDeviceGetCount() -> int:
    if not initialized:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gpu(index, "nvmlDeviceGetHandleByIndex")
    return index


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return int(_gpu(handle, "nvmlDeviceGetPowerUsage")["mw"])


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    return int(_gpu(handle, "nvmlDeviceGetTotalEnergyConsumption")["mj"])


def nvmlDeviceGetUtilizationRates(handle: int) -> _Utilization:
    gpu, memory = _gpu(handle, "nvmlDeviceGetUtilizationRates")["util"]
    return _Utilization(gpu=gpu, memory=memory)


def nvmlDeviceGetMemoryInfo(handle: int) -> _Memory:
    g = _gpu(handle, "nvmlDeviceGetMemoryInfo")
    return _Memory(total=g["total"], free=g["total"] - g["used"], used=g["used"])


def nvmlDeviceGetUUID(handle: int) -> str:
    return str(_gpu(handle, "nvmlDeviceGetUUID")["uuid"])


def nvmlDeviceGetName(handle: int) -> str:
    return str(_gpu(handle, "nvmlDeviceGetName")["name"])


def nvmlDeviceGetPciInfo(handle: int) -> _Pci:
    return _Pci(busId=str(_gpu(handle, "nvmlDeviceGetPciInfo")["bus"]))
