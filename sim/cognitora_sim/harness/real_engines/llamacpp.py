"""A real llama.cpp (``llama-cpp-python[server]``, built from its sdist) on the same SmolLM2 GGUF as the vLLM build.

    python -m cognitora_sim.harness.real_engines.llamacpp   # builds it (5 minutes cold on 2 cores), or says where

Cached like the vLLM build (``cognitora_sim.harness.real_engines.provision``: same folder, same lock discipline), in
``llamacpp-<recipe hash>/``: a venv with ``llama-cpp-python[server]`` compiled with ``CMAKE_ARGS`` below (the default
native build crashes on this machine's CPU: AMX instructions advertised but unusable). The GGUF it serves is the
vLLM build's ``gguf/`` file (that build is provisioned first), so both engines run the same weights.

``llama_cpp.server`` is not llama.cpp's C++ ``llama-server``: it has no ``/health``, ``/metrics`` or ``/slots``, only
the OpenAI routes. Cognitora therefore describes it as ``engine: openai`` (health from ``GET /v1/models``, load from
the router's own in-flight counts, prefix locality from its routing history): the approximate path.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from cognitora_sim.harness.process import ManagedProcess, free_port
from cognitora_sim.harness.real_engines.launch import MAX_MODEL_LEN, MODEL, STARTUP_TIMEOUT_S
from cognitora_sim.harness.real_engines.provision import (
    READY,
    Build,
    ProvisionError,
    cache_root,
    cached_build,
    provision,
    sha256_of,
)

LLAMACPP_REQUIREMENT = "llama-cpp-python[server]==0.3.36"
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
    # No multimodal library (libmtmd): a text model needs none (llama_cpp imports it only for image chat formats),
    # and it was a large share of the build's minutes on 2 cores.
    " -DLLAVA_BUILD=OFF"
)
BUILD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class LlamaCppInstall:
    root: Path
    python: Path
    gguf: Path


def recipe() -> dict[str, str]:
    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "requirement": LLAMACPP_REQUIREMENT,
        "cmake_args": CMAKE_ARGS,
    }


def install_dir() -> Path:
    digest = hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"llamacpp-{digest}"


def _build(root: Path, gguf: Path, say: Callable[[str], None]) -> None:
    build = Build(root, say)
    started = time.monotonic()
    build.step("create the llama.cpp venv", [sys.executable, "-m", "venv", str(root / "venv")])
    # --no-cache-dir: pip's wheel cache keys a built wheel by its sdist alone, so a wheel built with other CMAKE_ARGS
    # would be reused silently and the recipe's hash would lie.
    pip = [str(build.python), "-m", "pip", "install", "--no-cache-dir", "--no-binary", "llama-cpp-python"]
    pip.append(LLAMACPP_REQUIREMENT)
    build.step(f"build {LLAMACPP_REQUIREMENT} from its sdist", pip, BUILD_TIMEOUT_S, env={"CMAKE_ARGS": CMAKE_ARGS})
    manifest = {
        "recipe": recipe(),
        "gguf": str(gguf),
        "gguf_sha256": sha256_of(gguf),
        "timings_s": {**build.timings, "total": round(time.monotonic() - started, 1)},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (root / READY).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")


def provision_llamacpp(say: Callable[[str], None] = print) -> LlamaCppInstall:
    """The llama.cpp build (and the vLLM build whose GGUF it serves). Raises ``ProvisionError``."""
    gguf = provision(say).gguf
    root = cached_build(install_dir(), lambda root: _build(root, gguf, say), say)
    return LlamaCppInstall(root, root / "venv" / "bin" / "python", gguf)


def llamacpp_argv(install: LlamaCppInstall, port: int) -> list[str]:
    return [
        str(install.python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(install.gguf),
        "--model_alias",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(MAX_MODEL_LEN),
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
    ]


@dataclass
class LlamaCppServer:
    port: int
    process: ManagedProcess
    started_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint_id(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def start_llamacpp(
    log_dir: Path, install: LlamaCppInstall, timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[LlamaCppServer]:
    """One ``llama_cpp.server`` on a free port, ready (``GET /v1/models`` answers 200); stopped on exit."""
    port = free_port()
    started = time.monotonic()
    process = ManagedProcess(llamacpp_argv(install, port), log_dir / "llamacpp.log", env={"PYTHONPATH": ""})
    try:
        deadline = started + timeout_s
        while True:
            if not process.alive():
                raise RuntimeError(f"llama_cpp.server exited before it was ready:\n{process.log_tail(40)}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama_cpp.server not ready after {timeout_s:.0f} s:\n{process.log_tail(40)}")
            time.sleep(0.5)
        yield LlamaCppServer(port, process, round(time.monotonic() - started, 1))
    finally:
        process.stop()


def main(argv: list[str]) -> int:
    try:
        built = provision_llamacpp(say=lambda line: print(line, file=sys.stderr))
    except ProvisionError as exc:
        print(f"real llama.cpp could not be provisioned: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"root": str(built.root), "python": str(built.python), "gguf": str(built.gguf)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
