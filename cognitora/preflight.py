"""What a process checks at start, before it serves: each check turns a bad setup into one message naming the key.

Config loading (``cognitora.config``) checks what it can without touching anything outside the file: types, keys,
references, that named files exist. What needs the world is checked here, by each process as it starts
(``cognitora extproc``, ``cognitora collector``, the LiteLLM strategy when a Router installs it):

- ``prompt_keyers``: each model's ``tokenizer`` and ``chat_template`` load, and the template compiles. A file that
  cannot be read, is not a ``tokenizer.json``, or holds a template that does not compile is a ``ConfigError``
  naming ``models[i].tokenizer`` / ``models[i].chat_template`` and the file (the Router builds its keyers here).
  A config reload hands the keyers in force (``reuse``): a model whose keyer is built from the same settings and
  the same files, unchanged on disk, keeps its keyer (tokenizer, template, caches) instead of loading it again;
- ``resolve_engines``: every endpoint's host resolves, and no engine is listed twice under two spellings
  (``localhost:8001`` and ``127.0.0.1:8001`` are one engine: counted as two, its load and cache would be split).
  A duplicate is a ``ConfigError`` naming both entries; a host that does not resolve is reported naming the
  endpoint and the host (``unresolved_problems``), and each caller decides: the Envoy service needs literal
  addresses at start, the collector and LiteLLM resolve on every connection, so a name that appears later heals;
- ``check_store``: Redis at ``redis_url`` answers and accepts the credentials. A refused password is a
  ``ConfigError`` (it will not fix itself); a Redis that does not answer is a warning naming ``redis_url``: the
  process starts degraded and recovers when Redis does (docs/placement.md, "Degraded mode"). The password is
  never printed (``cognitora.redaction``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cognitora.config import CognitoraConfig, ConfigError, ModelConfig
from cognitora.redaction import redact_url
from kvstate.chat_template import ChatTemplate, PromptError
from kvstate.prompt import KEY_MEMO_BYTES, PIECE_CACHE_BYTES, PROBATION_SHARE, ChatTokenizer, PromptKeyer
from kvstate.store import StoreRefused, StoreUnavailable

__all__ = [
    "STORE_CHECK_TIMEOUT_S",
    "EngineAddress",
    "KeyerSource",
    "PieceCache",
    "check_store",
    "keyer_source",
    "prompt_keyers",
    "resolve_engines",
    "unresolved_problems",
]

STORE_CHECK_TIMEOUT_S = 2.0
"""How long the start-up check waits for Redis (the serving path's timeouts are much shorter)."""


# -- tokenizer and chat template ------------------------------------------------------------------------------


Fingerprint = tuple[int, int, int] | None
"""A file's (modification time, size, inode); None when it is absent."""


@dataclass(frozen=True)
class PieceCache:
    """A model tokenizer's piece cache, as ``limits`` sets it (``kvstate.prompt.ChatTokenizer``)."""

    bytes: int = PIECE_CACHE_BYTES
    probation_share: float = PROBATION_SHARE


@dataclass(frozen=True)
class KeyerSource:
    """What a model's keyer was built from: its settings and the files it read, as they were on disk then."""

    settings: tuple[object, ...]
    """Model name, block size, tokenizer and template paths, piece-cache settings and key-memo bound."""
    files: tuple[tuple[str, Fingerprint], ...]


_SOURCES: weakref.WeakKeyDictionary[PromptKeyer, KeyerSource] = weakref.WeakKeyDictionary()
"""Each keyer ``prompt_keyers`` built, and from what. Weak: it keeps no keyer alive, it only lets a reload tell
whether the keyer in force still fits the new config."""


def prompt_keyers(config: CognitoraConfig, reuse: Mapping[str, PromptKeyer] | None = None) -> dict[str, PromptKeyer]:
    """Each model's prompt keyer by model name, its tokenizer and chat template loaded and compiled now.

    ``reuse``: the keyers in force (a config reload). A model's keyer there is kept when it was built from the same
    settings and its files are unchanged: a tokenizer loaded again per reload cost ~40 MiB of native memory that
    the allocator did not give back (docs/operations.md, "Soak"), and its caches would start cold."""
    cache = PieceCache(config.limits.tokenizer_cache_bytes, config.limits.tokenizer_cache_probation_share)
    memo = config.limits.block_key_memo_bytes
    keyers: dict[str, PromptKeyer] = {}
    for i, m in enumerate(config.models):
        # Read before loading: a file that changes while it loads then differs at the next reload, and loads again.
        source = keyer_source(m, cache, memo)
        previous = None if reuse is None else reuse.get(m.name)
        if previous is not None and _SOURCES.get(previous) == source:
            keyers[m.name] = previous
            continue
        keyer = prompt_keyer(m, i, cache, memo)
        _SOURCES[keyer] = source
        keyers[m.name] = keyer
    return keyers


def keyer_source(model: ModelConfig, cache: PieceCache, key_memo_bytes: int) -> KeyerSource:
    """What ``prompt_keyer`` builds ``model``'s keyer from, the files fingerprinted now: the tokenizer, the named
    template, and the two files beside the tokenizer that ``kvstate.chat_template.load_chat_template`` reads."""
    settings = (model.name, model.block_size, model.tokenizer, model.chat_template, cache, key_memo_bytes)
    paths: list[Path] = []
    if model.tokenizer is not None:
        paths.append(model.tokenizer)
        paths += [model.tokenizer.parent / "tokenizer_config.json", model.tokenizer.parent / "chat_template.jinja"]
    if model.chat_template is not None:
        paths.append(model.chat_template)
    return KeyerSource(settings, tuple((str(p), _fingerprint(p)) for p in paths))


def _fingerprint(path: Path) -> Fingerprint:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def prompt_keyer(
    model: ModelConfig, index: int, cache: PieceCache | None = None, key_memo_bytes: int = KEY_MEMO_BYTES
) -> PromptKeyer:
    """``models[index]``'s keyer (its piece cache as ``cache`` says, else the defaults). Raises ``ConfigError``
    naming the key and the file that is wrong."""
    tokenizer = None
    if model.tokenizer is not None:
        where = f"models[{index}]"
        tokenizer = _chat_tokenizer(model.tokenizer, model.chat_template, where, model.name, cache or PieceCache())
    return PromptKeyer(model.name, model.block_size, tokenizer, key_memo_bytes)


def _chat_tokenizer(path: Path, template: Path | None, where: str, name: str, cache: PieceCache) -> ChatTokenizer:
    tokenizer_key, template_key = f"{where}.tokenizer (model {name!r})", f"{where}.chat_template (model {name!r})"
    if template is not None:
        # The named template first, on its own: an error then names the right key.
        try:
            source = template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{template_key}: cannot read {template}: {_why(exc)}") from None
        try:
            ChatTemplate(source).compile_all()
        except PromptError as exc:
            raise ConfigError(f"{template_key}: {template}: {exc}") from None
    try:
        chat = ChatTokenizer(path, template, cache_bytes=cache.bytes, probation_share=cache.probation_share)
    except PromptError as exc:  # tokenizer_config.json beside the tokenizer (its message names that file)
        raise ConfigError(f"{tokenizer_key}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a file beside the tokenizer (chat_template.jinja)
        raise ConfigError(
            f"{tokenizer_key}: cannot read {getattr(exc, 'filename', None) or path}: {_why(exc)}"
        ) from None
    except Exception as exc:  # tokenizers raises a bare Exception: unreadable, not JSON, not a tokenizer
        raise ConfigError(
            f"{tokenizer_key}: {path} is not a tokenizer.json the HF tokenizers library can load ({exc}); "
            "point it at the model's own tokenizer.json"
        ) from None
    if template is None and chat.template is not None:
        try:
            chat.template.compile_all()  # the template found beside the tokenizer
        except PromptError as exc:
            raise ConfigError(
                f"{tokenizer_key}: the chat template found beside {path} does not compile ({exc}); set "
                f"{where}.chat_template to one that does"
            ) from None
    return chat


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


# -- engine addresses -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineAddress:
    """One endpoint id's engine, as its host resolved at start."""

    endpoint: str
    url: str
    where: str
    """Where it is configured, for messages: ``models[0].endpoints[1].url``, or the adapter's own label."""
    host: str
    port: int
    addresses: tuple[str, ...]
    """The IP addresses the host resolved to (IPv4 first); empty when it did not resolve."""
    error: str | None = None
    """Why the host did not resolve; None when it did."""

    @property
    def socket_address(self) -> str | None:
        """``IP:port`` (``[IPv6]:port``) of the first address, as Envoy takes it; None when unresolved."""
        if not self.addresses:
            return None
        ip = self.addresses[0]
        return f"[{ip}]:{self.port}" if ":" in ip else f"{ip}:{self.port}"


def resolve_engines(config: CognitoraConfig, labels: Mapping[str, str] | None = None) -> dict[str, EngineAddress]:
    """Every endpoint id's engine, its host resolved now (once per host). ``labels``: endpoint id -> where it was
    configured, for an adapter whose user wrote something else than ``models[]`` (LiteLLM's ``model_list``).

    Raises ``ConfigError`` when two endpoint ids are one engine (the same port on a shared address), naming both.
    Hosts that do not resolve are in the answer with their ``error``: see ``unresolved_problems``.
    """
    engines: dict[str, EngineAddress] = {}
    resolved: dict[tuple[str, int], tuple[tuple[str, ...], str | None]] = {}
    for i, model in enumerate(config.models):
        for j, endpoint in enumerate(model.endpoints):
            if endpoint.id in engines:
                continue  # the same engine under several models: one id, one engine
            host, port = _host_port(endpoint.url)
            if (host, port) not in resolved:
                resolved[host, port] = _resolve(host, port)
            addresses, error = resolved[host, port]
            where = (labels or {}).get(endpoint.id) or f"models[{i}].endpoints[{j}].url"
            engines[endpoint.id] = EngineAddress(endpoint.id, endpoint.url, where, host, port, addresses, error)
    problems = _duplicates(list(engines.values()))
    if problems:
        raise ConfigError(_join(problems))
    return engines


def unresolved_problems(engines: Mapping[str, EngineAddress]) -> list[str]:
    """One message per endpoint whose host did not resolve, naming the entry, the endpoint and the host."""
    return [
        f"{e.where} ({e.url}): the host {e.host!r} of endpoint {e.endpoint} does not resolve ({e.error})"
        for e in engines.values()
        if e.error is not None
    ]


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _resolve(host: str, port: int) -> tuple[tuple[str, ...], str | None]:
    try:
        return (str(ipaddress.ip_address(host)),), None
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return (), str(exc)
    found = list(dict.fromkeys(str(info[4][0]) for info in infos))
    found.sort(key=lambda ip: ":" in ip)  # IPv4 first (stable): what Envoy's cluster lists are usually written in
    return tuple(found), None


def _duplicates(engines: list[EngineAddress]) -> list[str]:
    problems = []
    for k, a in enumerate(engines):
        for b in engines[k + 1 :]:
            shared = [ip for ip in a.addresses if ip in b.addresses]
            if a.port == b.port and shared:
                problems.append(
                    f"{a.where} ({a.url}) and {b.where} ({b.url}) are one engine ({shared[0]}:{a.port}), "
                    f"listed twice as endpoints {a.endpoint} and {b.endpoint}: its requests would be counted as two "
                    "engines' and its cache split between them; list it once"
                )
    return problems


def _join(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)


# -- the store ------------------------------------------------------------------------------------------------


def check_store(config: CognitoraConfig, timeout_s: float = STORE_CHECK_TIMEOUT_S) -> str | None:
    """Ask Redis at ``redis_url`` once (connect, AUTH, PING), synchronously: a process's start, before it serves.

    None when it answers, or when there is no ``redis_url``. Raises ``ConfigError`` naming ``redis_url`` (its
    password masked) when Redis refuses the credentials, or is not what ``redis_cluster`` says. Returns a warning
    naming ``redis_url`` when Redis does not answer: the process may start, degraded, and recovers when Redis does.
    """
    url = config.redis_url
    if url is None:
        return None
    from kvstate.redis_client import probe

    try:
        probe(url, cluster=config.redis_cluster, timeout_s=timeout_s)
    except StoreRefused as exc:
        raise ConfigError(f"redis_url ({redact_url(url)}): {exc}") from None
    except StoreUnavailable as exc:
        return (
            f"redis_url ({redact_url(url)}): {exc}. Starting anyway: decisions are degraded (no shared state) "
            "until Redis answers"
        )
    return None
