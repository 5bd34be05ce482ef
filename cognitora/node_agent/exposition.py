"""One sample of a node's accelerators, and its page in the DCGM exporter's names, units and labels.

Names and units are dcgm-exporter's default counters (``etc/default-counters.csv``, engines.md 7.2): power in W,
total energy in mJ (a counter written without ``_total``, as dcgm-exporter writes it), utilization in %, framebuffer
in MiB. Labels are dcgm-exporter's: ``gpu`` (the NVML index), ``UUID``, ``pci_bus_id``, ``device`` (``nvidia0``),
``modelName`` and ``Hostname``. A value the source could not read is left out of the page (its series is absent),
never written as 0: absent means "not measured", as everywhere in the collector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BYTES_PER_MIB", "GpuReading", "dcgm_page"]

POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
TOTAL_ENERGY_CONSUMPTION = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_USED = "DCGM_FI_DEV_FB_USED"

BYTES_PER_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    """What one accelerator reported in one sample; ``None``: that reading failed or is not supported."""

    index: int
    """The ``gpu`` label: NVML's index (PCI bus order), which is DCGM's too."""
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    power_w: float | None = None
    energy_mj: float | None = None
    """Total energy since the driver loaded (NVML) or since the agent started (powermetrics), millijoules."""
    gpu_util_pct: float | None = None
    mem_copy_util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    device: str | None = None
    """The ``device`` label (``nvidia0``); default ``nvidia<index>``."""


# (name, type, help, field, format): HELP texts are dcgm-exporter's.
_FAMILIES: tuple[tuple[str, str, str, str, str], ...] = (
    (GPU_UTIL, "gauge", "GPU utilization (in %).", "gpu_util_pct", "{:.0f}"),
    (MEM_COPY_UTIL, "gauge", "Memory utilization (in %).", "mem_copy_util_pct", "{:.0f}"),
    (FB_FREE, "gauge", "Framebuffer memory free (in MiB).", "fb_free_mib", "{:.0f}"),
    (FB_USED, "gauge", "Framebuffer memory used (in MiB).", "fb_used_mib", "{:.0f}"),
    (POWER_USAGE, "gauge", "Power draw (in W).", "power_w", "{:.3f}"),
    (
        TOTAL_ENERGY_CONSUMPTION,
        "counter",
        "Total energy consumption since boot (in mJ).",
        "energy_mj",
        "{:.0f}",
    ),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels(reading: GpuReading, hostname: str) -> str:
    pairs = [
        ("gpu", str(reading.index)),
        ("UUID", reading.uuid or ""),
        ("pci_bus_id", reading.pci_bus_id or ""),
        ("device", reading.device or f"nvidia{reading.index}"),
        ("modelName", reading.name or ""),
        ("Hostname", hostname),
    ]
    return ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)


def dcgm_page(readings: Sequence[GpuReading], hostname: str) -> str:
    """The Prometheus text page of one sample (a family with no value on any GPU is left out)."""
    lines: list[str] = []
    for name, kind, help_, attr, fmt in _FAMILIES:
        series = [(r, getattr(r, attr)) for r in readings if getattr(r, attr) is not None]
        if not series:
            continue
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{labels(r, hostname)}}} {fmt.format(value)}" for r, value in series]
    return "\n".join(lines) + "\n" if lines else ""
