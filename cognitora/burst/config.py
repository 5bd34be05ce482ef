"""``burst:`` in ``cognitora.yaml``: the cloud targets a saturated fleet may burst to, and who may burst.

Nothing leaves the premises unless an operator says so: with no ``teams`` (the default) no request bursts.
The API key is never in this file or in these models: ``credential_env`` names the environment variable that holds
it, read once at start-up by the gateway that needs it (Envoy's ext_proc) and registered with
``cognitora.redaction`` so no log line or error shows it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ANY_TEAM", "BurstConfig", "CloudTargetConfig"]

ANY_TEAM = "*"
"""In ``burst.teams``: every request that carries a team (from the gateway's authentication) may burst."""


class _Strict(BaseModel):
    # The same rules as cognitora.config's models (that module imports this one, so it cannot be imported here).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class CloudTargetConfig(_Strict):
    """One OpenAI-compatible cloud deployment a saturated model may send requests to."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Name of the target: in decisions, metrics, ``model_info.cognitora_cloud`` (LiteLLM) and the value of the
    ``envoy.lb`` metadata key ``x-cognitora-cloud`` that the Envoy cloud route matches. Letters, digits, ``_ . -``."""
    base_url: str | None = None
    """The provider's OpenAI-compatible base URL including its version path, e.g. ``https://api.openai.com/v1``.
    Required for Envoy (the ext_proc names the route); through LiteLLM the deployment's ``api_base`` is used."""
    credential_env: str | None = None
    """Name of the environment variable holding the API key the ext_proc injects as ``Authorization: Bearer``
    (Envoy only; LiteLLM's deployment has its own ``api_key: os.environ/...``). The key itself is never logged."""
    models: dict[str, str] = Field(default_factory=dict)
    """Local model name -> the cloud's model name for it (the ``model`` field is rewritten to it). Through LiteLLM
    it is filled from the ``cognitora_cloud`` deployment of the model group when absent."""
    input_usd_per_mtok: float = Field(default=0.0, ge=0)
    """Price of one million prompt tokens (USD), for the spend records and ``burst.team_spend_limit_usd``."""
    output_usd_per_mtok: float = Field(default=0.0, ge=0)
    """Price of one million completion tokens (USD)."""
    max_concurrency: int = Field(default=32, ge=1)
    """Requests this gateway process keeps in flight at the target at most; beyond it, requests stay local."""
    timeout_s: float = Field(default=120.0, gt=0)
    """The longest one request to this target may take, whole. Past it the core ends the attempt itself (a
    ``timeout``: its in-flight slot and spend hold are released, the breaker counts a failure), whatever the gateway
    reports later. Give the gateways the same bound and a much shorter one for a cloud that does not start answering
    (examples/envoy_burst.yaml: the route's ``timeout`` and ``per_try_idle_timeout``; examples/litellm_burst.yaml:
    the deployment's ``timeout`` and ``stream_timeout``): docs/burst.md, "Cloud failures"."""
    estimate_output_tokens: int = Field(default=512, ge=0)
    """Completion tokens assumed for a request without ``max_tokens``, in its spend estimate (the hold taken against
    ``burst.team_spend_limit_usd`` while it is in flight)."""
    named_teams: list[str] = Field(default_factory=list)
    """Teams (from the gateway's authentication) whose requests may name this target and be sent there without the
    saturation rule (LiteLLM: the deployment's id as ``model``); ``"*"``: every authenticated team. Still subject to
    the spend limit, the target's breaker and ``max_concurrency``, and counted and charged like a burst. Default:
    none: a request naming the target is placed like any request of its model (docs/burst.md, "Who reaches the
    cloud")."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"expected an http(s) URL like https://api.openai.com/v1, got {value!r}")
        return value.rstrip("/")

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        """What ``input_tokens`` in and ``output_tokens`` out cost at this target's prices."""
        return (input_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok) / 1e6

    def may_be_named_by(self, team: str | None) -> bool:
        """Whether ``team`` (trusted, from the gateway) may send requests here by naming the target."""
        return team is not None and (team in self.named_teams or ANY_TEAM in self.named_teams)


class BurstConfig(_Strict):
    """Burst to a cloud target when the local fleet cannot meet a priority class's TTFT SLO (docs/burst.md)."""

    targets: list[CloudTargetConfig] = Field(default_factory=list)
    """The cloud targets; the first that serves the request's model and has room is used."""
    teams: list[str] = Field(default_factory=list)
    """Teams (from the gateway's authentication, never the client) whose requests may burst; ``"*"``: every team.
    Empty (the default): nothing bursts."""
    priorities: list[str] = Field(default_factory=list)
    """Priority classes (``placement.priorities``) that may burst. Empty (the default): none."""
    enter_ratio: float = Field(default=1.0, gt=0)
    """A (model, class) enters burst when the best local endpoint's predicted TTFT exceeds ``enter_ratio`` x the
    class's SLO, or, for a class with ``itl_slo_s``, its predicted inter-token latency exceeds ``enter_ratio`` x
    that."""
    exit_ratio: float = Field(default=0.8, gt=0)
    """While in burst, a request still goes to the cloud when the best local endpoint is over ``exit_ratio`` x its
    objectives (as for ``enter_ratio``); the (model, class) leaves burst when a decision's best local endpoint is
    under it. Lower than ``enter_ratio``: the hysteresis that keeps a fleet at the edge from flapping."""
    min_dwell_s: float = Field(default=5.0, ge=0)
    """A (model, class) leaves burst only after every decision for this long had its best local endpoint under the
    exit threshold. Entering is immediate."""
    team_spend_limit_usd: dict[str, float] = Field(default_factory=dict)
    """Cloud spend (USD) per team after which its requests stop bursting (``"*"``: the limit of every team not
    named). With ``budgets:``, this calendar month's spend in the budgets store, shared by every replica
    (``cognitora.burst.ledger_spend``); without, in this gateway process since it started."""
    retry_after_s: float = Field(default=5.0, gt=0)
    """How long a target that answered 429 without a ``Retry-After`` header gets no requests."""
    unhealthy_s: float = Field(default=10.0, gt=0)
    """The breaker's first hold-off: how long a target that failed (5xx, a refused or reset connection, a timeout)
    gets no requests. Then ONE request goes there (half-open); its success closes the breaker, its failure doubles
    the hold-off, up to ``unhealthy_max_s``."""
    unhealthy_max_s: float = Field(default=120.0, gt=0)
    """The longest hold-off of a target that keeps failing its half-open probe."""
    breaker_failures: int = Field(default=1, ge=1)
    """Consecutive failed requests that open a target's breaker (a success in between starts the count again)."""
    probe_interval_s: float = Field(default=1.0, gt=0)
    """In burst, at most one request per this many seconds (and one at a time) whose best local endpoint is idle
    by measurement (nothing running, nothing queued) is placed there instead, as a probe: one that answers within the
    exit threshold ends the burst (docs/burst.md, "Letting go")."""

    @model_validator(mode="after")
    def _check(self) -> BurstConfig:
        if self.exit_ratio > self.enter_ratio:
            raise ValueError(
                f"exit_ratio ({self.exit_ratio:g}) must not exceed enter_ratio ({self.enter_ratio:g}): "
                "a class would leave burst before it entered"
            )
        if self.unhealthy_max_s < self.unhealthy_s:
            raise ValueError(
                f"unhealthy_max_s ({self.unhealthy_max_s:g}) must not be below unhealthy_s ({self.unhealthy_s:g}): "
                "the hold-off only grows"
            )
        names = [t.name for t in self.targets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"targets: the name(s) {', '.join(twice)} appear more than once; names must be unique")
        return self

    def target(self, name: str) -> CloudTargetConfig | None:
        """The target called ``name``, or None."""
        return next((t for t in self.targets if t.name == name), None)

    def team_may_burst(self, team: str | None) -> bool:
        """Whether ``team`` (trusted, from the gateway) is allowed to burst at all."""
        return team is not None and (team in self.teams or ANY_TEAM in self.teams)

    def spend_limit_usd(self, team: str) -> float | None:
        """The team's cloud spend limit (USD), or None for no limit."""
        return self.team_spend_limit_usd.get(team, self.team_spend_limit_usd.get(ANY_TEAM))
