"""``cognitora node-agent``: a node's measured power, served under the DCGM exporter's metric names.

The collector reads an endpoint's power from a page with DCGM's names (``kvstate.engines.dcgm``): an engine's own
/metrics, NVIDIA's dcgm-exporter, or this agent, which needs neither DCGM nor Kubernetes. Sources:

- ``nvml`` (``nvml.py``): NVIDIA GPUs through NVML (``pynvml`` from ``nvidia-ml-py``, the ``cognitora-router[nvml]``
  extra): power, total energy, utilization and framebuffer memory per GPU;
- ``powermetrics`` (``powermetrics.py``): a Mac's CPU + GPU + ANE power from macOS ``powermetrics`` (needs root),
  with the energy integrated here, served as one ``gpu="0"`` series.

``exposition.py`` writes the page; ``server.py`` samples the source every interval and serves the latest page.
See docs/power.md.
"""

__all__: list[str] = []
