"""Budget reports from the store alone (no gateway running): usage per team, key, user and model over a period,
and what is left of each limit now."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from zoneinfo import ZoneInfo

from cognitora.budgets.config import BudgetsConfig, Metric, SubjectKind
from cognitora.budgets.ledger import BudgetLedger
from cognitora.budgets.plan import MICRO, ROW_METRICS, Planner, Usage, unescape
from cognitora.identity import Identity

__all__ = ["LimitRow", "UsageRow", "format_report", "limit_rows", "usage_rows"]


@dataclass(frozen=True)
class UsageRow:
    period: str
    """The day (``YYYY-MM-DD``) or month (``YYYY-MM``)."""
    kind: str
    subject: str
    model: str
    target: str = "local"
    """Where it was served: ``local`` (the fleet), or the cloud target of a burst charge (``model@target``)."""
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    rejections: int = 0


@dataclass(frozen=True)
class LimitRow:
    kind: str
    subject: str
    limit: str
    """The config path of the cap: ``budgets.teams.alpha.limits[0].total_tokens``."""
    window: str
    used: float
    cap: float
    left: float
    resets_at: str


def days_between(since: dt.date, until: dt.date) -> list[str]:
    out = []
    day = since
    while day <= until:
        out.append(f"{day:%Y-%m-%d}")
        day += dt.timedelta(days=1)
    return out


async def usage_rows(
    ledger: BudgetLedger, days: Sequence[str], *, by: str = "day", team: str | None = None
) -> list[UsageRow]:
    """Usage rows over ``days``, summed per day (``by="day"``) or month; ``team``: that team's rows only."""
    acc: dict[tuple[str, str, str, str], dict[str, int]] = {}
    for day, fields in (await ledger.days(days)).items():
        period = day if by == "day" else day[:7]
        for name, value in fields.items():
            kind, subject, model, metric = name.split("\t")
            subject, model = unescape(subject), unescape(model)
            if team is not None and (kind != SubjectKind.TEAM.value or subject != team):
                continue
            row = acc.setdefault((period, kind, subject, model), {})
            row[metric] = row.get(metric, 0) + value
    out = []
    for (period, kind, subject, model), values in sorted(acc.items()):
        counts = {m: values.get(m, 0) for m in ROW_METRICS}
        # A charge's row is named ``model@target`` (charges.py): cloud usage is a row of its own, per target.
        base, at, target = model.rpartition("@")
        out.append(
            UsageRow(
                period=period,
                kind=kind,
                subject=subject,
                model=base if at else model,
                target=target if at else "local",
                requests=counts["requests"],
                input_tokens=counts["input_tokens"],
                output_tokens=counts["output_tokens"],
                cached_tokens=counts["cached_tokens"],
                cost_usd=counts["cost_micro_usd"] / MICRO,
                rejections=counts["rejections"],
            )
        )
    return out


async def limit_rows(
    ledger: BudgetLedger,
    config: BudgetsConfig,
    seen: Sequence[tuple[str, str]] = (),
    *,
    team: str | None = None,
    now: float | None = None,
) -> list[LimitRow]:
    """Each configured subject's limits (and those of ``seen`` subjects, under the defaults): used, cap, left."""
    now = time.time() if now is None else now
    planner = Planner(config)
    subjects: dict[tuple[SubjectKind, str], None] = {}
    for kind in SubjectKind:
        for name in config.subjects(kind):
            subjects[(kind, name)] = None
    for kind_name, name in seen:
        if name != "-":
            subjects[(SubjectKind(kind_name), name)] = None
    if team is not None:
        subjects = {k: None for k in subjects if k == (SubjectKind.TEAM, team)} or {(SubjectKind.TEAM, team): None}
    plans = []
    for kind, name in subjects:
        identity = Identity(
            team=name if kind is SubjectKind.TEAM else None,
            key=name if kind is SubjectKind.KEY else None,
            user=name if kind is SubjectKind.USER else None,
        )
        plans += list(planner.plan("-", identity, "-", Usage(), now).counters)
    values = await ledger.counter_values(plans, int(now * 1000))
    out = []
    for c, used in zip(plans, values, strict=True):
        scale = MICRO if c.metric is Metric.COST else 1
        resets = dt.datetime.fromtimestamp(c.resets_at_ms / 1000, ZoneInfo(config.time_zone)).isoformat()
        out.append(
            LimitRow(
                kind=c.subject_kind.value,
                subject=c.subject,
                limit=c.limit_path,
                window=c.window,
                used=used / scale,
                cap=c.cap / scale,
                left=max(0, c.cap - used) / scale,
                resets_at="rolling" if c.rolling else resets,
            )
        )
    return out


def format_report(usage: Sequence[UsageRow] | None, limits: Sequence[LimitRow], fmt: str) -> str:
    """``usage`` None: the limits alone (``cognitora budgets show``)."""
    if fmt == "json":
        data: dict[str, object] = {"limits": [asdict(li) for li in limits]}
        if usage is not None:
            data = {"usage": [asdict(u) for u in usage], **data}
        return json.dumps(data, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        if usage is not None:
            writer.writerow(list(UsageRow.__dataclass_fields__))
            writer.writerows([list(asdict(r).values()) for r in usage])
            writer.writerow([])
        writer.writerow(list(LimitRow.__dataclass_fields__))
        writer.writerows([list(asdict(r).values()) for r in limits])
        return buf.getvalue()
    limits_table = _table(
        ["kind", "subject", "limit", "window", "used", "cap", "left", "resets at"],
        [
            [li.kind, li.subject, li.limit, li.window, _n(li.used), _n(li.cap), _n(li.left), li.resets_at]
            for li in limits
        ],
    )
    if usage is None:
        return limits_table
    usage_table = _table(
        ["period", "kind", "subject", "model", "target", "requests", "input", "output", "cached", "cost $", "rejected"],
        [
            [
                u.period,
                u.kind,
                u.subject,
                u.model,
                u.target,
                u.requests,
                u.input_tokens,
                u.output_tokens,
                u.cached_tokens,
                f"{u.cost_usd:.4f}",
                u.rejections,
            ]
            for u in usage
        ],
    )
    return f"{usage_table}\n\n{limits_table}"


def _n(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.4f}"


def _table(header: list[str], rows: list[list[object]]) -> str:
    cells = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)
