"""The reconciler's brain (S3): `decide(state, observed, now, timeouts) -> Plan`.

Level-triggered and pure: each call recomputes, from the whole snapshot and
what agents report, the commands to commit, the start/stop messages for agents
and the routing table. Rerunning it on the same input gives the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    def message(self) -> dict[str, Any]:
        if self.kind == "start":
            return {"type": "start_replica", "replica_id": self.replica_id, "model": self.model, "gpus": list(self.gpus)}
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

    # 1. Placements that must go: their model went or changed, their node is lost,
    #    their replica failed to start. Failures are all counted before any
    #    "ready" is recorded, so the outcome never depends on replica id order.
    ready_models: set[str] = set()
    last_error: dict[str, str] = {}
    for p in sorted(state.placements.values(), key=lambda p: p.replica_id):
        model = state.models.get(p.model)
        obs = observed.replicas.get(p.replica_id)
        if model is None:
            remove(p, "model removed")
        elif p.launch_hash != model.launch_hash():
            remove(p, "definition changed")
        elif p.node not in observed.nodes and now - observed.gone_since(p.node) >= timeouts.lost_node_grace_s:
            remove(p, f"node {p.node} lost")
        elif obs is not None and obs.state == "failed":
            remove(p, "start failed")
            if not state.model_health(p.model).parked:
                error = obs.error or "engine exited"
                cmds.append(commands.start_failed(p.model, p.replica_id, error, now))
                failed_models[p.model] = failed_models.get(p.model, 0) + 1
                last_error[p.model] = error
        elif obs is not None and obs.state == "ready":
            ready_models.add(p.model)
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
        mine = sorted((p for p in live if p.model == name), key=lambda p: (p.placed_at, p.replica_id))
        for extra in mine[want:][::-1]:
            remove(extra, "scaled down")
            live.remove(extra)
        for _ in range(want - len(mine) if not waiting else 0):
            result = place(model, observed.nodes, live)
            if result.choice is None:
                unplaceable[name] = result.reason()
                break
            pending = Placement(f"(pending-{name}-{len(live)})", name, result.choice.node, result.choice.gpus,
                                model.launch_hash(), now)
            live.append(pending)
            cmds.append(commands.add_placement(name, result.choice.node, result.choice.gpus, model.launch_hash(), now))

    # 3. Tell agents: start what is placed and not running, stop what runs unplaced.
    actions: list[AgentAction] = []
    kept = {rid: p for rid, p in state.placements.items() if rid not in removed}
    for rid in sorted(kept):
        p = kept[rid]
        obs = observed.replicas.get(rid)
        if p.node in observed.nodes and (obs is None or obs.state == "stopped"):
            actions.append(AgentAction(p.node, "start", rid, state.models[p.model].to_doc(), p.gpus))
    for rid in sorted(observed.replicas):
        obs = observed.replicas[rid]
        if rid not in kept and obs.state != "stopped" and obs.node in observed.nodes:
            actions.append(AgentAction(obs.node, "stop", rid))

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
        mine = [p for p in kept.values() if p.model == name]
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
