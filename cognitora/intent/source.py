"""``IntentSource``: the rewrite policy in force, and its reload from ``intent.file`` without a restart.

The core asks ``current()`` once per request. When the policy lives in a file, that call ``stat``s the file at most
every ``reload_interval_s``; a new modification time (or size) re-reads, validates and compiles it (the classifier
is refitted) on a thread of its own, and a later request adopts it once it is ready: the gateway serves the policy
in force meanwhile. Both gateways alike, since both call the core. No request, no check: an idle gateway adopts a
new file on its first requests after the change. A file that no longer parses or validates is refused: the error
is logged, naming the file and the key, and the policy in force stays, so no request is lost to a typo.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from cognitora.intent.classifier import ClassifierUnavailable, ExamplesError
from cognitora.intent.policy import IntentConfig, IntentPolicy
from cognitora.intent.rewrite import Rewriter

__all__ = ["IntentSource"]

log = logging.getLogger("cognitora.intent")


class IntentSource:
    """The compiled policy in force (``current()``), reloaded from its file when that changes."""

    def __init__(
        self,
        section: IntentConfig,
        models: set[str],
        *,
        source: str = "intent",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises ``cognitora.config.ConfigError`` when the policy (or its file) is wrong: a clear start-up error."""
        from cognitora.config import ConfigError

        self._section = section
        self._models = models
        self._source = source
        self._clock = clock
        self._file = section.file
        self._stamp: tuple[int, int] | None = None
        self._next_check = 0.0
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._building: concurrent.futures.Future[Rewriter] | None = None
        self.reloads = 0
        """Policies loaded from the file after the first (successful reloads)."""
        self.reload_errors = 0
        try:
            if self._file is not None:
                self._stamp = _stamp(self._file)
                self._rewriter = self._load()
            else:
                self._rewriter = self._compile(section, source)
        except OSError as exc:
            raise ConfigError(f"{source}: intent.file: cannot read {self._file} ({exc.strerror or exc})") from None
        except _PolicyError as exc:
            raise ConfigError(str(exc)) from None

    def label_names(self) -> frozenset[str]:
        """Names the rewrite metric may show as they are (the rest are ``(unknown)``): the policy's intents, aliases
        and weighted names as first loaded (a reload that adds one shows it as ``(unknown)`` until a restart)."""
        p = self._rewriter.policy
        return frozenset([*(i.name for i in p.intents), *p.rewrite, *p.weighted])

    def current(self) -> Rewriter:
        """The policy to decide with now (reloaded first when its file changed)."""
        if self._file is not None:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + self._section.reload_interval_s
                self._maybe_reload()
        return self._rewriter

    def _maybe_reload(self) -> None:
        assert self._file is not None
        building = self._building
        if building is not None:
            if building.done():
                self._building = None
                self._adopt(building)
            return
        try:
            stamp = _stamp(self._file)
        except OSError as exc:
            if self._stamp is not None:  # said once per disappearance, not once a second
                self._stamp = None
                self._refused(f"{self._file}: cannot stat the intent policy file ({exc.strerror or exc})")
            return
        if stamp == self._stamp:
            return
        self._stamp = stamp  # one attempt per change: a refused file is refused once, not once a second
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cognitora-intent")
        # Off the request path: refitting the classifier takes seconds, and the gateway keeps serving meanwhile.
        self._building = self._thread.submit(self._load)

    def _adopt(self, building: concurrent.futures.Future[Rewriter]) -> None:
        try:
            self._rewriter = building.result()
        except _PolicyError as exc:
            self._refused(str(exc))
            return
        except Exception as exc:  # a bug must not stop the gateway: the policy in force stays
            self._refused(f"{self._file}: reloading the intent policy failed: {exc!r}")
            return
        self.reloads += 1
        log.warning("intent policy reloaded from %s", self._file)

    def close(self) -> None:
        """Stop the reload thread (a reload under way is abandoned)."""
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def wait_reloaded(self) -> None:
        """Tests: let a reload already started finish and take effect."""
        building = self._building
        if building is not None:
            concurrent.futures.wait([building])
            self._building = None
            self._adopt(building)

    def _refused(self, why: str) -> None:
        self.reload_errors += 1
        log.error("%s; keeping the intent policy in force", why)

    def _load(self) -> Rewriter:
        from cognitora.config import absolute_paths, read_yaml, resolve_env

        assert self._file is not None
        path = self._file
        try:
            data = read_yaml(path)
        except ValueError as exc:  # ConfigError names the file and line
            raise _PolicyError(str(exc)) from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise _PolicyError(f"{path}: expected a mapping of intent policy keys, got {type(data).__name__}")
        data = absolute_paths(resolve_env(data, str(path)), path.parent, IntentPolicy)
        try:
            policy = IntentPolicy.model_validate(data)
        except ValidationError as exc:
            raise _PolicyError(_validation_message(str(path), exc)) from None
        return self._compile(policy, str(path))

    def _compile(self, policy: IntentPolicy, source: str) -> Rewriter:
        problems = policy.problems(self._models)
        if problems:
            raise _PolicyError(f"{source}: " + "; ".join(problems))
        try:
            return Rewriter.build(policy)
        except (ClassifierUnavailable, ExamplesError) as exc:
            raise _PolicyError(f"{source}: {exc}") from None


def _stamp(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


def _validation_message(source: str, exc: ValidationError) -> str:
    from cognitora.config import describe_error

    return f"{source}: " + "; ".join(describe_error(e, "intent") for e in exc.errors(include_url=False))


class _PolicyError(Exception):
    pass
