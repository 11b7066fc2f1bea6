"""Demand, load and idle: how many replicas a model should have now (`desired`), how long it has
gone unasked-for (`idle_for`), and which idle replicas make room for a model that fits nowhere
(`evictions`). Pure: time arrives as `now`; docs/operations.md ("Scaling") has the rules in words.

Unknown is not idle. A leader hears demand only from the moment it took office (`Observed.since`),
so a model nobody was heard asking for is *unknown*, not idle, until a whole idle timeout has
passed since then; meanwhile it keeps what runs. Likewise the load: until `scale_down_delay_s`
has passed since then, no replica added under load is taken away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from llmgw.domain import schedule
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo, Observed
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, Placement
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.placement import NOT_NOW, PlacementResult, place
from llmgw.reconcile.failures import launch_of

UNKNOWN = -1.0  # an unknown idle time in JSON; tables show "-"


@dataclass(frozen=True)
class Desired:
    """What a model should have now, parking aside (a parked model still shows it: `0/1 parked`).

    `count`: replicas. `reason`: why that many, in words. `unknown`: the count holds what runs
    because this leader has not heard demand (or load) long enough to take anything away."""

    count: int
    reason: str
    unknown: bool = False


@dataclass(frozen=True)
class Eviction:
    """One placement to remove so that `need` fits: a multi-node replica gives one per member,
    with the same `why` (also the removal's reason, shown on the evicted model)."""

    replica_id: str
    model: str
    why: str
    idle_s: float
    need: str


def idle_for(model: ModelDef, observed: Observed, now: float) -> float | None:
    """Seconds since the model was last asked for; 0 while requests are in flight; None when
    unknown: never asked for since this leader took office, less than an idle timeout ago.
    Absent from `demand` and heard for longer than that, it is idle since the leader took office
    (at least)."""
    if observed.outstanding.get(model.name, 0) > 0:
        return 0.0
    asked = observed.demand.get(model.name)
    if asked is not None:
        return max(0.0, now - asked)
    heard = now - observed.since
    return heard if heard >= model.idle_timeout_s else None


def idle_json(seconds: float | None) -> float:
    """An idle time for JSON: unknown is negative (-1), never 0 (0 reads as "in use now")."""
    return UNKNOWN if seconds is None else round(seconds, 1)


def idle_words(seconds: float | None) -> str:
    """An idle time for tables: "-" when unknown."""
    return "-" if seconds is None else duration(seconds)


def duration(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 2 * 3600:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def schedule_now(state: ClusterState, model: ModelDef, now: float) -> schedule.Ruling | None:
    """What the model's schedule rules say at `now` in the cluster's time zone; None for a model without."""
    if not model.schedules:
        return None
    return schedule.in_force(model.schedules, model.replicas_min, model.replicas_max, now,
                             effective(state.settings, "cluster.time_zone"))


def bounds(state: ClusterState, model: ModelDef, now: float) -> tuple[int, int, str]:
    """(min, max, words) of the model's replicas at `now`: the ruling schedule rule's (words naming it), else
    the model's own replicas.min/max (words "")."""
    ruled = schedule_now(state, model, now)
    if ruled is None or ruled.rule is None:
        return model.replicas_min, max(model.replicas_min, model.replicas_max), ""
    return ruled.min, ruled.max, (f"schedule rule {ruled.rule + 1} sets replicas {ruled.min}..{ruled.max} until "
                                  f"{ruled.at(ruled.until)}")


def with_adapters(state: ClusterState, observed: Observed) -> Observed:
    """`observed` with each LoRA adapter's demand and load counted as its base's: a request for an adapter asks
    for its base model's replicas (an on-demand base starts for it; its load scales the base)."""
    adapters = [(m.name, m.base) for m in state.models.values() if m.base]
    if not adapters or not (observed.demand or observed.outstanding or observed.peak):
        return observed
    demand, outstanding, peak = dict(observed.demand), dict(observed.outstanding), dict(observed.peak)
    for name, base in adapters:
        if name in observed.demand:
            demand[base] = max(demand.get(base, observed.demand[name]), observed.demand[name])
        if name in observed.outstanding:
            outstanding[base] = outstanding.get(base, 0) + observed.outstanding[name]
        if name in observed.peak:
            peak[base] = peak.get(base, 0) + observed.peak[name]
    return replace(observed, demand=demand, outstanding=outstanding, peak=peak)


def desired(
    state: ClusterState,
    model: ModelDef,
    observed: Observed,
    now: float,
    timeouts: Timeouts = TIMEOUTS,
    *,
    placed: Iterable[Placement] | None = None,
) -> Desired:
    """How many replicas `model` should have now (parking aside); `placed`: its placements, when
    the caller has them at hand (else they are looked up in `state`).

    always: `replicas.min`. on-demand: `max(min, 1)` while asked for (a request within its idle
    timeout, or requests in flight), `min` once idle or evicted (until asked again). Either mode:
    more under load, one replica per `scaling.outstanding_per_replica` requests in flight at the
    peak of the last `scale_down_delay_s`, up to `replicas.max`. Unknown demand or load holds
    what runs (see the module's docstring). While a schedule rule rules, its min/max stand for
    `replicas.min/max` throughout (`bounds`; max 0: none, even when asked for).

    Which wins: an on-demand model known to be idle (nothing in flight, not asked for within its
    `idle_timeout_s`) or evicted goes to `min` at once, whatever the load's memory says; the load
    and `scale_down_delay_s` only keep replicas of a model that is still asked for. So a short idle
    timeout is what stops it, as `ctl status` says ("STOPS AFTER")."""
    name = model.name
    if model.base:
        return Desired(0, f"a LoRA adapter: served by the replicas of {model.base}")
    if effective(state.settings, "serving.stopped"):
        return Desired(0, "serving is stopped")
    lo, hi, ruled = bounds(state, model, now)
    heard = now - observed.since
    idle_unknown = False
    if model.mode == "always":
        base, why = lo, f"always on: {ruled or f'replicas.min = {lo}'}"
    else:
        base, why, idle_unknown, idle = _on_demand(model, observed, now, heard, lo)
        if idle or hi < base:  # idle, or a schedule rule allows fewer than it would have
            return Desired(min(base, hi), f"{why}; {ruled}" if ruled else why)
    in_flight = observed.outstanding.get(name, 0)
    peak = max(observed.peak.get(name, 0), in_flight)
    per = int(effective(state.settings, "scaling.outstanding_per_replica"))
    by_load = math.ceil(peak / per)
    want = max(base, by_load)
    if by_load > base:
        why = (f"under load: {peak} requests in flight at the peak of the last"
               f" {duration(timeouts.scale_down_delay_s)}, {per} per replica")
    count = max(lo, min(want, hi))
    if count == hi and want > hi and by_load > base:
        why += f" (replicas.max = {hi})"
    if ruled and ruled not in why:
        why += f"; {ruled}"
    if idle_unknown:
        why = f"demand unknown: not asked for in the {duration(heard)} since this leader took office" \
              f" (known after {duration(model.idle_timeout_s)})"
    if (idle_unknown or heard < timeouts.scale_down_delay_s) and count < hi:  # else nothing to hold
        running = _running(state, model, observed, now, timeouts, placed)
        held = max(lo, min(running, hi))
        if held > count:
            if not idle_unknown:
                why = f"load unknown: this leader has heard it for {duration(heard)}" \
                      f" (known after {duration(timeouts.scale_down_delay_s)})"
            return Desired(held, f"{why}; keeping the {running} that run", True)
    return Desired(count, why, idle_unknown)


def _on_demand(model: ModelDef, observed: Observed, now: float, heard: float, lo: int) -> tuple[int, str, bool, bool]:
    """(base count, why, demand unknown, idle) of an on-demand model whose min is `lo`, load aside. `idle`:
    known to be idle past its idle timeout, or evicted: `min`, which the load does not raise."""
    asked = observed.demand.get(model.name)
    in_flight = observed.outstanding.get(model.name, 0)
    evicted = observed.evicted.get(model.name)
    fresh = asked is not None and (evicted is None or asked > evicted[0])
    if in_flight > 0:
        return max(lo, 1), f"{in_flight} request(s) in flight", False, False
    if fresh and asked is not None and now - asked < model.idle_timeout_s:
        return max(lo, 1), f"asked for {duration(now - asked)} ago (idle timeout {duration(model.idle_timeout_s)})", \
            False, False
    if evicted is not None and not fresh:
        return lo, f"{evicted[1]}; a request starts it again", False, True
    if asked is not None:
        return lo, f"idle for {duration(now - asked)} (idle timeout {duration(model.idle_timeout_s)})", False, True
    if heard >= model.idle_timeout_s:
        return lo, f"not asked for since this leader took office {duration(heard)} ago", False, True
    return lo, "not asked for yet", True, False


def _running(
    state: ClusterState,
    model: ModelDef,
    observed: Observed,
    now: float,
    timeouts: Timeouts,
    placed: Iterable[Placement] | None,
) -> int:
    """Replicas of the model that run or may: reported starting or ready, or placed on a node not
    heard from yet (within its grace period). A group counts once, as its rank 0."""
    mine = _by_model(state).get(model.name, ()) if placed is None else placed
    count = 0
    for p in mine:
        if p.model != model.name or not p.serves or p.launch_hash != launch_of(model):
            continue
        obs = observed.replicas.get(p.replica_id)
        if obs is not None:
            count += obs.state in ("starting", "ready")
        elif p.node not in observed.nodes:
            count += now - observed.gone_since(p.node) < timeouts.lost_node_grace_s
    return count


# The last state's placements by model: `desired` runs once per model per pass, and looking each
# model's placements up in the whole map would make a pass quadratic. The mapping is held, so `is`
# cannot be fooled by a reused id; the answer is the same with or without it.
_INDEX: list[tuple[Mapping[str, Placement], dict[str, list[Placement]]]] = []


def _by_model(state: ClusterState) -> dict[str, list[Placement]]:
    if _INDEX and _INDEX[0][0] is state.placements:
        return _INDEX[0][1]
    index: dict[str, list[Placement]] = {}
    for p in state.placements.values():
        index.setdefault(p.model, []).append(p)
    _INDEX[:] = [(state.placements, index)]
    return index


# --- eviction ----------------------------------------------------------------------------------


def evictions(
    state: ClusterState,
    observed: Observed,
    now: float,
    need: ModelDef,
    placements: Iterable[Placement] | None = None,
    refusal: PlacementResult | None = None,
) -> list[Eviction]:
    """The idle replicas to remove so that one more replica of `need` fits, or [] when none may
    go or removing them all would not make it fit. `placements`: the placements as the caller's
    pass has them (default: the state's); `refusal`: why `need` fits nowhere now (a refusal
    where every node says "never" is not helped by room, and nothing is evicted).

    Who may go: replicas above `replicas.min` of another on-demand model that has nothing in
    flight and was last asked for at least `scaling.evict_after_idle_s` ago (or its own idle
    timeout, if shorter) — never an always-on model, one in use, or one whose demand is unknown.
    Longest idle first: on each node that could take `need`, its idlest replicas until `need`
    fits; of those nodes, the one whose most recently used victim is the least recently used
    (then fewer victims, then the node's name). A model that is itself idle evicts nothing."""
    live = list(state.placements.values() if placements is None else placements)
    if refusal is None:
        refusal = place(need, observed.nodes, live, sources=observed.sources, pending=state.pending_nodes(observed.nodes),
                        cordoned=state.cordoned_nodes)
    if refusal.choice is not None:
        return []  # it fits as things are
    if refusal.refusals and not refusal.summary \
            and all(r.verdict != NOT_NOW for r in refusal.refusals):
        return []
    after = float(effective(state.settings, "scaling.evict_after_idle_s"))
    if need.mode == "on-demand" and observed.outstanding.get(need.name, 0) == 0:
        own = idle_for(need, observed, now)
        if own is not None and own >= min(after, need.idle_timeout_s):
            return []  # an idle model does not push out another idle one
    victims = _candidates(state, observed, now, need, live, after)
    if not victims:
        return []
    src = observed.sources
    # Waiting for approval, or cordoned: no room is made for them.
    pending = state.pending_nodes(observed.nodes) | frozenset(state.cordoned_nodes)
    nodes = {n: i for n, i in observed.nodes.items() if n not in pending} if pending else observed.nodes
    chosen = _multi_node(need, nodes, live, victims, src) if need.profile.nodes > 1 else \
        _one_node(need, nodes, live, victims, src)
    out: list[Eviction] = []
    for idle, unit in chosen:
        why = f"evicted: idle {duration(idle)}, made room for {need.name}"
        out.extend(Eviction(p.replica_id, p.model, why, idle, need.name) for p in unit)
    return out


_Victim = tuple[float, tuple[Placement, ...]]  # (idle seconds, the unit's placements)


def _candidates(
    state: ClusterState, observed: Observed, now: float, need: ModelDef, live: list[Placement], after: float
) -> list[_Victim]:
    """Every unit that may go, longest idle first (then model, then newest placement first)."""
    idle_models: dict[str, float] = {}
    for name, model in state.models.items():
        if name == need.name or model.mode != "on-demand":
            continue  # always-on models are never evicted
        idle = idle_for(model, observed, now)
        if idle is not None and idle >= min(after, model.idle_timeout_s):
            idle_models[name] = idle  # else in use, or unknown: never evicted
    if not idle_models:
        return []
    by_model: dict[str, dict[str, list[Placement]]] = {}
    for p in live:
        if p.model in idle_models and not p.replica_id.startswith("("):  # not one this pass just placed
            by_model.setdefault(p.model, {}).setdefault(p.group or p.replica_id, []).append(p)
    found: list[tuple[float, str, int, tuple[Placement, ...]]] = []
    for name, by_unit in by_model.items():
        model, idle = state.models[name], idle_models[name]
        unit_list = [tuple(sorted(u, key=lambda p: p.rank)) for u in by_unit.values()]
        spare = len(unit_list) - bounds(state, model, now)[0]
        # Asleep replicas first (fast wake: they serve nothing), then the newest.
        newest = sorted(unit_list, key=lambda u: (u[0].asleep, u[0].placed_at, u[0].replica_id),
                        reverse=True)[: max(0, spare)]
        found.extend((-idle, name, i, u) for i, u in enumerate(newest))
    found.sort(key=lambda f: f[:3])
    return [(-f[0], f[3]) for f in found]


def _without(live: Sequence[Placement], gone: Iterable[_Victim]) -> list[Placement]:
    ids = {p.replica_id for _, unit in gone for p in unit}
    return [p for p in live if p.replica_id not in ids]


def _one_node(
    need: ModelDef, nodes: dict[str, NodeInfo], live: list[Placement], victims: list[_Victim],
    sources: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[_Victim]:
    """Per node, its idlest victims until `need` fits there; the best node's set (see `evictions`)."""
    per_node: dict[str, list[_Victim]] = {}
    for v in victims:
        for node in sorted({p.node for p in v[1]}):
            per_node.setdefault(node, []).append(v)
    on_node: dict[str, list[Placement]] = {}
    for p in live:
        if p.node in per_node:
            on_node.setdefault(p.node, []).append(p)
    best: tuple[tuple[float, int, str], list[_Victim]] | None = None
    # Nodes by their idlest victim: once that is fresher than the best set's freshest, no later
    # node can do better (its victims only get fresher), and the search stops.
    for node, mine in sorted(per_node.items(), key=lambda kv: (-kv[1][0][0], kv[0])):
        if best is not None and -mine[0][0] > best[0][0]:
            break
        info = nodes.get(node)
        if info is not None and not _could_fit(need, info, on_node[node], mine):
            continue  # counted first (cheap): too few GPUs there even with every victim gone
        if info is None or place(need, {node: info}, _without(on_node[node], mine), sources=sources).choice is None:
            continue  # not even with all of them gone: no victim here helps
        taken: list[_Victim] = []
        for v in mine:
            taken.append(v)
            if place(need, {node: info}, _without(on_node[node], taken), sources=sources).choice is not None:
                rank = (-min(idle for idle, _ in taken), len(taken), node)
                if best is None or rank < best[0]:
                    best = (rank, list(taken))
                break
    return [] if best is None else best[1]


def _could_fit(need: ModelDef, info: NodeInfo, on_node: list[Placement], mine: list[_Victim]) -> bool:
    """A necessary condition, by counting: the node's usable GPUs not held once `mine` is gone are
    at least what one replica of `need` takes. Saves a placement per node that cannot help."""
    if need.profile.cpu:
        return True
    gone = {p.replica_id for _, unit in mine for p in unit}
    held = {g for p in on_node if p.replica_id not in gone for g in p.gpus}
    free = sum(1 for g in info.gpus if info.placeable(g) and g.index not in held)
    return free >= need.profile.gpus


def _multi_node(
    need: ModelDef, nodes: dict[str, NodeInfo], live: list[Placement], victims: list[_Victim],
    sources: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[_Victim]:
    """Whole free nodes: the idlest victims, in order, until `need` fits; then only those on the
    nodes it landed on."""
    if place(need, nodes, _without(live, victims), sources=sources).choice is None:
        return []
    taken: list[_Victim] = []
    for v in victims:
        taken.append(v)
        result = place(need, nodes, _without(live, taken), sources=sources)
        if result.choice is not None:
            landed = {m.node for m in result.choice.members} or {result.choice.node}
            kept = [t for t in taken if any(p.node in landed for p in t[1])]
            if place(need, nodes, _without(live, kept), sources=sources).choice is not None:
                return kept
            return taken
    return []
