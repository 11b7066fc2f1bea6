"""Draining a node (`ctl nodes drain`; `ClusterState.cordoned_nodes` says "drain"): its replicas move
elsewhere one at a time, each replaced before it stops, so a model with a ready replica never has none.

A replica on a draining node that serves is a stand-in: the model places a replacement on another node
(the node itself is cordoned: placement refuses it), one per node at a time (the node's *move in flight*:
a model with a serving replica there and another of its replicas, elsewhere, not ready yet). Once the
replacement is ready the stand-in leaves the routes (gateways send it nothing new; what it serves goes on)
and is removed `drain_stop_grace_s` after the replacement became ready (then its agent stops it). A
replica there that does not serve yet moves at once: no one loses a ready replica by it. When nothing fits
elsewhere the drain waits and says why (`DrainView.blocked`: the placement's reasons).

Pure, like the rest of `reconcile`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState, Placement
from llmgw.reconcile.failures import Scan, Unit, launch_of


@dataclass(frozen=True)
class DrainView:
    """A draining node's progress: the replicas still placed there, the model whose replacement is
    starting (one at a time), and why the next cannot move (empty: nothing blocks)."""

    node: str
    left: int
    moving: str = ""
    blocked: str = ""

    def words(self) -> str:
        if self.left == 0:
            return "drained: no replica left"
        out = f"draining: {self.left} replica{'s' if self.left != 1 else ''} left"
        if self.blocked:
            return f"{out}; blocked: {self.blocked}"
        if self.moving:
            return f"{out}; moving {self.moving} (waiting for its replacement to be ready)"
        return out


def draining(state: ClusterState) -> frozenset[str]:
    """The nodes being drained."""
    return frozenset(n for n, mode in state.cordoned_nodes.items() if mode == "drain")


def on(unit: Unit, nodes: frozenset[str]) -> bool:
    """Whether any member of the replica runs on one of `nodes`."""
    return any(p.node in nodes for p in unit)


def in_flight(state: ClusterState, found: Scan, nodes: frozenset[str]) -> dict[str, str]:
    """Draining node -> the model whose move is in flight there: one with a serving replica on the node and
    another of its current definition's replicas, off every draining node, not ready yet."""
    out: dict[str, str] = {}
    if not nodes:
        return out
    for name in sorted(found.kept):
        model = state.models.get(name)
        if model is None:
            continue
        ready = {u[0].replica_id for u in found.ready.get(name, [])}
        units = found.kept[name]
        serving_there = {p.node for u in units if u[0].replica_id in ready and on(u, nodes)
                         for p in u if p.node in nodes}
        launch = launch_of(model)
        starting = any(u[0].launch_hash == launch and not on(u, nodes) and u[0].replica_id not in ready
                       for u in units)
        if starting:
            for node in sorted(serving_there):
                out.setdefault(node, name)
    return out


def ready_since(units: Iterable[Unit], ready: set[str], observed: Observed) -> float | None:
    """When the latest of these units' ready heads became ready (None: none is ready)."""
    times = [o.since for u in units if u[0].replica_id in ready
             and (o := observed.replicas.get(u[0].replica_id)) is not None]
    return max(times, default=None)


def views(nodes: frozenset[str], kept: Mapping[str, Placement], moving: Mapping[str, str],
          blocked: Mapping[str, str]) -> dict[str, DrainView]:
    """Each draining node's progress, from the placements that stay after this pass."""
    left: dict[str, set[str]] = {n: set() for n in nodes}
    for p in kept.values():
        if p.node in left:
            left[p.node].add(p.group or p.replica_id)
    return {n: DrainView(n, len(left[n]), moving.get(n, "") if left[n] else "",
                         blocked.get(n, "") if left[n] else "") for n in sorted(nodes)}
