"""The usage command: `usage.add` (a gateway's batch of hourly rollups per key and model); its
builders, stateless check and change. The rollups' shape and the queries over them are
`domain.usage`'s.

A gateway sends its deltas in small numbered batches; the change remembers the newest seq of each
gateway process (`UsageMark`, by "gateway/boot"), so a batch sent again after a lost answer changes
nothing. Hours older than `usage.retention_days` are dropped as new batches arrive.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain.commands.core import CommandError, make, readonly
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState
from llmgw.domain.usage import COUNTS, UsageHour, UsageMark, UsageRow

MAX_ROWS = 500  # rows in one batch: one command stays small
NAME_MAX_CHARS = 200


def row_doc(hour: int, key: str, model: str, requests: int, tokens_in: int, tokens_out: int,
            errors: int, refusals: int) -> dict[str, Any]:
    """One row of a `usage.add` batch: an hour of one key's use of one model."""
    return {"hour": hour, "key": key, "model": model, "requests": requests, "tokens_in": tokens_in,
            "tokens_out": tokens_out, "errors": errors, "refusals": refusals}


def add_usage(gateway: str, boot: str, seq: int, rows: list[dict[str, Any]], query_url: str,
              at: float) -> dict[str, Any]:
    return make("usage.add", at, gateway=gateway, boot=boot, seq=seq, rows=rows, query_url=query_url)


def _text(c: dict[str, Any], key: str, *, empty: bool = False) -> str:
    value = c.get(key)
    if not isinstance(value, str) or len(value) > NAME_MAX_CHARS or (not value and not empty):
        raise CommandError("bad_command", f"{key} must be a string of {0 if empty else 1}..{NAME_MAX_CHARS} characters")
    return value


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 53


def check_add(c: dict[str, Any]) -> None:
    """Refuses the batch (`bad_command`) unless it is well formed."""
    _text(c, "gateway")
    _text(c, "boot")
    _text(c, "query_url", empty=True)
    if not _count(c.get("seq")) or c["seq"] < 1:
        raise CommandError("bad_command", "seq must be a whole number >= 1")
    rows = c.get("rows")
    if not isinstance(rows, list) or not 0 < len(rows) <= MAX_ROWS:
        raise CommandError("bad_command", f"rows must be a list of 1..{MAX_ROWS} rows")
    for row in rows:
        if not isinstance(row, dict):
            raise CommandError("bad_command", "a row is an object")
        hour = row.get("hour")
        if not isinstance(hour, int) or not _count(hour) or hour % 3600:
            raise CommandError("bad_command", "a row's hour is unix seconds, a multiple of 3600")
        _text(row, "key", empty=True)
        _text(row, "model", empty=True)
        if not all(_count(row.get(k)) for k in COUNTS):
            raise CommandError("bad_command", f"a row's {', '.join(COUNTS)} are whole numbers >= 0")


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
    return replace(s, usage=readonly(hours), usage_marks=readonly(marks)), {"applied": True}


def _added(hour: UsageHour | None, start: int, rows: list[dict[str, Any]]) -> UsageHour:
    table = {(r.key, r.model): r for r in (hour.rows if hour else ())}
    for row in rows:
        k = (row["key"], row["model"])
        old = table.get(k) or UsageRow(*k)
        table[k] = UsageRow(k[0], k[1], *(getattr(old, n) + row[n] for n in COUNTS))
    return UsageHour(start, tuple(table[k] for k in sorted(table)))
