"""One metrics page for ``cognitora extproc --workers N``: the supervisor merges its workers' pages.

Each worker has its own Router, so each counts only the requests it placed. The supervisor (which places nothing)
serves ``--metrics-listen``; on every GET it fetches each worker's page over a unix socket in a private folder
(``worker-<i>.sock``), all at once, and merges them by ``cognitora.metrics.names``:

- ``Merge.SUM`` families (counters, histograms, gauges of per-process work): samples with the same name and labels
  are added up, so ``cognitora_decisions_total`` is the service's total;
- ``Merge.FIRST`` families (the fleet's snapshots, which every worker reads from the same store; ``cognitora_info``):
  the first worker's samples, not N copies added up.

A worker that does not answer fails the whole GET (503): a page without one worker's share would show counters
going down, which Prometheus takes for a restart. ``cognitora_exporter_workers`` says how many pages were merged.

Why not prometheus_client's multiprocess mode: it aggregates metrics updated through its own objects only (every
update a write to a shared file), while Cognitora's page is rendered from live state at scrape time; each worker
serving its own port would leave the summing to every reader, and hand them N copies of the fleet's gauges.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector as PrometheusCollector
from prometheus_client.samples import Sample

from cognitora.metrics.families import family
from cognitora.metrics.names import SPECS, Merge

__all__ = ["FETCH_TIMEOUT_S", "WorkerPages", "merge_pages", "worker_socket"]

FETCH_TIMEOUT_S = 5.0
"""A worker busy placing requests still answers its page within this (it renders on its loop between requests)."""

_FIRST = frozenset(s.name for s in SPECS if s.merge is Merge.FIRST)


def worker_socket(folder: Path, index: int) -> Path:
    """Where worker ``index`` serves its page."""
    return folder / f"worker-{index}.sock"


def merge_pages(pages: Sequence[str]) -> list[Metric]:
    """The families of ``pages`` (Prometheus text), merged as the module docstring says, in first-seen order."""
    merged: dict[str, Metric] = {}
    sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for page in pages:
        for fam in text_string_to_metric_families(page):
            known = merged.get(fam.name)
            if known is None:
                merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                sums[fam.name] = {}
            elif fam.name in _FIRST:
                continue
            table = sums[fam.name]
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                table[key] = table.get(key, 0.0) + sample.value
    for name, out in merged.items():
        out.samples = [Sample(sample, dict(labels), value) for (sample, labels), value in sums[name].items()]
    return list(merged.values())


class _Families(PrometheusCollector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class WorkerPages:
    """The supervisor's page: ``await pages.page()`` fetches and merges ``count`` workers' pages from ``folder``."""

    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        self.count = count

    async def page(self) -> bytes:
        texts = await asyncio.gather(*(self._fetch(worker_socket(self.folder, i)) for i in range(self.count)))
        families = merge_pages(texts)
        workers = family("cognitora_exporter_workers")
        workers.add_metric([], len(texts))
        families.append(workers)
        return generate_latest(_Families(families))

    async def _fetch(self, path: Path) -> str:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path)), timeout=timeout) as session,
                session.get("http://worker/metrics") as response,
            ):
                response.raise_for_status()
                return await response.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise WorkerUnavailable(f"worker page {path.name} did not answer: {exc or type(exc).__name__}") from exc


class WorkerUnavailable(RuntimeError):
    """A worker's page could not be read: the merged page would undercount."""
