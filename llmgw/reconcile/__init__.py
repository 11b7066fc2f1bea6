"""The reconciler's brain (S3): `decide(state, observed, now, timeouts) -> Plan`.

Level-triggered and pure: each call recomputes, from the whole snapshot and
what agents report, the commands to commit, the start/stop messages for agents
and the routing table. Rerunning it on the same input gives the same plan.

A multi-node replica (a group) is one unit here: placed, scaled, failed and removed whole.
Its members (rank >= 1) start first; rank 0 starts once every member reports starting or
ready, and is the replica's only endpoint; stops go to rank 0 first. A member that fails
fails the group: one start failure counted, every member stopped, the group placed again.

Failures count per model, replica slot and node (`domain.health` has the rule; `failures` the
first step). A changed definition is rolled: the new replica starts before the old one stops
when there is room for both, else the old one makes room.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from llmgw.domain import activation, commands
from llmgw.domain.activation import Progress
from llmgw.domain.health import avoided_nodes, flap_words, retry_backoff, slot_wait
from llmgw.domain.memory import WeightsIndex
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute, NodeInfo, Observed, ReplicaObs
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, Placement, Strikes
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.placement import FleetView, PlacementResult, place
from llmgw.reconcile import demand, drain, sleep
from llmgw.reconcile.adapters import adapter_loads, adapter_state, with_launch_lora
from llmgw.reconcile.failures import (
    Scan,
    Unit,
    complete,
    failing_note,
    free_slots,
    launch_of,
    oldest_first,
    parked_reason,
    ready_commands,
    scan,
)

__all__ = ["AgentAction", "ModelView", "Plan", "complete", "decide", "desired_replicas", "rank_of", "retry_backoff",
           "should_have", "units"]

# At most this many models that fit nowhere look for idle replicas to evict in one pass: each
# search places the model against many nodes, and a fleet short of GPUs would repeat every search
# at every tick. The rest look at a later pass (models in name order; a model that found room
# is placed and stops asking).
EVICTION_SEARCHES_PER_PASS = 8


@dataclass(frozen=True)
class AgentAction:
    node: str
    kind: str  # "start" | "stop" | "adapters" | "sleep" | "wake"
    replica_id: str
    model: dict[str, Any] = field(default_factory=dict)  # the definition, for "start"
    gpus: tuple[int, ...] = ()
    # A group member's start: {"rank", "size", "leader": "host:port", "address": this member's
    # "host:port" in the group (the leader's port, on its own node: where a llama.cpp rpc-server
    # listens)}, and for rank 0 "members": the other ranks' addresses in rank order. None when alone.
    group: dict[str, Any] | None = None
    # "adapters": the LoRA adapters the replica's engine should have loaded, name -> source (the whole set).
    adapters: dict[str, str] = field(default_factory=dict)
    level: int = 0  # "sleep": the model's sleep level (1 or 2)

    def message(self) -> dict[str, Any]:
        if self.kind == "adapters":
            return {"type": "load_adapters", "replica_id": self.replica_id,
                    "adapters": [{"name": n, "source": s} for n, s in sorted(self.adapters.items())]}
        if self.kind == "start":
            doc = {"type": "start_replica", "replica_id": self.replica_id, "model": self.model,
                   "gpus": list(self.gpus)}
            if self.group is not None:
                doc["group"] = dict(self.group)
            return doc
        if self.kind == "sleep":
            return {"type": "sleep_replica", "replica_id": self.replica_id, "level": self.level}
        if self.kind == "wake":
            return {"type": "wake_replica", "replica_id": self.replica_id}
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
    # The model's failed starts in a row (across its replicas) and the last one's error, also
    # while some replica is ready: "ready 1/3" says why the other two are missing.
    failures_in_row: int = 0
    last_error: str = ""
    activation: Progress | None = None  # how far its activation has come, while it starts
    window_s: float = 0.0  # its activation window in force (the definition's, or longer for its checkpoint)


@dataclass(frozen=True)
class Plan:
    commands: tuple[dict[str, Any], ...]
    actions: tuple[AgentAction, ...]
    routes: dict[str, ModelRoute]
    views: dict[str, ModelView]
    unplaceable: dict[str, str]  # model -> why no node fits
    evictions: tuple[demand.Eviction, ...] = ()  # idle replicas removed to make room (logged by the loop)
    drains: Mapping[str, drain.DrainView] = field(default_factory=dict)  # draining node -> its progress


def should_have(state: ClusterState, model: ModelDef, observed: Observed, now: float) -> int:
    """How many replicas the model should have now, parking aside (a parked model shows what it
    should have: `0/1 parked`, never `0/0`). The rule: `reconcile.demand.desired`."""
    return demand.desired(state, model, observed, now).count


def desired_replicas(state: ClusterState, model: ModelDef, observed: Observed, now: float) -> int:
    """How many replicas to place now: what it should have, none while it is parked."""
    if state.model_health(model.name).parked:
        return 0
    return should_have(state, model, observed, now)


@dataclass
class _Pass:
    """One `decide` call's working set: the commands so far and the placements as they will be."""

    state: ClusterState
    observed: Observed
    now: float
    timeouts: Timeouts
    cmds: list[dict[str, Any]] = field(default_factory=list)
    removed: set[str] = field(default_factory=set)
    live: dict[str, Placement] = field(default_factory=dict)  # replica id -> placement, pending ones too
    # Placement's index of the fleet as `live` has it: built at the first placement of the pass
    # (a quiet pass builds none), then kept in step with each removal and addition.
    view: FleetView | None = None
    evicted: list[demand.Eviction] = field(default_factory=list)
    eviction_searches: int = 0
    slept: set[str] = field(default_factory=set)  # replicas this pass put to sleep (fast wake)
    pending: frozenset[str] = frozenset()  # nodes waiting for approval: nothing is placed on them  # how many unplaceable models looked for idle replicas to evict
    draining: frozenset[str] = frozenset()  # nodes being drained (reconcile/drain.py)
    moving: dict[str, str] = field(default_factory=dict)  # draining node -> the model whose move is in flight
    blocked: dict[str, str] = field(default_factory=dict)  # draining node -> why its next replica cannot move
    leaving: set[str] = field(default_factory=set)  # drained replicas out of the routes, stopped after the grace

    def remove(self, unit: Unit, why: str) -> None:
        for p in unit:
            if p.replica_id in self.slept:  # put to sleep by this pass, then evicted by it: only removed
                self.slept.discard(p.replica_id)
                self.cmds = [c for c in self.cmds if c.get("op") != "placement.sleep" or c["replica_id"] != p.replica_id]
            if p.replica_id not in self.removed:
                self.removed.add(p.replica_id)
                if self.live.pop(p.replica_id, None) is not None and self.view is not None:
                    self.view.remove(p.replica_id)
                self.cmds.append(commands.remove_placement(p.replica_id, self.now, reason=why))

    def set_asleep(self, unit: Unit, value: bool) -> None:
        """Mark a lone replica asleep (its engine sleeps, its GPUs stay held) or awake (fast wake)."""
        p = self.live[unit[0].replica_id]
        self.live[p.replica_id] = sleep.asleep(p, value)
        self.cmds.append(commands.sleep_placement(p.replica_id, value, self.now))
        if value:
            self.slept.add(p.replica_id)

    def place(self, model: ModelDef, avoided: dict[str, Strikes]) -> PlacementResult:
        """Placement for one more replica, off the nodes avoided for this model when another fits."""
        nodes: dict[str, NodeInfo] = self.observed.nodes
        if avoided:  # rare: a one-off plan without them
            elsewhere = place(model, {n: i for n, i in nodes.items() if n not in avoided}, self.live.values(),
                              models=self.state.models, sources=self.observed.sources, pending=self.pending,
                              cordoned=self.state.cordoned_nodes)
            if elsewhere.choice is not None:
                return elsewhere
        if self.view is None:
            self.view = FleetView(nodes, self.live.values(), self.state.models, self.observed.sources, self.pending,
                                  self.state.cordoned_nodes)
        return self.view.place(model)  # every refusal comes when nothing fits

    def _added(self, p: Placement) -> None:
        self.live[p.replica_id] = p
        if self.view is not None:
            self.view.add(p)

    def add(self, model: ModelDef, result: PlacementResult, slot: int) -> None:
        assert result.choice is not None
        name, choice, launch = model.name, result.choice, launch_of(model)
        pending = f"(pending-{name}-{len(self.cmds)})"
        if choice.members:
            members = [(m.node, m.gpus, m.host) for m in choice.members]
            for rank, m in enumerate(choice.members):
                self._added(Placement(f"{pending}-r{rank}", name, m.node, m.gpus, launch, self.now, pending, rank,
                                      len(members), slot=slot))
            self.cmds.append(commands.add_group(name, members, launch, self.now, slot=slot))
        else:
            self._added(Placement(pending, name, choice.node, choice.gpus, launch, self.now, slot=slot))
            self.cmds.append(commands.add_placement(name, choice.node, choice.gpus, launch, self.now, slot=slot))


