"""Cognitora's own metrics: Prometheus pages rendered from live state (docs/metrics.md).

- ``names``: every metric's name, type, labels and meaning, once (docs/metrics.md is generated from it);
- ``families``: the metric families built from a Router, a Collector and the fleet's snapshots at scrape time;
- ``window``: energy per token and cache hit rate over a window of snapshots;
- ``exporter``: one process's page (``Exporter.page``); ``serve``: that page over HTTP, with CORS;
- ``workers``: one page for ``cognitora extproc --workers N``, merged from its workers' pages.

The request path records into ``cognitora.telemetry`` (plain counters); nothing here runs per request.
"""

__all__: list[str] = []
