"""A Mac's power from macOS ``powermetrics`` (Apple Silicon; it needs root).

The agent runs ``powermetrics --samplers cpu_power,gpu_power -i <interval ms>`` as a long-lived subprocess and
reads its text output. Each sample starts with a header line ``*** Sampled system activity (<date>) (1002.90ms
elapsed) ***`` and holds, among much else, ``CPU Power: 823 mW``, ``GPU Power: 26 mW``, ``ANE Power: 0 mW`` and
``Combined Power (CPU + GPU + ANE): 849 mW`` (engines.md 7.3). A sample is complete when the next header arrives.

powermetrics reports power only, so energy is integrated here: each sample adds its power times its own elapsed
time (the header's ``ms elapsed``), so consecutive samples cover the wall clock without gaps or double counting.

What is served (as one ``gpu="0"`` series under DCGM's names, so the collector reads it like any GPU):
``DCGM_FI_DEV_POWER_USAGE`` is the combined CPU + GPU + ANE power, because on a Mac the engine (MLX, llama.cpp)
draws on all of the SoC; ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` the integrated energy since the agent started;
``DCGM_FI_DEV_GPU_UTIL`` the GPU's active residency when the sample has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cognitora.node_agent.exposition import GpuReading

__all__ = [
    "EnergyIntegrator",
    "PowerSample",
    "PowermetricsSource",
    "PowermetricsUnavailable",
    "SampleSplitter",
    "parse_powermetrics",
]

log = logging.getLogger(__name__)

HEADER = re.compile(r"^\*\*\* Sampled system activity\b.*?(?:\((?P<ms>[\d.]+)\s*ms elapsed\))?\s*\*\*\*\s*$")
_POWER = re.compile(
    r"^(?P<what>CPU|GPU|ANE|Combined) Power(?: \([^)]*\))?:\s*(?P<value>[\d.]+)\s*(?P<unit>mW|W)\b", re.IGNORECASE
)
_GPU_ACTIVE = re.compile(r"^GPU (?:HW )?active residency:\s*(?P<pct>[\d.]+)%")
_MACHINE = re.compile(r"^Machine model:\s*(?P<model>\S.*?)\s*$")

DEFAULT_COMMAND = ("powermetrics", "--samplers", "cpu_power,gpu_power")


@dataclass(frozen=True)
class PowerSample:
    """One powermetrics sample; powers in milliwatts, ``None`` when the sample did not show that line."""

    elapsed_ms: float | None = None
    cpu_mw: float | None = None
    gpu_mw: float | None = None
    ane_mw: float | None = None
    combined_mw: float | None = None
    gpu_active_pct: float | None = None

    @property
    def total_mw(self) -> float | None:
        """``Combined Power`` when shown, else the sum of the parts shown (None when none is)."""
        if self.combined_mw is not None:
            return self.combined_mw
        parts = [p for p in (self.cpu_mw, self.gpu_mw, self.ane_mw) if p is not None]
        return sum(parts) if parts else None


def _milliwatts(value: str, unit: str) -> float:
    return float(value) * (1000.0 if unit.lower() == "w" else 1.0)


def parse_sample(lines: Iterable[str], elapsed_ms: float | None = None) -> PowerSample:
    """The power lines of one sample's body (the first of each kind counts: ``GPU Power`` is printed twice)."""
    found: dict[str, float] = {}
    for line in lines:
        text = line.strip()
        match = _POWER.match(text)
        if match:
            found.setdefault(match["what"].lower(), _milliwatts(match["value"], match["unit"]))
            continue
        active = _GPU_ACTIVE.match(text)
        if active:
            found.setdefault("gpu_active", float(active["pct"]))
    return PowerSample(
        elapsed_ms=elapsed_ms,
        cpu_mw=found.get("cpu"),
        gpu_mw=found.get("gpu"),
        ane_mw=found.get("ane"),
        combined_mw=found.get("combined"),
        gpu_active_pct=found.get("gpu_active"),
    )


