"""The reconciler's first step: which replicas must go (model gone, definition changed, node lost,
failed start), each failure counted against its model, slot and node; and what a model's health
says in words. Pure; the rule itself is `domain.health`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

from llmgw.domain import commands, health
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState, ModelHealth, Placement, Strikes
from llmgw.domain.timeouts import Timeouts

Unit = tuple[Placement, ...]  # a replica: a lone placement, or a group's members in rank order


@functools.lru_cache(maxsize=16384)
def launch_of(model: ModelDef) -> str:
    """`model.launch_hash()`, once per definition: a pass asks it of every model, and hashing a
    definition (a frozen value) costs a fiftieth of computing its launch hash."""
    return model.launch_hash()


@dataclass
class Scan:
    """What the first step found, in an order that does not depend on replica ids."""

    gone: list[tuple[Unit, str]] = field(default_factory=list)  # units to remove, and why
    failures: list[tuple[Unit, dict[str, Any]]] = field(default_factory=list)  # (unit, its start_failed)
    failed: dict[str, int] = field(default_factory=dict)  # model -> failures seen in this pass
    failed_slots: dict[str, set[int]] = field(default_factory=dict)
    last_error: dict[str, str] = field(default_factory=dict)
    kept: dict[str, list[Unit]] = field(default_factory=dict)  # model -> its units that stay (fresh or not)
    ready: dict[str, list[Unit]] = field(default_factory=dict)  # model -> kept units whose head is ready
    # model -> its ready units that have served `stable_ready_s` (only their readiness breaks a row)
    steady: dict[str, list[Unit]] = field(default_factory=dict)
    flaps: dict[str, list[float]] = field(default_factory=dict)  # model -> how long this pass's flaps served


def scan(state: ClusterState, observed: Observed, now: float, timeouts: Timeouts, units: list[Unit]) -> Scan:
    out = Scan()
    hashes: dict[str, str] = {}
    for unit in units:
        head = unit[0]
        model = state.models.get(head.model)
        if model is not None and head.model not in hashes:
            hashes[head.model] = launch_of(model)
        lost = [p.node for p in unit
                if p.node not in observed.nodes and now - observed.gone_since(p.node) >= timeouts.lost_node_grace_s]
        failed = sorted(((o.since, p.rank, p, o) for p in unit
                         if (o := observed.replicas.get(p.replica_id)) is not None and o.state == "failed"),
                        key=lambda f: (f[0], f[1]))
        head_obs = observed.replicas.get(head.replica_id)
        ready = head.serves and head_obs is not None and head_obs.state == "ready"
        stale = model is not None and head.launch_hash != hashes[head.model]
        if model is None:
            out.gone.append((unit, "model removed"))
        elif not complete(unit):
            out.gone.append((unit, f"group {head.group} is incomplete"))
        elif lost:
            out.gone.append((unit, f"node {lost[0]} lost"))
        elif stale and (failed or not ready):
            # An old definition's replica that does not serve holds a place for nothing; its
            # failure says nothing of the new definition, so it is not counted.
            out.gone.append((unit, "definition changed"))
        elif head.asleep and (head_obs is None and head.node in observed.nodes
                              or head_obs is not None and head_obs.state in ("failed", "stopped")):
            # Fast wake: an asleep replica whose engine ended (its sleep failed, it exited, its agent restarted
            # without it) is gone; no start failed, nothing is counted. Its model starts cold when asked.
            error = head_obs.error if head_obs is not None and head_obs.error else "its engine is gone"
            out.gone.append((unit, f"ended while asleep: {error}"))
        elif failed:
            # The first member to fail is the likely cause (the others follow it out).
            _, rank, culprit, report = failed[0]
            error = report.error or "engine exited"
            if head.group:
                error = f"rank {rank} of {head.group} (on {culprit.node}) failed: {error}"
            out.gone.append((unit, "start failed"))
            if not state.model_health(head.model).parked:
                flap = health.flap_of(report.ready_s, timeouts) if state.store_level >= health.FLAPS_LEVEL else None
                out.failures.append((unit, commands.start_failed(
                    head.model, culprit.replica_id, error, now, slot=head.slot, node=culprit.node, ready_s=flap)))
                if flap is not None:
                    out.flaps.setdefault(head.model, []).append(flap)
                out.failed[head.model] = out.failed.get(head.model, 0) + 1
                out.failed_slots.setdefault(head.model, set()).add(head.slot)
                out.last_error[head.model] = error
        else:
            out.kept.setdefault(head.model, []).append(unit)
            if ready:
                out.ready.setdefault(head.model, []).append(unit)
                if head_obs is not None and health.steady(head_obs.since, now, timeouts):
                    out.steady.setdefault(head.model, []).append(unit)
    return out


def ready_commands(state: ClusterState, found: Scan, now: float) -> list[dict[str, Any]]:
    """`health.ready` for each replica of the current definition that has served `stable_ready_s`
    (a shorter readiness is a flap's, `health.steady`) and whose readiness clears something
    (`health.ready_clears`); none for a model that failed in this very pass: its failures are all
    counted first, so the outcome never depends on replica id order."""
    out = []
    for name in sorted(found.steady):
        model = state.models[name]
        h = state.model_health(name)
        if name in found.failed or h == ModelHealth():
            continue
        for unit in found.steady[name]:
            head = unit[0]
            if head.launch_hash == launch_of(model) and health.ready_clears(h, head.slot, head.node, head.placed_at):
                out.append(commands.became_ready(name, now, slot=head.slot, node=head.node, placed_at=head.placed_at))
                h = _cleared(h, head)
    return out


def _cleared(h: ModelHealth, head: Placement) -> ModelHealth:
    """The health once this ready replica's command applied (so a second one is sent only if it
    clears more)."""
    slots = tuple(s for s in h.slots if s.key != str(head.slot))
    nodes = tuple(s for s in h.nodes if s.key != head.node)
    if head.placed_at >= h.last_failure_at:
        return ModelHealth(slots=slots, nodes=nodes)
    return replace(h, slots=slots, nodes=nodes)


def failing_note(h: ModelHealth, avoided: dict[str, Strikes]) -> str:
    """A model's failures in words, for a view that is short of replicas: the row, the last
    error, and the nodes avoided (until when)."""
    if not h.failures_in_row and not avoided:
        return ""
    parts = []
    if h.failures_in_row:
        flaps = f" ({health.flap_words(h.flaps, h.flap_ready_s)})" if h.flaps else ""
        parts.append(f"{h.failures_in_row} failed start(s) in a row{flaps}, the last: {h.last_error or 'no error text'}")
    for node, s in sorted(avoided.items()):
        parts.append(f"node {node} avoided for it ({s.failures_in_row} failed starts there in a row)")
    return "; ".join(parts)


def parked_reason(name: str, failures: int, error: str, flaps: int, flap_ready_s: float) -> str:
    """`flaps`: how many of the failures were flaps, the longest serving `flap_ready_s`."""
    said = f" ({health.flap_words(flaps, flap_ready_s)})" if flaps else ""
    return (f"parked after {failures} failed starts in a row{said}: {error or 'no error text'}"
            f" — fix the definition or run `llmgw ctl model retry {name}`")


def oldest_first(units: list[Unit]) -> list[Unit]:
    return sorted(units, key=lambda u: (u[0].placed_at, u[0].replica_id))


def free_slots(taken: set[int], count: int) -> list[int]:
    """The `count` lowest slot numbers not taken."""
    out: list[int] = []
    slot = 0
    while len(out) < count:
        if slot not in taken:
            out.append(slot)
        slot += 1
    return out


def complete(unit: Unit) -> bool:
    """A lone replica, or a group with each of its ranks placed once."""
    return [p.rank for p in unit] == list(range(unit[0].group_size))
