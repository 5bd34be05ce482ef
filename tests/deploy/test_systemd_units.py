"""The systemd units as ``deploy/install.sh`` installs them in a fresh tree: ``systemd-analyze verify`` accepts each
(syntax, known directives, an ``ExecStart`` binary that exists: the tree's own), ``systemd-analyze security
--offline`` rates each hardened, and the command each unit starts, with the environment its files give it, runs:
it sends ``READY=1`` once it serves (``Type=notify``) and writes JSON lines to its stdout/stderr pipe as they
happen. And ``journalctl`` shows them: the collector's command, connected to a real systemd-journald private to the
test (``tests.support.private_journald``: a mount namespace of its own) the way systemd connects a unit with
``StandardOutput=journal`` (the stdout-stream header with the unit's ``SyslogIdentifier``, facility and level),
lands in the journal line by line, each ``MESSAGE`` one JSON record, and ``journalctl -o json`` reads them back.

There is no systemd running here (no PID 1 to start a unit): what is not tested is systemd's own part, PID 1
starting the unit and connecting its output, the sandbox at run time (DynamicUser, the namespaces), and the unit's
cgroup that gives journald ``_SYSTEMD_UNIT`` under systemd; docs/deploy.md says so.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cognitora_sim.harness.process import free_port
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.installed_tree import InstalledTree, installed_tree, service_entries, unit_command
from tests.support.private_journald import run_under_journald

pytestmark = pytest.mark.timeout(900)

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
EXPOSURE_BOUND = 2.0
"""``systemd-analyze security`` scores 0 (locked down) to 10 (exposed); below 2.0 it says "OK"."""

INSTANCES = {
    "cognitora-collector.service": "cognitora-collector.service",
    "cognitora-extproc@.service": "cognitora-extproc@main.service",
    "cognitora-node-agent.service": "cognitora-node-agent.service",
    "cognitora-pd-sidecar@.service": "cognitora-pd-sidecar@decode0.service",
}


@pytest.fixture(scope="module")
def tree() -> InstalledTree:
    return installed_tree()


@pytest.fixture(scope="module")
def instances(tree: InstalledTree, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each unit as systemd loads it: a template under an instance's name (verify needs one to expand ``%i``)."""
    folder = tmp_path_factory.mktemp("units")
    out = {}
    for template, instance in INSTANCES.items():
        shutil.copy(tree.units / template, folder / instance)
        out[template] = folder / instance
    return out


def test_systemd_analyze_is_here() -> None:
    assert SYSTEMD_ANALYZE is not None, "systemd-analyze is needed (Debian: the systemd package)"


@pytest.mark.parametrize("template", sorted(INSTANCES))
def test_verify_accepts_the_installed_unit(instances: dict[str, Path], tree: InstalledTree, template: str) -> None:
    assert SYSTEMD_ANALYZE is not None
    unit = instances[template]
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout and not done.stderr, done.stdout + done.stderr
    exec_start = dict(service_entries(unit))["ExecStart"].split()[0]
    assert exec_start == str(tree.venv / "bin" / "cognitora")  # the tree's binary: verify checked it exists


def test_verify_would_catch_a_wrong_binary_or_directive(instances: dict[str, Path], tmp_path: Path) -> None:
    """The check above can fail: a unit whose binary is missing, or with a misspelt directive, is refused."""
    assert SYSTEMD_ANALYZE is not None
    text = instances["cognitora-collector.service"].read_text()
    broken = tmp_path / "cognitora-collector.service"
    broken.write_text(text.replace("/venv/bin/cognitora", "/venv/bin/cognitora-missing"))
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "is not executable" in done.stderr
    broken.write_text(text.replace("ProtectHome=yes", "ProtectHomes=yes"))
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert "Unknown key" in done.stderr and "ProtectHomes" in done.stderr