def decide(state: ClusterState, observed: Observed, now: float, timeouts: Timeouts = TIMEOUTS) -> Plan:
    observed = demand.with_adapters(state, observed)  # a LoRA adapter's requests are its base's demand
    state = with_launch_lora(state)  # a llama.cpp base starts with its adapters' files
    run = _Pass(state, observed, now, timeouts, live=dict(state.placements), pending=state.pending_nodes(observed.nodes),
                draining=drain.draining(state))
    # 1. Replicas that must go: their model went, their node is lost, they failed to start (a
    #    group: any member), an old definition's that does not serve. Failures are all counted
    #    before any "ready" is recorded, so the outcome never depends on replica id order.
    found = scan(state, observed, now, timeouts, units(state.placements.values()))
    failed_units = {u[0].replica_id for u, _ in found.failures}
    failure_of = {u[0].replica_id: cmd for u, cmd in found.failures}
    for unit, why in found.gone:
        run.remove(unit, why)
        if unit[0].replica_id in failed_units:
            run.cmds.append(failure_of[unit[0].replica_id])
    run.cmds.extend(ready_commands(state, found, now))
    run.moving = drain.in_flight(state, found, run.draining)

    # 2. Scale each model toward what it should have now.
    unplaceable: dict[str, str] = {}
    desired: dict[str, int] = {}
    parking: dict[str, tuple[int, str, int, float]] = {}  # parked by this pass: failures, last error, flaps
    park_after = int(effective(state.settings, "health.park_after_failures"))
    for name in sorted(state.models):
        model = state.models[name]
        if model.base:  # a LoRA adapter: no replicas of its own
            desired[name] = 0
            continue
        health = state.model_health(name)
        desired[name] = should_have(state, model, observed, now)
        want = 0 if health.parked else desired[name]
        if name in found.failed and health.failures_in_row + found.failed[name] >= park_after:
            want = 0  # this pass parks it; do not place it again
            flapped = found.flaps.get(name, [])
            parking[name] = (health.failures_in_row + found.failed[name], found.last_error[name],
                             health.flaps + len(flapped), max([health.flap_ready_s, *flapped]))
        why = _scale(run, model, want, found)
        if why:
            unplaceable[name] = why

    # 3. Tell agents: start what is placed and not running, stop what runs unplaced.
    actions: list[AgentAction] = []
    # As this pass leaves them (asleep or awake: fast wake).
    kept = {rid: run.live.get(rid, p) for rid, p in state.placements.items() if rid not in run.removed}
    for unit in units(kept.values()):
        for p in unit:
            obs = observed.replicas.get(p.replica_id)
            if p.node in observed.nodes and obs is not None and (p.asleep or obs.state == "sleeping"):
                if p.asleep and obs.state == "ready":
                    level = state.models[p.model].sleep_level
                    actions.append(AgentAction(p.node, "sleep", p.replica_id, level=level))
                elif not p.asleep and obs.state == "sleeping":
                    actions.append(AgentAction(p.node, "wake", p.replica_id))
                continue
            if p.node not in observed.nodes or (obs is not None and obs.state != "stopped"):
                continue
            if p.group and p.rank == 0 and not all(_running(observed, m) for m in unit[1:]):
                continue  # rank 0 serves once every member has joined: it starts after them
            # Without the gateway's and the reconciler's own fields (fallbacks, aliases, schedules): an agent does not
            # use them, and one of an older release refuses a definition with a key it does not know.
            launch = replace(state.models[p.model], fallbacks=(), aliases=(), schedules=()).to_doc()
            actions.append(AgentAction(p.node, "start", p.replica_id, launch, p.gpus, _group_doc(p, unit)))
    # Stops: every rank 0 (and lone replica) first, then the members, whose leader is gone by then.
    stops = [(rank_of(rid, state), rid, obs.node) for rid, obs in observed.replicas.items()
             if rid not in kept and obs.state != "stopped" and obs.node in observed.nodes]
    actions.extend(AgentAction(node, "stop", rid) for _, rid, node in sorted(stops))
    actions.extend(AgentAction(node, "adapters", rid, adapters=want)
                   for node, rid, want in adapter_loads(state.models, observed, kept))

    # A model this pass evicted is absent (waiting for a request), not a model that lost its replica.
    evicted = {e.model: e.why for e in run.evicted}
    serving = {rid: p for rid, p in kept.items() if rid not in run.leaving} if run.leaving else kept
    views, routes = _views(state, observed, now, timeouts, serving, desired, unplaceable, parking, evicted)
    drains = drain.views(run.draining, kept, run.moving, run.blocked) if run.draining else {}
    return Plan(tuple(run.cmds), tuple(actions), routes, views, unplaceable, tuple(run.evicted), drains)


