"""A tiny run of bench/fault_injection.py: an engine killed and an ext_proc killed under load, each started again.

The committed numbers come from the full run (bench/results/fault_injection.md); this keeps the harness working and
checks what a client of the gateway sees in the two faults that reach it: a killed engine costs at most the requests
it was serving (later ones go elsewhere and come back once it is up), a killed ext_proc gives every request a JSON
500 until it is up again, then requests succeed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fault_injection

pytestmark = pytest.mark.e2e


def test_engine_and_extproc_kills_under_load_fail_only_while_down_and_recover(tmp_path: Path) -> None:
    out = tmp_path / "faults"
    argv = [
        "--out", str(out), "--engines", "3", "--rate", "6", "--phase-s", "6", "--lead-s", "1", "--down-s", "2",
        "--client-timeout-s", "8", "--phases", "engine-crash,extproc-restart", "--workdir", str(tmp_path / "work"),
    ]  # fmt: skip
    assert fault_injection.main(argv) == 0

    report = json.loads(out.with_suffix(".json").read_text())
    assert report["command"] == "python -m bench.fault_injection " + " ".join(argv)
    assert out.with_suffix(".md").read_text().startswith("# Fault injection")
    crash, extproc = report["phases"]
    assert [crash["name"], extproc["name"]] == ["engine-crash", "extproc-restart"]

    # The engine crash: a failure is only ever a request the dead engine was serving at the kill (Envoy retries
    # the ones that cannot connect on the runner-up, and placement stops picking it).
    assert crash["sent"] >= 20 and crash["served"] >= crash["sent"] - 3, crash["failed"]
    assert set(crash["failed"]) <= {"HTTP 503", "stream cut"}, crash["client_saw"]
    assert crash["last_failure_after_fault_s"] is None or crash["last_failure_after_fault_s"] < 1.0
    # Placement stops picking it once a failed connect or scrape marks it unhealthy: 1.02 s was seen once on a
    # loaded CI machine, typically well under 1 s.
    assert crash["target_last_pick_after_fault_s"] is None or crash["target_last_pick_after_fault_s"] < 2.0
    assert crash["first_success_after_heal_s"] is not None

    # The ext_proc kill: every request sent while it was down fails with Envoy's JSON 503 that says why, none after
    # it is back.
    assert extproc["window"]["served"] == 0 and extproc["window"]["sent"] >= 8
    assert "HTTP 503" in extproc["failed"] and set(extproc["failed"]) <= {"HTTP 503", "stream cut"}
    error = json.loads(extproc["client_saw"]["HTTP 503"])["error"]
    assert error["code"] == "placement_unavailable" and "unavailable" in error["message"]
    assert extproc["first_success_after_heal_s"] is not None
    recovered_at = extproc["heal_at_s"] + extproc["first_success_after_heal_s"]
    assert extproc["last_failure_after_fault_s"] + extproc["fault_at_s"] < recovered_at
