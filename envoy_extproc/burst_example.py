"""``examples/envoy_burst.yaml`` merged into a rendered ``examples/envoy.yaml`` (``launch.render_config``'s
``edit``): what an operator pastes, done by code for the tests, the demo and the benchmark."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "envoy_burst.yaml"
_PLACEHOLDER = re.compile(r"\$\{([A-Z0-9_]+)\}")


def add_burst(cloud_port: int, ca_file: Path) -> Callable[[dict[str, Any]], None]:
    """An ``edit`` for ``render_config`` that adds the burst pieces, with the simulated cloud's port and CA."""
    values = {"CLOUD_PORT": str(cloud_port), "CLOUD_CA_FILE": str(ca_file)}
    text = _PLACEHOLDER.sub(lambda m: values[m.group(1)], EXAMPLE.read_text())
    pieces = yaml.safe_load(text)

    def edit(config: dict[str, Any]) -> None:
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        host = hcm["route_config"]["virtual_hosts"][0]
        host["routes"] = [*pieces["routes"], *host["routes"]]
        config["static_resources"]["clusters"].extend(pieces["clusters"])

    return edit
