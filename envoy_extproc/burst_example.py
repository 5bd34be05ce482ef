"""``examples/envoy_burst.yaml`` added to an ``examples/envoy.yaml`` config, as its two steps say: what an operator
pastes, done by code for the tests, the demo and the benchmark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["EXAMPLE", "add_burst", "add_pieces", "example_pieces"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "envoy_burst.yaml"
CLOUD_CLUSTER = "cloud_sim_cloud"


def add_pieces(config: dict[str, Any], pieces: dict[str, Any]) -> None:
    """Steps 1-2 of envoy_burst.yaml on ``config`` (a parsed examples/envoy.yaml): the cloud routes before the
    engine routes, the clusters. (No header strip: the cloud routes match the service's metadata, and
    examples/envoy.yaml already drops a client's x-cognitora-cloud.)"""
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    host = hcm["route_config"]["virtual_hosts"][0]
    host["routes"] = [*pieces["routes"], *host["routes"]]
    config["static_resources"]["clusters"].extend(pieces["clusters"])


def example_pieces() -> dict[str, Any]:
    pieces: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return pieces


def add_burst(cloud_port: int, ca_file: Path) -> Callable[[dict[str, Any]], None]:
    """An ``edit`` for ``render_config`` that adds the burst pieces, moved to a simulated cloud on ``cloud_port``
    whose CA is ``ca_file`` (tests run beside each other; the example's own addresses:
    tests/examples/test_examples_burst.py)."""
    pieces = example_pieces()
    (cloud,) = [c for c in pieces["clusters"] if c["name"] == CLOUD_CLUSTER]
    address = cloud["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    address["port_value"] = cloud_port
    tls = cloud["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]
    tls["trusted_ca"] = {"filename": str(ca_file)}

    def edit(config: dict[str, Any]) -> None:
        add_pieces(config, pieces)

    return edit
