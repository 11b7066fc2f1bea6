"""`GET /api/v1/status`'s document, aggregates first: the lists that grow with the fleet (a row per node, per
model, per model holding replicas, per machine's certificate) carry a page of their rows, and `pages` says where the page starts, how long it
may be and how many rows there are. `?full=1` is the whole document (every row, no `pages`: `Summary.to_doc()`,
as before 0.3.0). Pure: `StatusQuery.parse` reads the query, `document` writes the summary's page.

The facts the pages leave out are still said by the aggregates (`node_counts`, `totals`, `capacity`...), so
`ctl status`, the console and the notifier show what they showed; `GET /api/v1/nodes` and
`GET /api/v1/models` list each row too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from llmgw.domain.summary import Summary

# The lists paged (a row per node, per model, per model holding replicas, per machine's certificate), and the
# rows of each a plain `GET /api/v1/status` carries.
DEFAULT_ROWS = {"nodes": 20, "models": 100, "idle": 20, "certificates": 20}
MAX_ROWS = 1_000_000  # the most a page may ask for (any fleet's every row)
FLAGS = ("full", "short")
PARAMS = (*FLAGS, *(k for name in DEFAULT_ROWS for k in (name, f"{name}_offset")))
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no", "")

Row = TypeVar("Row")


@dataclass(frozen=True)
class Window:
    """Rows `offset` to `offset + limit` of a list."""

    offset: int
    limit: int

    def of(self, rows: Sequence[Row]) -> tuple[Row, ...]:
        return tuple(rows[self.offset:self.offset + self.limit])

    def doc(self, total: int) -> dict[str, Any]:
        return {"offset": self.offset, "limit": self.limit, "total": total}


@dataclass(frozen=True)
class StatusQuery:
    """What a status request asks for: every row (`full`), or a window of each paged list, the models' rows
    only those short of what they should have now (`short`: `satisfied` not true)."""

    full: bool = False
    nodes: Window = Window(0, DEFAULT_ROWS["nodes"])
    models: Window = Window(0, DEFAULT_ROWS["models"])
    idle: Window = Window(0, DEFAULT_ROWS["idle"])
    certificates: Window = Window(0, DEFAULT_ROWS["certificates"])
    short: bool = False

    @classmethod
    def parse(cls, args: Mapping[str, str]) -> StatusQuery:
        """The query of `GET /api/v1/status`; ValueError saying what is wrong (a parameter it does not take is
        refused, not ignored: a misspelt `nodes` would otherwise answer the default page)."""
        unknown = sorted(k for k in args if k not in PARAMS)
        if unknown:
            raise ValueError(f"unknown query parameter {unknown[0]!r:.60}; this route takes {', '.join(PARAMS)}")
        flags = {k: _flag(k, args[k]) for k in FLAGS if k in args}
        windows = {name: Window(_count(f"{name}_offset", args.get(f"{name}_offset"), 0),
                                _count(name, args.get(name), DEFAULT_ROWS[name])) for name in DEFAULT_ROWS}
        if flags.get("full") and len(args) > 1:
            raise ValueError("full=1 is every row of every list: leave out the other parameters")
        return cls(full=flags.get("full", False), short=flags.get("short", False), **windows)


def _flag(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{name} is 1 or 0 (true or false), not {value!r:.40}")


def _count(name: str, value: str | None, default: int) -> int:
    if value is None:
        return default
    if not (value.isascii() and value.isdigit() and len(value) <= len(str(MAX_ROWS))) or int(value) > MAX_ROWS:
        raise ValueError(f"{name} must be a whole number from 0 to {MAX_ROWS}, not {value!r:.40}")
    return int(value)


def document(s: Summary, q: StatusQuery) -> dict[str, Any]:
    """The status document `q` asks for: `s.to_doc()` with each paged list cut to its window and `pages` added
    (the agents the members' table lists: those of the nodes listed), or the whole of it (`full`)."""
    if q.full:
        return s.to_doc()
    models = tuple(m for m in s.models if m.satisfied is not True) if q.short else s.models
    nodes = q.nodes.of(s.nodes)
    cluster = s.cluster
    if cluster.agents is not None:
        listed = {n.node for n in nodes}
        cluster = replace(cluster, agents=tuple(a for a in cluster.agents if a.get("node") in listed))
    page = replace(s, cluster=cluster, nodes=nodes, models=q.models.of(models), idle=q.idle.of(s.idle),
                   certificates=q.certificates.of(s.certificates))
    return {**page.to_doc(), "pages": {
        "nodes": q.nodes.doc(len(s.nodes)),
        "models": {**q.models.doc(len(models)), "short": q.short},
        "idle": q.idle.doc(len(s.idle)),
        "certificates": q.certificates.doc(len(s.certificates)),
    }}
