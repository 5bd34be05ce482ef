"""Find or start a real Redis for tests and benchmarks: ``REDIS_URL``, else 127.0.0.1:6379 if it answers, else a
private ``redis-server`` on a free port (stopped when the context exits: for the tests, when their session ends)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

__all__ = ["answers", "free_port", "private_redis", "redis_server_argv", "redis_url"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


@contextmanager
def redis_url() -> Iterator[str]:
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    default = "redis://127.0.0.1:6379/0"
    if answers(default):
        yield default
        return
    with private_redis() as url:
        yield url


def redis_server_argv(binary: str, port: int, workdir: str) -> list[str]:
    """A ``redis-server`` on 127.0.0.1:``port`` that keeps nothing on disk (its state dies with it): the tests', the
    fault-injection bench's and the scaled-out bench targets' Redis."""
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir]


@contextmanager
def private_redis(password: str | None = None) -> Iterator[str]:
    """A ``redis-server`` of this test session's own on a free port (with ``requirepass`` when ``password`` is
    given: the URL yielded then carries it)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("no Redis: set REDIS_URL, run one on 127.0.0.1:6379, or install redis-server")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="cognitora-redis-")
    argv = redis_server_argv(binary, port, workdir)
    if password is not None:
        argv += ["--requirepass", password]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://{'' if password is None else f':{password}@'}127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while not answers(url):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"redis-server on port {port} did not start")
        time.sleep(0.05)
    try:
        yield url
    finally:
        # SIGTERM makes Redis write its last snapshot or AOF when a test switched persistence on; on a loaded machine
        # that can outlast any fair wait, and nobody reads this throwaway server's files: then it is killed.
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
