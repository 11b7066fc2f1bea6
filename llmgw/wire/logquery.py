"""The request log's query as control and gateways both speak it: the gateway endpoint control fans
`GET /api/v1/requests` out to (`PATH`), request ids (`ID_RE`, `gateway_tag`), and the filters both
sides read the same way (`Filters`, `QueryError`). The standard library and the priority classes only, so
the admin API and the gateway share it without either importing the other.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from llmgw.domain.priority import class_problem

PATH = "/api/v1/gateway/requests"
MAX_LIMIT = 1000
ID_RE = re.compile(r"req-([a-z0-9]{1,24})-[0-9a-f]{16}\Z")
_TAG_RE = re.compile(r"[^a-z0-9]")
_STATUS_RE = re.compile(r"[1-5](\d\d|xx)\Z")


def gateway_tag(name: str) -> str:
    """The part of a request id that names its gateway: the name's lowercase letters and digits."""
    return _TAG_RE.sub("", name.lower())[:24] or "gw"


class QueryError(ValueError):
    """A filter or cursor that cannot be read; the message names it."""


@dataclass(frozen=True)
class Filters:
    model: str | None = None
    key: str | None = None
    status: str | None = None  # "429", or a class: "4xx"
    since: float | None = None  # on the record's `time` (arrival), unix seconds, inclusive
    until: float | None = None  # exclusive
    priority: str | None = None  # the record's priority class (llmgw/domain/priority.py)

    @classmethod
    def parse(cls, query: dict[str, str]) -> Filters:
        status = query.get("status") or None
        if status is not None and not _STATUS_RE.match(status):
            raise QueryError(f"status must be a code (429) or a class (4xx), not {status!r:.40}")
        priority = query.get("priority") or None
        if priority is not None and (problem := class_problem(priority)) is not None:
            raise QueryError(problem)
        return cls(query.get("model") or None, query.get("key") if "key" in query else None, status,
                   _time(query, "since"), _time(query, "until"), priority)

    def match(self, doc: dict[str, Any]) -> bool:
        if self.model is not None and doc.get("model") != self.model:
            return False
        if self.key is not None and doc.get("key") != self.key:
            return False
        if self.status is not None:
            code = str(doc.get("status"))
            if code != self.status and not (self.status.endswith("xx") and code[:1] == self.status[0]):
                return False
        if self.priority is not None and doc.get("priority") != self.priority:
            return False
        t = doc.get("time")
        return isinstance(t, (int, float)) and self.in_time(t)

    def in_time(self, t: float | None) -> bool:
        if t is None:
            return True  # unknown here: the record's own check decides
        return (self.since is None or t >= self.since) and (self.until is None or t < self.until)

    def fields(self) -> list[tuple[str, str, bytes]]:
        """(field, value, bytes every matching line holds) for each equality in the filter."""
        out = []
        if self.key is not None:
            out.append(("key", self.key, b'"key":' + json_bytes(self.key) + b","))
        if self.model is not None:
            out.append(("model", self.model, b'"model":' + json_bytes(self.model) + b","))
        if self.status is not None:
            out.append(("status", self.status, b'"status":' + self.status.rstrip("x").encode()))
        return out

    def plan(self, summary: dict[str, Any] | None) -> tuple[bool, list[bytes], list[int] | None]:
        """How to read one segment: (skip it, needles with the rarest first, the candidate lines'
        offsets when the summary lists them). Without a summary (the open segment, or one left by a
        crash): every needle, no skipping. The summaries count no priority: its needle comes last."""
        fields = self.fields()
        last = [b'"priority":' + json_bytes(self.priority) + b","] if self.priority is not None else []
        needles = [n for _, _, n in fields] + last
        if summary is None:
            return False, needles, None
        try:
            if (self.since is not None and summary["end_max"] < self.since) or \
                    (self.until is not None and summary["time_min"] >= self.until):
                return True, [], None
            ranked = []
            for field, value, needle in fields:
                counts, rare = summary["counts"][field], summary["rare"][field]
                values = [v for v in counts if v.startswith(value[0])] if value.endswith("xx") else [value]
                n = sum(counts.get(v, 0) for v in values)
                if n == 0:
                    return True, [], None
                listed = [rare[v] for v in values if v in rare]
                offsets = sorted(o for group in listed for o in group) if len(listed) == len(values) else None
                ranked.append((n, needle, offsets))
        except (KeyError, TypeError, AttributeError):
            return False, needles, None
        ranked.sort(key=lambda r: r[0])
        return False, [needle for _, needle, _ in ranked] + last, ranked[0][2] if ranked else None


def json_bytes(value: str) -> bytes:
    """A string as the log's lines hold it (JSON, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False).encode()


def _time(query: dict[str, str], name: str) -> float | None:
    raw = query.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise QueryError(f"{name} must be unix seconds, not {raw!r:.40}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise QueryError(f"{name} must be a finite number")
    return value