def _scale(run: _Pass, model: ModelDef, want: int, found: Scan) -> str:
    """Remove and place this model's replicas toward `want`; the reason nothing fits, if so.

    Replicas of an older definition that serve are kept while the new ones are not yet ready
    (rolling: start the new before stopping the old); one makes room when the new one fits
    nowhere else."""
    name, launch = model.name, launch_of(model)
    mine = [u for u in found.kept.get(name, []) if u[0].replica_id not in run.removed]
    moving: list[Unit] = []  # its replicas on a draining node (reconcile/drain.py)
    if run.draining:
        moving = oldest_first([u for u in mine if drain.on(u, run.draining)])
        mine = [u for u in mine if not drain.on(u, run.draining)]
        for unit in [u for u in moving if u[0].asleep]:  # serves nothing: stopped, not moved (woken elsewhere)
            run.remove(unit, "node draining: an asleep replica stops")
        moving = [u for u in moving if not u[0].asleep]
    fresh = oldest_first([u for u in mine if u[0].launch_hash == launch])
    stale = oldest_first([u for u in mine if u[0].launch_hash != launch])
    asleep = [u for u in fresh if u[0].asleep]  # fast wake (reconcile/sleep.py): woken before any is placed
    fresh = [u for u in fresh if not u[0].asleep]
    wake = max(0, want - len(fresh))
    for unit in asleep[:wake]:
        run.set_asleep(unit, False)
        fresh.append(unit)
    asleep = asleep[wake:]
    if asleep and not sleep.may_keep(run.state, model):
        for unit in asleep:  # serving stopped (or the model may no longer sleep): asleep replicas stop too
            run.remove(unit, "scaled down")
        asleep = []
    for extra in fresh[want:][::-1]:
        if sleep.may_sleep(run.state, model, run.observed, run.now, extra):
            run.set_asleep(extra, True)
            asleep.append(extra)
        else:
            run.remove(extra, "scaled down")
    fresh = fresh[:want]
    ready = {u[0].replica_id for u in found.ready.get(name, [])}
    still_needed = max(0, want - sum(1 for u in fresh if u[0].replica_id in ready))
    for old in stale[: max(0, len(stale) - still_needed)]:
        run.remove(old, "definition changed")
    stale = stale[max(0, len(stale) - still_needed):]
    if moving:
        moving = _drain(run, moving, fresh, max(0, still_needed - len(stale)), ready)
    normal = max(0, want - len(fresh) - len(moving))  # what it places whatever the drain; the rest replace `moving`
    health = run.state.model_health(name)
    avoided = avoided_nodes(run.state, health, run.now, run.timeouts) if health.nodes else {}
    failed_now = found.failed_slots.get(name, set())
    for i, slot in enumerate(free_slots({u[0].slot for u in fresh + asleep}, want - len(fresh))):
        if slot in failed_now or slot_wait(health, slot, run.now, run.timeouts) > 0:
            continue  # this slot backs off; the others are not held back by it
        there: list[str] = []  # the draining nodes this placement moves a replica off
        if i >= normal:
            there = sorted({p.node for p in moving[i - normal] if p.node in run.draining})
            if any(n in run.moving for n in there):
                continue  # one move at a time per node: the next waits for the one in flight
        if any(e.model == name for e in run.evicted):
            break  # evicted by this pass to make room: not placed again elsewhere
        result = run.place(model, avoided)
        while result.choice is None and stale:
            run.remove(stale.pop(0), "definition changed (no room to start the new replica first)")
            result = run.place(model, avoided)
        victims: list[demand.Eviction] = []
        if result.choice is None and run.eviction_searches < EVICTION_SEARCHES_PER_PASS:
            run.eviction_searches += 1
            victims = demand.evictions(run.state, run.observed, run.now, model, run.live.values(), result)
        if victims:  # idle replicas of other on-demand models make room (demand.evictions' policy)
            for e in victims:
                run.remove((run.live[e.replica_id],), e.why)
            run.evicted.extend(victims)
            result = run.place(model, avoided)
        if result.choice is None and there:
            for n in there:  # the drain waits, and says why; the model itself still serves
                run.blocked.setdefault(n, f"nowhere to go for {name}: {result.reason()}")
            continue
        if result.choice is None:
            return result.reason()
        run.add(model, result, slot)
        for n in there:
            run.moving[n] = name
    return ""


