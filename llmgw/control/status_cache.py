"""`GET /api/v1/status` from the summary of the current inputs, built once: the look (`Look.compute`: the summary
and its conditions) is kept while nothing it reads has changed, and each page of it (`domain/summary_pages.py`) is
serialized once, so a request at the same revision of everything costs a comparison and a dictionary lookup, not a
summary of 1,000 nodes and 3 MB of JSON.

What it reads: the state (by identity: a state is a value, a new revision a new object), what the agents report (the
parts of `Observed` the summary reads, by equality), the reconciler's views, the webhooks' health and the members'
table without its ages. Figures read off the clock (ages, idle times, ETAs, the conditions' timers) move while
nothing else does, so a look is kept `status_cache_s`; a request for a look that has aged past it, while nothing
else changed, is still answered from it at once (up to `STALE` times `status_cache_s` old) while the next one is
built in a worker thread beside, so no request waits for a build only because time passed (a build at 1,000 nodes
takes 100 ms or more). A look whose inputs changed (a write, a report) is built before the answer, as is one
older than that bound. The notifier's check and the console's overview build their own looks
(`Context.look_beside`): never an aged one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from llmgw.domain.state import ClusterState
from llmgw.domain.summary import Summary
from llmgw.domain.summary_pages import StatusQuery, document

if TYPE_CHECKING:
    from llmgw.control.context import Look, LookInputs

BODIES_KEPT = 16  # serialized pages kept per look (a few clients, each its own page)
LOOK_BESIDE_NODES = 100  # a look of this many nodes or more is built in a worker thread (`compute_beside`)
STALE = 2  # a look aged past `status_cache_s` (nothing else changed) answers while under this many times it old
log = logging.getLogger("llmgw.control")
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


async def compute_beside(inputs: LookInputs) -> Look:
    """The look of `inputs`, built in a worker thread once the fleet has `LOOK_BESIDE_NODES` nodes or more (a look
    of 1,000 nodes takes 100 ms or more: the loop serves the agents' streams and other requests meanwhile); a small
    one on the loop, where it costs less than the hop."""
    if len(inputs.observed.nodes) < LOOK_BESIDE_NODES:
        return inputs.compute()
    return await trio.to_thread.run_sync(inputs.compute)


def _written(summary: Summary, query: StatusQuery) -> bytes:
    return json.dumps(document(summary, query)).encode()


@dataclass
class _Kept:
    inputs: Inputs
    look: Look
    bodies: dict[StatusQuery, bytes] = field(default_factory=dict)


@dataclass
class StatusCache:
    """The last look and its serialized pages. `builds` and `writes` count looks computed and pages serialized
    (what a request at an unchanged revision does not do); `refreshed` is set each time a look built beside
    (in a worker thread) is kept."""

    builds: int = 0
    writes: int = 0
    refreshed: trio.Event = field(default_factory=trio.Event)
    _kept: _Kept | None = None
    _refreshing: bool = False

    async def _look(self, inputs: LookInputs, keep_s: float) -> _Kept:
        seen = Inputs.of(inputs)
        kept = self._kept
        age = inputs.now - kept.look.now if kept is not None else -1.0
        if kept is None or not 0 <= age < keep_s * STALE or not kept.inputs.same(seen):
            kept = self._kept = _Kept(seen, await compute_beside(inputs))
            self.builds += 1
        elif age >= keep_s and not self._refreshing:
            self._refreshing = True
            trio.lowlevel.spawn_system_task(self._refresh, inputs, seen, name="status look, built beside")
        return kept

    async def _refresh(self, inputs: LookInputs, seen: Inputs) -> None:
        """Build the look of `inputs` in a worker thread and keep it, unless a newer one was kept meanwhile."""
        try:
            look = await trio.to_thread.run_sync(inputs.compute)  # whatever its size: nobody waits for it
        except Exception:  # a system task must not raise: the next request past STALE builds it, and says why
            log.exception("building the status look beside failed")
            return
        finally:
            self._refreshing = False
        kept = self._kept
        if kept is None or kept.look.now <= look.now:
            self._kept = _Kept(seen, look)
            self.builds += 1
        self.refreshed.set()
        self.refreshed = trio.Event()

    async def body(self, inputs: LookInputs, query: StatusQuery, keep_s: float) -> bytes:
        """The status document `query` asks for, as JSON bytes (`json.dumps`, as the admin API writes JSON): from
        the kept look, up to `STALE` times `keep_s` old when only the clock moved (a new one then built beside);
        otherwise from a look built now (`compute_beside`)."""
        kept = await self._look(inputs, keep_s)
        body = kept.bodies.get(query)
        if body is None:
            # A large fleet's page is written beside the loop too: `?full=1` at 1,000 nodes is 3.6 MB, 100 ms or more.
            if len(inputs.observed.nodes) < LOOK_BESIDE_NODES:
                body = _written(kept.look.summary, query)
            else:
                body = await trio.to_thread.run_sync(_written, kept.look.summary, query)
            if len(kept.bodies) >= BODIES_KEPT:
                kept.bodies.clear()
            kept.bodies[query] = body
            self.writes += 1
        return body