class SampleSplitter:
    """Feeds lines of powermetrics text; yields each sample once it is complete (at the next header, or ``end``)."""

    def __init__(self) -> None:
        self._body: list[str] | None = None
        self._elapsed: float | None = None
        self.machine: str | None = None

    def feed(self, line: str) -> PowerSample | None:
        header = HEADER.match(line.strip())
        if header is None:
            if self._body is not None:
                self._body.append(line)
            elif self.machine is None and (machine := _MACHINE.match(line.strip())):
                self.machine = machine["model"]
            return None
        done = self.end()
        self._body = []
        self._elapsed = float(header["ms"]) if header["ms"] else None
        return done

    def end(self) -> PowerSample | None:
        if self._body is None:
            return None
        sample = parse_sample(self._body, self._elapsed)
        self._body = None
        return sample


def parse_powermetrics(text: str) -> list[PowerSample]:
    """Every sample of a powermetrics text capture, in order."""
    splitter = SampleSplitter()
    samples = [s for line in text.splitlines() if (s := splitter.feed(line)) is not None]
    last = splitter.end()
    return [*samples, last] if last is not None else samples


@dataclass
class EnergyIntegrator:
    """Total energy (mJ) from a stream of power samples: power x each sample's own elapsed time."""

    energy_mj: float = 0.0
    default_elapsed_ms: float = 1000.0
    """Used when a header carries no elapsed time (the requested interval)."""

    def add(self, sample: PowerSample) -> None:
        power = sample.total_mw
        if power is None:
            return
        elapsed = sample.elapsed_ms if sample.elapsed_ms is not None else self.default_elapsed_ms
        self.energy_mj += power * elapsed / 1000.0  # mW x s = mJ


class PowermetricsSource:
    """Streams ``command`` (powermetrics, by default) and serves its latest sample as one ``gpu="0"`` reading.

    ``open()`` starts the subprocess (``start()`` in an event loop); ``read()`` returns what the latest complete
    sample showed (an empty list until the first one). ``command`` is replaceable so that tests can feed a capture.
    """

    name = "powermetrics"

    def __init__(self, interval_s: float = 1.0, command: Sequence[str] | None = None, count: int | None = None) -> None:
        self.interval_ms = max(int(interval_s * 1000), 100)
        if command is None:
            command = [*DEFAULT_COMMAND, "-i", str(self.interval_ms)] + ([] if count is None else ["-n", str(count)])
        self.command = list(command)
        self.integrator = EnergyIntegrator(default_elapsed_ms=float(self.interval_ms))
        self.latest: PowerSample | None = None
        self.samples = 0
        self._splitter = SampleSplitter()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.exited = asyncio.Event()

    def on_sample(self, sample: PowerSample) -> None:
        self.integrator.add(sample)
        self.latest = sample
        self.samples += 1

    async def start(self) -> None:
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            raise PowermetricsUnavailable(f"cannot run {self.command[0]!r}: {exc}") from exc
        self._reader = asyncio.create_task(self._read_stream(), name="powermetrics reader")

    async def _read_stream(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        try:
            async for raw in process.stdout:
                sample = self._splitter.feed(raw.decode(errors="replace"))
                if sample is not None:
                    self.on_sample(sample)
            last = self._splitter.end()
            if last is not None:
                self.on_sample(last)
            code = await process.wait()
            if code != 0:
                err = b"" if process.stderr is None else await process.stderr.read()
                log.error(
                    "powermetrics exited (it needs root: run the agent with sudo)",
                    extra={"code": code, "stderr": err.decode(errors="replace").strip()[:500]},
                )
        finally:
            self.exited.set()

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.terminate()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._process.wait(), 5)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    def read(self) -> list[GpuReading]:
        sample = self.latest
        if sample is None:
            return []
        power = sample.total_mw
        return [
            GpuReading(
                index=0,
                name=f"Apple {self._splitter.machine or platform.machine()} (CPU+GPU+ANE)",
                device="soc0",
                power_w=None if power is None else power / 1000.0,
                energy_mj=self.integrator.energy_mj,
                gpu_util_pct=sample.gpu_active_pct,
            )
        ]


class PowermetricsUnavailable(RuntimeError):
    """powermetrics cannot be run here (not macOS, or not on PATH)."""