def _drain(run: _Pass, moving: list[Unit], fresh: list[Unit], needed: int, ready: set[str]) -> list[Unit]:
    """Of a model's replicas on draining nodes, those kept as stand-ins (serving, while fewer than `needed`
    replicas elsewhere are ready). One that does not serve moves at once (one whose node is gone quiet is
    left to the node's grace period); one no longer needed leaves
    the routes, and is removed `drain_stop_grace_s` after its replacement became ready."""
    serving = [u for u in moving if u[0].replica_id in ready]
    for u in moving:  # one on a node gone quiet stays placed (its node's grace period rules it), and is replaced
        if u[0].replica_id not in ready and all(p.node in run.observed.nodes for p in u):
            run.remove(u, "node draining: moved before it served")
    since = drain.ready_since(fresh, ready, run.observed)
    for u in serving[needed:]:
        if since is None or run.now >= since + run.timeouts.drain_stop_grace_s:
            run.remove(u, "node draining: moved to another node (its replacement serves)")
        else:  # out of the routes now: its requests in flight finish meanwhile
            run.leaving.update(p.replica_id for p in u)
    return serving[:needed]


def _views(
    state: ClusterState,
    observed: Observed,
    now: float,
    timeouts: Timeouts,
    kept: dict[str, Placement],
    desired: dict[str, int],
    unplaceable: dict[str, str],
    parking: dict[str, tuple[int, str, int, float]],
    evicted: Mapping[str, str] | None = None,
) -> tuple[dict[str, ModelView], dict[str, ModelRoute]]:
    stopped = bool(effective(state.settings, "serving.stopped"))
    serving: dict[str, list[Placement]] = {}
    sleeping: set[str] = set()  # models with an asleep replica (fast wake): none of their replicas
    for p in kept.values():
        if p.asleep:
            sleeping.add(p.model)
        elif p.serves:  # a group counts once, as its rank 0
            serving.setdefault(p.model, []).append(p)
    views: dict[str, ModelView] = {}
    routes: dict[str, ModelRoute] = {}
    rate = float(effective(state.settings, "activation.load_mib_per_s"))
    weights = WeightsIndex.of(observed.nodes)
    for name, model in sorted(state.models.items()):
        if model.base:
            continue  # a LoRA adapter's route follows its base's (below)
        mine = serving.get(name, [])
        obs: list[ReplicaObs] = [o for p in mine if (o := observed.replicas.get(p.replica_id)) is not None]
        size = _checkpoint_bytes(model, obs, weights)
        window = activation.window_s(model.activation_window_s, size, rate, timeouts.activation_load_base_s)
        ready = sorted((o for o in obs if o.state == "ready" and o.url), key=lambda o: o.replica_id)
        # (A replica reported sleeping under an awake placement is being woken: starting.)
        starting = sum(1 for p in mine if (o := observed.replicas.get(p.replica_id)) is None
                       or o.state in ("starting", "sleeping"))
        health = state.model_health(name)
        failures, error, flaps, flap_ready_s = parking.get(
            name, (health.failures_in_row, health.last_error, health.flaps, health.flap_ready_s))
        route_reason = ""
        off_until: float | None = None  # a schedule rule holds it at 0 replicas until then
        if stopped:
            route_state, reason = "stopped", "serving is stopped; `llmgw start` resumes it"
        elif health.parked or name in parking:
            route_state, reason = "parked", parked_reason(name, failures, error, flaps, flap_ready_s)
        elif ready:
            route_state, reason = "ready", ""
            avoided = avoided_nodes(state, health, now, timeouts) if health.nodes else {}
            if len(ready) < desired.get(name, 0) or avoided:
                note = failing_note(health, avoided) or unplaceable.get(name, "")
                reason = f"{len(ready)} of {desired[name]} ready" + (f": {note}" if note else "")
        elif name in sleeping and not mine and not desired.get(name, 0):
            route_state, reason = "absent", sleep.asleep_words(model)
        elif evicted and name in evicted and not mine:
            route_state, reason = "absent", f"{evicted[name]}; a request starts it again"
        elif name in unplaceable:
            route_state, reason = "unplaceable", unplaceable[name]
        elif mine and all(p.node not in observed.nodes for p in mine):
            gone = ", ".join(sorted({p.node for p in mine}))
            route_state, reason = "starting", f"waiting for node {gone} to reconnect"
        elif mine:
            route_state, reason = "starting", "replicas are starting"
        elif desired.get(name, 0) > 0 and health.failures_in_row:
            route_state = "starting"
            flapped = f" ({flap_words(health.flaps, health.flap_ready_s)})" if health.flaps else ""
            reason = (f"retrying after {health.failures_in_row} failed start(s){flapped}: "
                      f"{health.last_error or 'no error text'}")
        elif desired.get(name, 0) > 0:
            route_state, reason = "starting", "waiting for a placement"
        elif (ruled := demand.schedule_now(state, model, now)) is not None and ruled.rule is not None \
                and ruled.max == 0:
            route_state, reason = "absent", \
                f"schedule rule {ruled.rule + 1} allows no replica until {ruled.at(ruled.until)}"
            off_until = ruled.until if ruled.until is not None else 0.0
        elif model.mode == "on-demand" and name in observed.evicted:
            route_state, reason = "absent", f"{observed.evicted[name][1]}; a request starts it again"
        elif model.mode == "on-demand":
            route_state, reason = "absent", "no replica is wanted yet (on-demand: a request starts one)"
        else:
            route_state, reason = "absent", "the model asks for 0 replicas (replicas.min = 0)"
        # Its words are not in the reason: routes are pushed to every gateway when they change.
        progress = _progress(mine, observed, size, rate, timeouts) if route_state == "starting" else None
        if route_state != "ready":
            route_reason = reason
        want = demand.bounds(state, model, now)[0] if route_state == "absent" and evicted and name in evicted \
            else desired.get(name, 0)
        views[name] = ModelView(name, want, len(mine), len(ready), starting, route_state, reason,
                                failures, error, progress, window)
        routes[name] = ModelRoute(
            model=name,
            role=model.role,
            state=route_state,
            endpoints=tuple(Endpoint(o.replica_id, o.url, o.node, o.loras, o.tool_calls) for o in ready)
            if not stopped else (),
            reason=route_reason,
            activation=progress,
            window_s=window if window > model.activation_window_s else 0.0,
            off_until=off_until,
        )
    for name, model in sorted(state.models.items()):
        if model.base:
            base_view = views.get(model.base)
            found = adapter_state(model, routes.get(model.base), base_view.reason if base_view else "", observed)
            views[name] = ModelView(name, 0, 0, len(found.endpoints), 0, found.state, found.reason,
                                    activation=found.activation)
            routes[name] = ModelRoute(name, model.role, found.state, found.endpoints if not stopped else (),
                                      found.reason if found.state != "ready" else "", found.activation,
                                      base=model.base, lora_id=found.lora_id, off_until=found.off_until)
    return views, routes


