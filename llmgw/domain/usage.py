"""Usage rollups in the replicated state: requests, tokens in/out, errors and refusals per hour, key
and model, and the `usage.add` command that adds a gateway's batch of them once per (gateway, boot, seq).

A gateway sends its deltas in small numbered batches; `apply` remembers the newest seq of each
gateway process (`UsageMark`), so a batch sent again after a lost answer changes nothing. Hours
older than `usage.retention_days` are dropped as new batches arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from llmgw.domain.settings import effective

if TYPE_CHECKING:
    from llmgw.domain.state import ClusterState

MAX_ROWS = 500  # rows in one batch: one command stays small
NAME_MAX_CHARS = 200
COUNTS = ("requests", "tokens_in", "tokens_out", "errors", "refusals")


class UsageError(ValueError):
    pass


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


def row_doc(hour: int, key: str, model: str, requests: int, tokens_in: int, tokens_out: int,
            errors: int, refusals: int) -> dict[str, Any]:
    return {"hour": hour, "key": key, "model": model, "requests": requests, "tokens_in": tokens_in,
            "tokens_out": tokens_out, "errors": errors, "refusals": refusals}


def add_usage(gateway: str, boot: str, seq: int, rows: list[dict[str, Any]], query_url: str,
              at: float) -> dict[str, Any]:
    return {"v": 1, "op": "usage.add", "at": at, "gateway": gateway, "boot": boot, "seq": seq, "rows": rows,
            "query_url": query_url}


def _text(c: dict[str, Any], key: str, *, empty: bool = False) -> str:
    value = c.get(key)
    if not isinstance(value, str) or len(value) > NAME_MAX_CHARS or (not value and not empty):
        raise UsageError(f"{key} must be a string of {0 if empty else 1}..{NAME_MAX_CHARS} characters")
    return value


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 53


def check_add(c: dict[str, Any]) -> None:
    """Raises UsageError (the caller makes it a CommandError) unless the batch is well formed."""
    _text(c, "gateway")
    _text(c, "boot")
    _text(c, "query_url", empty=True)
    if not _count(c.get("seq")) or c["seq"] < 1:
        raise UsageError("seq must be a whole number >= 1")
    rows = c.get("rows")
    if not isinstance(rows, list) or not 0 < len(rows) <= MAX_ROWS:
        raise UsageError(f"rows must be a list of 1..{MAX_ROWS} rows")
    for row in rows:
        if not isinstance(row, dict):
            raise UsageError("a row is an object")
        hour = row.get("hour")
        if not isinstance(hour, int) or not _count(hour) or hour % 3600:
            raise UsageError("a row's hour is unix seconds, a multiple of 3600")
        _text(row, "key", empty=True)
        _text(row, "model", empty=True)
        if not all(_count(row.get(k)) for k in COUNTS):
            raise UsageError(f"a row's {', '.join(COUNTS)} are whole numbers >= 0")


def apply_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    mark_id = f"{c['gateway']}/{c['boot']}"
    mark = s.usage_marks.get(mark_id)
    if mark is not None and mark.seq >= c["seq"]:
        return s, {"applied": False}  # sent again after a lost answer: already counted
    by_hour: dict[int, list[dict[str, Any]]] = {}
    for row in c["rows"]:
        by_hour.setdefault(row["hour"], []).append(row)
    hours = s.usage.copy()
    for start, rows in by_hour.items():
        hours[str(start)] = _added(hours.get(str(start)), start, rows)
    horizon = at - float(effective(s.settings, "usage.retention_days")) * 86400
    hours = {k: h for k, h in hours.items() if h.start + 3600 > horizon}
    marks = {k: m for k, m in s.usage_marks.items() if m.at > horizon}
    marks[mark_id] = UsageMark(c["gateway"], c["seq"], at, c.get("query_url", ""))
    return replace(s, usage=MappingProxyType(hours), usage_marks=MappingProxyType(marks)), {"applied": True}


def _added(hour: UsageHour | None, start: int, rows: list[dict[str, Any]]) -> UsageHour:
    table = {(r.key, r.model): r for r in (hour.rows if hour else ())}
    for row in rows:
        k = (row["key"], row["model"])
        old = table.get(k) or UsageRow(*k)
        table[k] = UsageRow(k[0], k[1], *(getattr(old, n) + row[n] for n in COUNTS))
    return UsageHour(start, tuple(table[k] for k in sorted(table)))


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
