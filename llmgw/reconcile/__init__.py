"""The reconciler's brain (S3): `decide(state, observed, now, timeouts) -> Plan`.

Level-triggered and pure: each call recomputes, from the whole snapshot and
what agents report, the commands to commit, the start/stop messages for agents
and the routing table. Rerunning it on the same input gives the same plan.

A multi-node replica (a group) is one unit here: placed, scaled, failed and removed whole.
Its members (rank >= 1) start first; rank 0 starts once every member reports starting or
ready, and is the replica's only endpoint; stops go to rank 0 first. A member that fails
fails the group: one start failure counted, every member stopped, the group placed again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute, Observed, ReplicaObs
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, Placement
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.placement import place


def retry_backoff(failures_in_row: int, timeouts: Timeouts = TIMEOUTS) -> float:
    """Seconds to wait after the n-th failed start before placing again: 1, 2, 4, ... 30 by default."""
    if failures_in_row <= 0:
        return 0.0
    return min(timeouts.start_backoff_first_s * 2.0 ** (failures_in_row - 1), timeouts.start_backoff_max_s)


@dataclass(frozen=True)
class AgentAction:
    node: str
    kind: str  # "start" | "stop"
    replica_id: str
    model: dict[str, Any] = field(default_factory=dict)  # the definition, for "start"
    gpus: tuple[int, ...] = ()
    # A group member's start: {"rank", "size", "leader": "host:port", "address": this member's
    # "host:port" in the group (the leader's port, on its own node: where a llama.cpp rpc-server
    # listens)}, and for rank 0 "members": the other ranks' addresses in rank order. None when alone.
    group: dict[str, Any] | None = None

    def message(self) -> dict[str, Any]:
        if self.kind == "start":
            doc = {"type": "start_replica", "replica_id": self.replica_id, "model": self.model,
                   "gpus": list(self.gpus)}
            if self.group is not None:
                doc["group"] = dict(self.group)
            return doc
        return {"type": "stop_replica", "replica_id": self.replica_id}


@dataclass(frozen=True)
class ModelView:
    """A model counted against what it should have now (S3)."""

    name: str
    desired: int
    placed: int
    ready: int
    starting: int
    state: str  # a ROUTE_STATES value
    reason: str


@dataclass(frozen=True)
class Plan:
    commands: tuple[dict[str, Any], ...]
    actions: tuple[AgentAction, ...]
    routes: dict[str, ModelRoute]
    views: dict[str, ModelView]
    unplaceable: dict[str, str]  # model -> why no node fits


def desired_replicas(state: ClusterState, model: ModelDef, observed: Observed, now: float) -> int:
    if effective(state.settings, "serving.stopped") or state.model_health(model.name).parked:
        return 0
    if model.mode == "always":
        return model.replicas_min
    asked = observed.demand.get(model.name)
    wanted = asked is not None and now - asked < model.idle_timeout_s
    return max(model.replicas_min, 1 if wanted else 0)


def decide(state: ClusterState, observed: Observed, now: float, timeouts: Timeouts = TIMEOUTS) -> Plan:
    cmds: list[dict[str, Any]] = []
    removed: set[str] = set()
    failed_models: dict[str, int] = {}

    def remove(p: Placement, why: str) -> None:
        if p.replica_id not in removed:
            removed.add(p.replica_id)
            cmds.append(commands.remove_placement(p.replica_id, now, reason=why))

    # 1. Replicas that must go: their model went or changed, their node is lost,
    #    they failed to start (a group: any member). Failures are all counted before
    #    any "ready" is recorded, so the outcome never depends on replica id order.
    ready_models: set[str] = set()
    last_error: dict[str, str] = {}
    for unit in units(state.placements.values()):
        head = unit[0]
        model = state.models.get(head.model)
        lost = [p.node for p in unit
                if p.node not in observed.nodes and now - observed.gone_since(p.node) >= timeouts.lost_node_grace_s]
        failed = sorted(((o.since, p.rank, p, o) for p in unit
                         if (o := observed.replicas.get(p.replica_id)) is not None and o.state == "failed"),
                        key=lambda f: (f[0], f[1]))
        head_obs = observed.replicas.get(head.replica_id)
        failure: dict[str, Any] | None = None
        if model is None:
            why = "model removed"
        elif head.launch_hash != model.launch_hash():
            why = "definition changed"
        elif not complete(unit):
            why = f"group {head.group} is incomplete"
        elif lost:
            why = f"node {lost[0]} lost"
        elif failed:
            # The first member to fail is the likely cause (the others follow it out).
            _, rank, culprit, report = failed[0]
            error = report.error or "engine exited"
            if head.group:
                error = f"rank {rank} of {head.group} (on {culprit.node}) failed: {error}"
            why = "start failed"
            if not state.model_health(head.model).parked:
                failure = commands.start_failed(head.model, culprit.replica_id, error, now)
                failed_models[head.model] = failed_models.get(head.model, 0) + 1
                last_error[head.model] = error
        else:
            if head.serves and head_obs is not None and head_obs.state == "ready":
                ready_models.add(head.model)
            continue
        for member in unit:
            remove(member, why)
        if failure is not None:
            cmds.append(failure)
    for name in sorted(ready_models):
        health = state.model_health(name)
        if health.failures_in_row and not health.parked and name not in failed_models:
            cmds.append(commands.became_ready(name, now))

    # 2. Scale each model toward what it should have now.
    live = [p for p in state.placements.values() if p.replica_id not in removed]
    unplaceable: dict[str, str] = {}
    desired: dict[str, int] = {}
    parking: dict[str, tuple[int, str]] = {}  # parked by this very pass: failures, last error
    for name in sorted(state.models):
        model = state.models[name]
        want = desired_replicas(state, model, observed, now)
        if name in failed_models:
            park_after = int(effective(state.settings, "health.park_after_failures"))
            if state.model_health(name).failures_in_row + failed_models[name] >= park_after:
                want = 0  # this pass parks it; do not place it again
                parking[name] = (state.model_health(name).failures_in_row + failed_models[name], last_error[name])
        desired[name] = want
        health = state.model_health(name)
        waiting = name in failed_models or (
            health.failures_in_row > 0 and now - health.last_failure_at < retry_backoff(health.failures_in_row, timeouts)
        )
        mine = sorted(units(p for p in live if p.model == name), key=lambda u: (u[0].placed_at, u[0].replica_id))
        for extra in mine[want:][::-1]:
            for p in extra:
                remove(p, "scaled down")
                live.remove(p)
        for _ in range(want - len(mine) if not waiting else 0):
            result = place(model, observed.nodes, live)
            if result.choice is None:
                unplaceable[name] = result.reason()
                break
            choice, launch, pending = result.choice, model.launch_hash(), f"(pending-{name}-{len(live)})"
            if choice.members:
                members = [(m.node, m.gpus, m.host) for m in choice.members]
                live.extend(Placement(f"{pending}-r{rank}", name, m.node, m.gpus, launch, now, group=pending,
                                      rank=rank, group_size=len(members)) for rank, m in enumerate(choice.members))
                cmds.append(commands.add_group(name, members, launch, now))
            else:
                live.append(Placement(pending, name, choice.node, choice.gpus, launch, now))
                cmds.append(commands.add_placement(name, choice.node, choice.gpus, launch, now))

    # 3. Tell agents: start what is placed and not running, stop what runs unplaced.
    actions: list[AgentAction] = []
    kept = {rid: p for rid, p in state.placements.items() if rid not in removed}
    for unit in units(kept.values()):
        for p in unit:
            obs = observed.replicas.get(p.replica_id)
            if p.node not in observed.nodes or (obs is not None and obs.state != "stopped"):
                continue
            if p.group and p.rank == 0 and not all(_running(observed, m) for m in unit[1:]):
                continue  # rank 0 serves once every member has joined: it starts after them
            actions.append(AgentAction(p.node, "start", p.replica_id, state.models[p.model].to_doc(), p.gpus,
                                       _group_doc(p, unit)))
    # Stops: every rank 0 (and lone replica) first, then the members, whose leader is gone by then.
    stops = [(rank_of(rid, state), rid, obs.node) for rid, obs in observed.replicas.items()
             if rid not in kept and obs.state != "stopped" and obs.node in observed.nodes]
    actions.extend(AgentAction(node, "stop", rid) for _, rid, node in sorted(stops))

    views, routes = _views(state, observed, kept, desired, unplaceable, parking)
    return Plan(tuple(cmds), tuple(actions), routes, views, unplaceable)


def _views(
    state: ClusterState,
    observed: Observed,
    kept: dict[str, Placement],
    desired: dict[str, int],
    unplaceable: dict[str, str],
    parking: dict[str, tuple[int, str]],
) -> tuple[dict[str, ModelView], dict[str, ModelRoute]]:
    stopped = bool(effective(state.settings, "serving.stopped"))
    views: dict[str, ModelView] = {}
    routes: dict[str, ModelRoute] = {}
    for name, model in sorted(state.models.items()):
        mine = [p for p in kept.values() if p.model == name and p.serves]  # a group counts once, as its rank 0
        obs: list[ReplicaObs] = [o for p in mine if (o := observed.replicas.get(p.replica_id)) is not None]
        ready = sorted((o for o in obs if o.state == "ready" and o.url), key=lambda o: o.replica_id)
        starting = sum(1 for p in mine if (o := observed.replicas.get(p.replica_id)) is None or o.state == "starting")
        health = state.model_health(name)
        if stopped:
            route_state, reason = "stopped", "serving is stopped; `llmgw ctl settings serving.stopped false` resumes it"
        elif health.parked or name in parking:
            failures, error = parking.get(name, (health.failures_in_row, health.last_error))
            route_state = "parked"
            reason = (f"parked after {failures} failed starts in a row: {error or 'no error text'}"
                      f" — fix the definition or run `llmgw ctl model retry {name}`")
        elif ready:
            route_state, reason = "ready", ""
        elif name in unplaceable:
            route_state, reason = "unplaceable", unplaceable[name]
        elif mine and all(p.node not in observed.nodes for p in mine):
            gone = ", ".join(sorted({p.node for p in mine}))
            route_state, reason = "starting", f"waiting for node {gone} to reconnect"
        elif mine:
            route_state, reason = "starting", "replicas are starting"
        elif desired.get(name, 0) > 0 and health.failures_in_row:
            route_state = "starting"
            reason = f"retrying after {health.failures_in_row} failed start(s): {health.last_error or 'no error text'}"
        elif desired.get(name, 0) > 0:
            route_state, reason = "starting", "waiting for a placement"
        elif model.mode == "on-demand":
            route_state, reason = "absent", "no replica is wanted yet (on-demand: a request starts one)"
        else:
            route_state, reason = "absent", "the model asks for 0 replicas (replicas.min = 0)"
        views[name] = ModelView(name, desired.get(name, 0), len(mine), len(ready), starting, route_state, reason)
        routes[name] = ModelRoute(
            model=name,
            role=model.role,
            state=route_state,
            endpoints=tuple(Endpoint(o.replica_id, o.url) for o in ready) if not stopped else (),
            reason=reason,
        )
    return views, routes


# --- multi-node replicas (groups) -------------------------------------------------------

_MEMBER_ID = re.compile(r"-g\d+-r(\d+)\Z")


def units(placements: Iterable[Placement]) -> list[tuple[Placement, ...]]:
    """Placements as replicas: a lone placement, or a group's members in rank order; by first id."""
    by_unit: dict[str, list[Placement]] = {}
    for p in placements:
        by_unit.setdefault(p.group or p.replica_id, []).append(p)
    found = [tuple(sorted(ps, key=lambda p: (p.rank, p.replica_id))) for ps in by_unit.values()]
    return sorted(found, key=lambda u: u[0].replica_id)


def complete(unit: tuple[Placement, ...]) -> bool:
    """A lone replica, or a group with each of its ranks placed once."""
    return [p.rank for p in unit] == list(range(unit[0].group_size))


def rank_of(replica_id: str, state: ClusterState) -> int:
    """A replica's rank in its group (0 for a lone one), from its placement, else from its id
    (`<model>-g<n>-r<rank>`, for a replica whose placement is already gone)."""
    p = state.placements.get(replica_id)
    if p is not None:
        return p.rank
    found = _MEMBER_ID.search(replica_id)
    return int(found.group(1)) if found else 0


def _running(observed: Observed, p: Placement) -> bool:
    obs = observed.replicas.get(p.replica_id)
    return obs is not None and obs.state in ("starting", "ready")


def _group_doc(p: Placement, unit: tuple[Placement, ...]) -> dict[str, Any] | None:
    if not p.group:
        return None
    doc: dict[str, Any] = {"rank": p.rank, "size": p.group_size, "leader": p.leader, "address": p.address}
    if p.rank == 0:
        doc["members"] = [m.address for m in unit[1:]]
    return doc