def _checkpoint_bytes(model: ModelDef, obs: list[ReplicaObs], weights: WeightsIndex) -> int | None:
    """The model's checkpoint size: what its replicas' agents measured, else what storage reports say of its
    source (the larger of the files' and the tensors' bytes); None when nobody knows."""
    measured = [o.weights_bytes for o in obs if o.weights_bytes is not None]
    if measured:
        return max(measured)
    if model.engine == "sim":
        return None  # the simulator reads no weights, whatever its source names
    sizes = [n for e in weights.entries(model.source) for k in ("size", "tensor_bytes")
             if type(n := e.get(k)) is int and n > 0]
    return max(sizes, default=None)


def _progress(mine: list[Placement], observed: Observed, size: int | None, rate: float,
              timeouts: Timeouts) -> Progress:
    """The activation's progress, from its most advanced replica (`activation.best`); `placing` with none."""
    def of(phase: str, since: float | None, total: int | None) -> Progress:
        expected = activation.expected_s(total, rate, timeouts.activation_load_base_s)
        return Progress(phase, since, bytes_total=total, expected_s=expected)

    found = []
    for p in mine:
        o = observed.replicas.get(p.replica_id)
        if o is None or (o.state == "starting" and p.node not in observed.nodes):
            found.append(of("placing", p.placed_at, size))
        elif o.state == "sleeping" or o.state == "starting" and o.phase == "waking":  # fast wake: no load estimate
            found.append(Progress("waking", o.since))
        elif o.state == "starting" and o.phase == "fetching":
            found.append(_fetching(o, size, rate, timeouts))
        elif o.state == "starting":
            found.append(of(o.phase if o.phase in activation.PHASES else "starting", o.since, o.weights_bytes or size))
    # Ties by phase go to the soonest ETA: a start's ETA depends only on its age, not on the clock read.
    return activation.best(found, 0.0) or of("placing", None, size)


def _fetching(o: ReplicaObs, size: int | None, rate: float, timeouts: Timeouts) -> Progress:
    """A replica whose node fetches its `mirror://` file: the bytes it holds, and an ETA of the copy at the rate it
    goes (as its agent measures it) followed by the load at the nominal rate."""
    total = o.weights_bytes or size
    load = activation.expected_s(total, rate, timeouts.activation_load_base_s)
    expected = None if o.fetch_expected_s is None or load is None else o.fetch_expected_s + load
    return Progress("fetching", o.since, bytes_done=o.bytes_done, bytes_total=total, expected_s=expected)


# --- multi-node replicas (groups) -------------------------------------------------------

_MEMBER_ID = re.compile(r"-g\d+-r(\d+)\Z")


def units(placements: Iterable[Placement]) -> list[tuple[Placement, ...]]:
    """Placements as replicas: a lone placement, or a group's members in rank order; by first id."""
    by_unit: dict[str, list[Placement]] = {}
    for p in placements:
        by_unit.setdefault(p.group or p.replica_id, []).append(p)
    found = [tuple(sorted(ps, key=lambda p: (p.rank, p.replica_id))) for ps in by_unit.values()]
    return sorted(found, key=lambda u: u[0].replica_id)


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
