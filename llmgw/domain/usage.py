"""Usage rollups in the replicated state: requests, tokens in/out, errors and refusals per hour, key
and model (UsageHour, UsageRow), the newest batch applied from each gateway process (UsageMark), and
the queries over them. The `usage.add` command that adds a gateway's batch lives in `commands/usage.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmgw.domain.state import ClusterState

COUNTS = ("requests", "tokens_in", "tokens_out", "errors", "refusals")


@dataclass(frozen=True)
class UsageRow:
    """One hour of one key's use of one model (`key`/`model` "" when the request had none)."""

    key: str
    model: str
    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    errors: int = 0  # answered >= 400 after a replica was called
    refusals: int = 0  # answered >= 400 by the gateway itself (no replica called)


@dataclass(frozen=True)
class UsageHour:
    start: int  # unix seconds, a multiple of 3600
    rows: tuple[UsageRow, ...] = ()  # sorted by (key, model)


@dataclass(frozen=True)
class UsageMark:
    """The newest batch applied from one gateway process, and where that gateway answers queries."""

    gateway: str
    seq: int
    at: float
    query_url: str = ""


def query(state: ClusterState, *, since: float, until: float, key: str | None = None,
          model: str | None = None, by: str = "total") -> list[dict[str, Any]]:
    """The committed rollups between `since` and `until` (hours that overlap them), summed per
    (key, model) and, with `by` "hour" or "day", per period; newest period first."""
    sums: dict[tuple[int, str, str], list[int]] = {}
    for hour in state.usage.values():
        if hour.start + 3600 <= since or hour.start >= until:
            continue
        period = hour.start if by == "hour" else hour.start - hour.start % 86400 if by == "day" else 0
        for r in hour.rows:
            if (key is not None and r.key != key) or (model is not None and r.model != model):
                continue
            total = sums.setdefault((period, r.key, r.model), [0] * len(COUNTS))
            for i, n in enumerate(COUNTS):
                total[i] += getattr(r, n)
    out = []
    for (period, k, m), counts in sorted(sums.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2])):
        doc: dict[str, Any] = {"key": k, "model": m, **dict(zip(COUNTS, counts))}
        if by != "total":
            doc["period_start"] = period
        out.append(doc)
    return out


def gateways(state: ClusterState) -> dict[str, UsageMark]:
    """Each gateway that sent usage within the retention, by name: its newest mark (its query URL)."""
    out: dict[str, UsageMark] = {}
    for mark in state.usage_marks.values():
        if mark.gateway not in out or mark.at > out[mark.gateway].at:
            out[mark.gateway] = mark
    return out