@pytest.mark.parametrize("template", sorted(INSTANCES))
def test_each_unit_is_hardened(instances: dict[str, Path], template: str) -> None:
    assert SYSTEMD_ANALYZE is not None
    unit = instances[template]
    done = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=true", "--json=short", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    total = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=true", str(unit)], capture_output=True, text=True, timeout=60
    ).stdout.splitlines()[-1]
    score = float(total.split(":")[1].split()[0])
    assert score < EXPOSURE_BOUND, total
    for setting in ("User=/DynamicUser=", "ProtectSystem=", "NoNewPrivileges=", "ProtectHome=", "PrivateTmp="):
        assert rows[setting]["set"], (setting, rows[setting])
    entries = dict(service_entries(unit))
    assert entries["Type"] == "notify" and entries["Restart"] == "on-failure"
    assert entries["RestrictAddressFamilies"] == "AF_UNIX AF_INET AF_INET6"
    assert entries["StateDirectory"] == entries["ConfigurationDirectory"] == "cognitora"


# -- what the units start ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with start_fleet(1, time_scale=20, log_dir=tmp_path_factory.mktemp("fleet")) as fleet:
        yield fleet


def fleet_config(tree: InstalledTree, fleet: SimFleet, redis_url: str, key_prefix: str, name: str) -> Path:
    path = tree.confdir / name
    endpoint = {"url": fleet.urls[0], "kv_events": fleet.events_addresses[0]}
    data = {
        "redis_url": redis_url,
        "key_prefix": key_prefix,
        "models": [{"name": fleet.model, "endpoints": [endpoint]}],
    }
    path.write_text(json.dumps(data))
    return path


def start_unit(unit: Path, instance: str, notify: str, state: Path) -> subprocess.Popen[str]:
    """The unit's command with its environment, stdout and stderr on one pipe, as journald takes them."""
    command = unit_command(unit, instance, {"%S": str(state), "%C": str(state)})
    env = {"PATH": "/usr/bin:/bin", **command.env, "NOTIFY_SOCKET": notify}
    return subprocess.Popen(command.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def ready_and_json_lines(proc: subprocess.Popen[str], sock: socket.socket, want_msg: str) -> list[dict[str, object]]:
    """Wait for ``READY=1`` on the socket and for a JSON line whose ``msg`` is ``want_msg`` on the pipe, both while
    the process runs (a block-buffered pipe would hold the line until exit)."""
    assert proc.stdout is not None
    sock.settimeout(60)
    assert sock.recv(4096).startswith(b"READY=1")
    records: list[dict[str, object]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"the pipe closed (exit {proc.poll()}) before {want_msg!r}: {records}"
        records.append(json.loads(line))  # every line is one JSON object
        if records[-1]["msg"] == want_msg:
            assert proc.poll() is None, "the line came only at exit"
            return records
    raise AssertionError(f"no {want_msg!r} line: {records}")


def notify_socket(tmp: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp / "notify"))
    return sock


def stop(proc: subprocess.Popen[str]) -> int:
    proc.terminate()  # what systemctl stop sends
    return proc.wait(timeout=30)


@contextlib.contextmanager
def collector_options(tree: InstalledTree, config: Path, port: int, extra: str = "") -> Iterator[None]:
    """The operator's edit of the file the collector's unit reads (this test's config, a free metrics port, and
    ``extra`` lines), undone after."""
    collector_env = tree.confdir / "collector.env"
    original = collector_env.read_text()
    collector_env.write_text(f"COGNITORA_CONFIG={config}\nCOLLECTOR_ARGS=--metrics-listen 127.0.0.1:{port}\n{extra}")
    try:
        yield
    finally:
        collector_env.write_text(original)


def test_the_collector_unit_starts_ready_and_logs_json(
    tree: InstalledTree, fleet: SimFleet, redis_server_url: str, key_prefix: str
) -> None:
    config = fleet_config(tree, fleet, redis_server_url, key_prefix, "collector-test.yaml")
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="sdn-", dir="/tmp"))
    try:
        with collector_options(tree, config, port), notify_socket(tmp) as sock:
            proc = start_unit(tree.units / "cognitora-collector.service", "", str(tmp / "notify"), tmp)
            try:
                ready_and_json_lines(proc, sock, "collector started")
                assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
            finally:
                assert stop(proc) == 0  # SIGTERM stops it cleanly: no restart by Restart=on-failure
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


