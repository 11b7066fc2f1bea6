"""`GET /api/v1/status` from the summary of the current inputs, built once: the look (`Look.compute`: the summary
and its conditions) is kept while nothing it reads has changed, and each page of it (`domain/summary_pages.py`) is
serialized once, so a request at the same revision of everything costs a comparison and a dictionary lookup, not a
summary of 1,000 nodes and 3 MB of JSON.

What it reads: the state (by identity: a state is a value, a new revision a new object), what the agents report (the
parts of `Observed` the summary reads, by equality), the reconciler's views, the webhooks' health and the members'
table without its ages. Figures read off the clock (ages, idle times, ETAs, the conditions' timers) move while
nothing else does, so a look is kept `status_cache_s` at most: they are never older than that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmgw.domain.state import ClusterState
from llmgw.domain.summary_pages import StatusQuery, document

if TYPE_CHECKING:
    from llmgw.control.context import Look, LookInputs

BODIES_KEPT = 16  # serialized pages kept per look (a few clients, each its own page)
_AGED = ("last_contact", "last_contact_age_s")  # what the members' table says of the clock


def steady(table: Mapping[str, Any]) -> dict[str, Any]:
    """The members' table without what moves with the clock alone (each row's last contact and its age)."""
    out = dict(table)
    for part in ("members", "agents", "gateways"):
        rows = table.get(part)
        if isinstance(rows, list):
            out[part] = [{k: v for k, v in r.items() if k not in _AGED} if isinstance(r, Mapping) else r
                         for r in rows]
    return out


@dataclass(frozen=True)
class Inputs:
    """What a look read, as compared with the next request's."""

    state: ClusterState
    observed: tuple[Any, ...]
    views: Any
    webhooks: tuple[Mapping[str, Any], ...]
    cluster: Mapping[str, Any]

    @classmethod
    def of(cls, inputs: LookInputs) -> Inputs:
        o = inputs.observed
        return cls(inputs.state, (o.nodes, o.replicas, o.lost, o.demand, o.restarts, o.judge_failures, o.since),
                   inputs.views, inputs.webhooks, steady(inputs.cluster))

    def same(self, other: Inputs) -> bool:
        return (self.state is other.state and self.observed == other.observed and self.views == other.views
                and self.webhooks == other.webhooks and self.cluster == other.cluster)


@dataclass
class _Kept:
    inputs: Inputs
    look: Look
    bodies: dict[StatusQuery, bytes] = field(default_factory=dict)


@dataclass
class StatusCache:
    """The last look and its serialized pages. `builds` and `writes` count looks computed and pages serialized
    (what a request at an unchanged revision does not do)."""

    builds: int = 0
    writes: int = 0
    _kept: _Kept | None = None

    def look(self, inputs: LookInputs, keep_s: float) -> Look:
        """The look of `inputs`: the kept one when nothing it read has changed and it is under `keep_s` old."""
        seen = Inputs.of(inputs)
        kept = self._kept
        if kept is None or not 0 <= inputs.now - kept.look.now < keep_s or not kept.inputs.same(seen):
            kept = self._kept = _Kept(seen, inputs.compute())
            self.builds += 1
        return kept.look

    def body(self, inputs: LookInputs, query: StatusQuery, keep_s: float) -> bytes:
        """The status document `query` asks for, as JSON bytes (`json.dumps`, as the admin API writes JSON)."""
        self.look(inputs, keep_s)
        kept = self._kept
        assert kept is not None
        body = kept.bodies.get(query)
        if body is None:
            if len(kept.bodies) >= BODIES_KEPT:
                kept.bodies.clear()
            body = kept.bodies[query] = json.dumps(document(kept.look.summary, query)).encode()
            self.writes += 1
        return body
