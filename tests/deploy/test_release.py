"""``deploy/release.sh``: the release artifacts of a commit, built twice, are the same bytes; ``SHA256SUMS`` checks
them (and catches a changed one); the CycloneDX SBOM describes what installing the wheel brings in.

The builds are of this checkout's HEAD (``git archive``): in CI, the commit under test.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "deploy" / "release.sh"

pytestmark = pytest.mark.timeout(900)


def release(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    return subprocess.run(
        ["sh", str(RELEASE), "--out", str(out), *args], capture_output=True, text=True, env=env, timeout=850, cwd=ROOT
    )


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two release runs of the same commit: the first with the SBOM, the second without (the same pins)."""
    first, second = tmp_path_factory.mktemp("release-a"), tmp_path_factory.mktemp("release-b")
    for out, args in ((first, ()), (second, ("--no-sbom",))):
        done = release(out, *args)
        assert done.returncode == 0, done.stdout + done.stderr
    return first, second


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def commit_time() -> int:
    return int(subprocess.check_output(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], text=True))


def test_two_builds_of_one_commit_are_the_same_bytes(builds: tuple[Path, Path]) -> None:
    first, second = builds
    for pattern in ("*.whl", "*.tar.gz"):
        a, b = one(first, pattern), one(second, pattern)
        assert a.name == b.name
        assert sha256(a) == sha256(b), f"{a.name} differs between two builds of one commit"


def test_sha256sums_checks_every_artifact_and_catches_a_changed_one(builds: tuple[Path, Path], tmp_path: Path) -> None:
    first, _ = builds
    sums = (first / "SHA256SUMS").read_text().splitlines()
    named = {line.split()[1] for line in sums}
    assert named == {one(first, "*.whl").name, one(first, "*.tar.gz").name, one(first, "*.cdx.json").name}
    ok = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=first, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in [*named, "SHA256SUMS"]:
        (copy / name).write_bytes((first / name).read_bytes())
    wheel = copy / one(first, "*.whl").name
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    bad = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=copy, capture_output=True, text=True)
    assert bad.returncode != 0 and f"{wheel.name}: FAILED" in bad.stdout


def test_the_archives_carry_the_commit_time_and_no_build_machine_detail(builds: tuple[Path, Path]) -> None:
    first, _ = builds
    epoch = commit_time()
    with tarfile.open(one(first, "*.tar.gz")) as sdist:
        members = sdist.getmembers()
    assert members and all(m.mtime == epoch and m.uid == 0 and m.uname == "" for m in members)
    assert any(m.name.endswith("/cognitora/doctor/cli.py") for m in members)
    with zipfile.ZipFile(one(first, "*.whl")) as wheel:
        stamps = {info.date_time for info in wheel.infolist()}
    assert stamps == {time.gmtime(epoch - epoch % 2)[:6]}  # zip keeps even seconds


def test_the_sbom_lists_what_the_wheel_installs(builds: tuple[Path, Path]) -> None:
    first, _ = builds
    bom = json.loads(one(first, "*.cdx.json").read_text())
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    with zipfile.ZipFile(one(first, "*.whl")) as wheel:
        metadata_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(wheel.read(metadata_name).decode())
    root = bom["metadata"]["component"]
    assert (root["name"], root["version"]) == (metadata["Name"], metadata["Version"])
    components = {c["name"].lower().replace("_", "-"): c for c in bom["components"]}
    required = [
        r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip() for r in metadata.get_all("Requires-Dist")
    ]
    base = [r for r, full in zip(required, metadata.get_all("Requires-Dist"), strict=True) if "extra ==" not in full]
    for name in [*base, "grpcio", "xds-protos", "nvidia-ml-py"]:  # the base, and the extras install.sh installs
        component = components[name.lower().replace("_", "-")]
        assert component["purl"].startswith("pkg:pypi/") and component["version"], component
    assert "pip" not in components and "setuptools" not in components  # the environment holds the wheel alone


def test_normalize_gives_one_archive_for_one_content(tmp_path: Path) -> None:
    """Two archives of the same files, made at different times by different owners, become the same bytes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("normalize_sdist", ROOT / "deploy" / "normalize_sdist.py")
    assert spec is not None and spec.loader is not None
    normalize_sdist = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(normalize_sdist)
    paths = []
    for i, (mtime, owner) in enumerate([(1_000_000, "alice"), (2_000_000, "bob")]):
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for name in ["pkg/b.py", "pkg/a.py"] if i else ["pkg/a.py", "pkg/b.py"]:  # another order too
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.uname, info.mode = 3, mtime, owner, 0o664
                tar.addfile(info, io.BytesIO(name[-4:-3].encode() * 3))
        path = tmp_path / f"{i}.tar.gz"
        path.write_bytes(raw.getvalue())
        normalize_sdist.normalize(path, 1_700_000_000)
        paths.append(path)
    assert paths[0].read_bytes() != b"" and sha256(paths[0]) == sha256(paths[1])
    with tarfile.open(paths[0]) as tar:
        assert [(m.name, m.mtime, m.mode) for m in tar.getmembers()] == [
            ("pkg/a.py", 1_700_000_000, 0o644),
            ("pkg/b.py", 1_700_000_000, 0o644),
        ]