OTEL_KEYS = {"Timestamp", "SeverityText", "SeverityNumber", "Body", "Attributes", "Resource", "InstrumentationScope"}
"""``COGNITORA_LOG_FORMAT=otel``'s line (cognitora/jsonlog.py): the OpenTelemetry log data model, on stdout."""
DEFAULT_KEYS = {"ts", "level", "logger", "msg"}
"""The default line (cognitora/jsonlog.py), on stderr."""


@pytest.mark.parametrize("log_format", ["otel", "default"])
def test_journalctl_shows_the_collectors_json_lines(
    tree: InstalledTree, fleet: SimFleet, redis_server_url: str, key_prefix: str, tmp_path: Path, log_format: str
) -> None:
    """The collector's command, its stdout and stderr one stream into a real (private) journald as systemd connects
    them for ``StandardOutput=journal``: ``journalctl -o json`` holds every line it wrote, under the unit's
    identifier, at the priority journald gives a line without a ``<N>`` prefix (the unit's ``SyslogLevel``,
    info), each ``MESSAGE`` one JSON record, the first ones while it still served."""
    config = fleet_config(tree, fleet, redis_server_url, key_prefix, f"journal-{log_format}.yaml")
    unit = tree.units / "cognitora-collector.service"
    extra = "COGNITORA_LOG_FORMAT=otel\n" if log_format == "otel" else ""
    with collector_options(tree, config, free_port(), extra):
        command = unit_command(unit, "", {"%S": str(tmp_path), "%C": str(tmp_path)})
    assert command.syslog_identifier == "cognitora-collector"
    run = run_under_journald(
        command.argv,
        {"PATH": "/usr/bin:/bin", **command.env},
        identifier=command.syslog_identifier,
        unit=unit.name,
        until="collector started",
    )
    assert run.exit_status == 0, run.journald_log
    entries = run.stream_entries()
    assert entries, run.entries
    bodies = []
    for entry in entries:
        assert entry["SYSLOG_IDENTIFIER"] == "cognitora-collector", entry
        assert (entry["PRIORITY"], entry["SYSLOG_FACILITY"]) == ("6", "3"), entry  # info, daemon: whatever the level
        record = json.loads(entry["MESSAGE"])  # one record per journal entry, not a fragment or two glued
        if log_format == "otel":
            assert set(record) >= OTEL_KEYS, record
            assert record["Resource"] == {"service.name": "cognitora"}
            bodies.append(record["Body"])
        else:
            assert set(record) >= DEFAULT_KEYS, record
            bodies.append(record["msg"])
    assert "collector started" in bodies and bodies[-1] == "collector stopped", bodies
    started = entries[bodies.index("collector started")]
    assert int(started["__REALTIME_TIMESTAMP"]) < run.stopped_at_us  # journald had it while the collector served


def test_an_extproc_instance_reads_its_own_file(
    tree: InstalledTree, fleet: SimFleet, redis_server_url: str, key_prefix: str
) -> None:
    config = fleet_config(tree, fleet, redis_server_url, key_prefix, "extproc-test.yaml")
    port = free_port()
    (tree.confdir / "extproc-edge.env").write_text(
        f"COGNITORA_CONFIG={config}\nEXTPROC_ARGS=--listen 127.0.0.1:{port}\n"
    )
    tmp = Path(tempfile.mkdtemp(prefix="sdn-", dir="/tmp"))
    with notify_socket(tmp) as sock:
        proc = start_unit(tree.units / "cognitora-extproc@.service", "edge", str(tmp / "notify"), tmp)
        try:
            records = ready_and_json_lines(
                proc, sock, f"ext_proc listening on 127.0.0.1:{port} (port {port}), 1 endpoints"
            )
            assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        finally:
            assert stop(proc) == 0
            shutil.rmtree(tmp, ignore_errors=True)
    with pytest.raises(FileNotFoundError, match=r"extproc-absent\.env"):  # systemd refuses an instance with no file
        unit_command(tree.units / "cognitora-extproc@.service", "absent")
