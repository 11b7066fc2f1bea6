"""The cluster summary (S10): one function that `ctl status`, the API, the console and the metrics
all read, so they cannot disagree.

`summarize` builds a `Summary`: frozen rows (nodes, models, capacity per GPU class, fabrics, the
control planes, judges, warnings) that in-process readers (the conditions, the metrics, the console's
Overview) read by attribute. `Summary.to_doc()` is the document `GET /api/v1/status` answers and
`ctl status` reads, written at the HTTP edge only. A value nobody reported stays None, never 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llmgw.domain.activation import Progress
from llmgw.domain.frozen import Doc
from llmgw.domain import judges, schedule
from llmgw.domain import summary_fleet as fleet
from llmgw.domain.conditions import Condition
from llmgw.domain.judges import Guard
from llmgw.domain.observed import Gpu, Observed
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, Placement
from llmgw.domain.summary_fleet import CapacityRow, Fabric, IdleRow, Totals, Weight


# --- nodes ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuUse(Doc):
    """Usable devices of one class on a node: held by a placement, or free."""

    used: int
    free: int


@dataclass(frozen=True)
class UnusableGpu(Doc):
    """A device counted neither used nor free, and why (unhealthy, a MIG-mode card, nothing carved)."""

    label: str
    gpu_class: str = field(metadata={"doc": "class"})
    healthy: bool
    reason: str


@dataclass(frozen=True)
class GpuCounts(Doc):
    """A node's devices as capacity: usable ones used or free (in all and per class), the rest apart."""

    used: int
    free: int
    by_class: Mapping[str, GpuUse]
    unusable: tuple[UnusableGpu, ...]
    reserved: tuple[str, ...] = ()  # labels of usable devices kept for other work (`llmgw agent --reserve`)


@dataclass(frozen=True)
class NodeRow(Doc):
    """A node known to the leader: connected, lost, or still holding placements. What its agent
    reported is None while it is not connected (unknown, not empty)."""

    node: str
    connected: bool
    hostname: str | None
    cpus: int | None
    memory_total: int | None
    gpus: tuple[Gpu, ...] | None
    gpu_counts: GpuCounts | None
    engines: tuple[str, ...] | None
    engine_versions: Mapping[str, str] | None  # engine -> version ("" = installed, version not said)
    cpu_flags: tuple[str, ...] | None
    fabric: str | None
    storage: tuple[Mapping[str, Any], ...] | None  # the agent's report of each storage directory, as sent
    probe: str | None
    warnings: tuple[str, ...] | None  # the GPU probe's words on states in which nothing can run
    lost_at: float | None  # when its agent's stream closed; None while connected (or never seen)
    reserved_memory: int | None = None  # bytes of its memory kept for other work (`llmgw agent --reserve`)
    reserved_vram: int | None = None  # bytes of each GPU's memory kept for other work


@dataclass(frozen=True)
class NodeCounts(Doc):
    known: int
    connected: int
    not_connected: int


# --- models -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRow(Doc):
    """One model as the summary counts it, from the reconciler's view (None where it has none yet)."""

    name: str
    engine: str
    role: str
    mode: str
    desired: int | None  # what it should have now: a parked model that should run reads 0/1 parked
    ready: int | None
    starting: int | None
    placed: int | None
    failed: int | None  # replicas whose agents report a failed start
    state: str  # a route state, or "unknown" before the reconciler judged it
    reason: str
    parked: bool
    unplaceable: bool | None
    satisfied: bool | None  # has what it should have now; None: not judged yet
    failures_in_row: int  # failed starts in a row across its replicas
    last_error: str
    restarts: int  # restarts this leader counted within restart_window_s
    restart_storm: bool  # restarts at health.restart_storm_restarts or more
    # While it starts: how far (`llmgw.domain.activation.Progress.to_doc` as of the summary's time), else None.
    activation: Mapping[str, Any] | None = None
    window_s: float | None = None  # the activation window in force (longer than the definition's for a big checkpoint)
    base: str = ""  # a LoRA adapter's base model ("" for a model of its own)
    schedule: str = ""  # a model with schedule rules: which rules now and the next change, in words ("" without)


# --- the control planes -----------------------------------------------------------------------------------


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class MemberRow(Doc):
    """A control plane as the members' table lists it (`member_rows` builds the document): healthy,
    catching up or missing, with its reason; a number the asking member does not know is None."""

    id: str
    raft_addr: str
    admin_url: str | None
    version: str | None
    role: str | None  # leader or standby, as it said; None: it did not answer
    state: str  # healthy, catching up or missing
    reason: str
    leader: str | None
    term: int | None
    commit_index: int | None
    applied_index: int | None
    revision: int | None
    lag: int | None  # entries behind the leader's commit index
    last_contact: float | None
    last_contact_age_s: float | None
    state_hash: str | None

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> MemberRow:
        """A row of the members' table (`member_rows`'s document)."""
        return cls(id=str(d.get("id")), raft_addr=str(d.get("raft_addr", d.get("id"))),
                   admin_url=_str(d.get("admin_url")), version=_str(d.get("version")), role=_str(d.get("role")),
                   state=str(d.get("state") or ""), reason=str(d.get("reason") or ""), leader=_str(d.get("leader")),
                   term=_int(d.get("term")), commit_index=_int(d.get("commit_index")),
                   applied_index=_int(d.get("applied_index")), revision=_int(d.get("revision")),
                   lag=_int(d.get("lag")), last_contact=_float(d.get("last_contact")),
                   last_contact_age_s=_float(d.get("last_contact_age_s")), state_hash=_str(d.get("state_hash")))


@dataclass(frozen=True)
class FloatingAddress(Doc):
    """Whether the floating address is on the leader (`floating_address` builds the document):
    `configured` and `on_leader` True, False or None (unknown), `state` in words, `held_by` the
    members that say they hold it."""

    configured: bool | None
    address: str | None
    on_leader: bool | None
    held_by: tuple[str, ...]
    state: str
    reason: str

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> FloatingAddress:
        held = d.get("held_by")
        return cls(configured=_flag(d.get("configured")), address=_str(d.get("address")),
                   on_leader=_flag(d.get("on_leader")),
                   held_by=tuple(str(m) for m in held) if isinstance(held, (list, tuple)) else (),
                   state=str(d.get("state") or ""), reason=str(d.get("reason") or ""))

# The members' table's keys, each read into ClusterPart's field of that name ("self" into self_id).
TABLE_KEYS = ("self", "leader", "leader_url", "version", "member_change", "members", "floating_address",
              "gateways", "agents", "followers_reason", "warnings")


def _docs(value: Any) -> tuple[Mapping[str, Any], ...] | None:
    return tuple(dict(d) for d in value if isinstance(d, Mapping)) if isinstance(value, list) else None


@dataclass(frozen=True)
class ClusterPart:
    """The control planes as the members' table says them (the asking member's view: the members route's
    document), with the state's revision and whether serving is stopped. A key the table did not carry
    reads None and stays out of `to_doc()`: `said` keeps the table's keys in its order."""

    revision: int
    stopped: bool
    leader: str | None = None
    self_id: str | None = None
    leader_url: str | None = None
    version: str | None = None
    member_change: str | None = None  # a membership change in flight, in words
    members: tuple[MemberRow, ...] | None = None  # None: the table lists none (no word on the group)
    floating_address: FloatingAddress | None = None
    gateways: tuple[Mapping[str, Any], ...] | None = None  # as the leader lists them; None: unknown
    agents: tuple[Mapping[str, Any], ...] | None = None
    followers_reason: str | None = None  # why gateways and agents are unknown ("": they are known)
    warnings: tuple[str, ...] | None = None  # the table's own (members missing or behind, the address)
    said: tuple[str, ...] = ()  # the table's keys, in its order
    extra: Mapping[str, Any] | None = None  # what else the table carried, as it carried it

    @classmethod
    def from_table(cls, table: Mapping[str, Any], revision: int, stopped: bool) -> ClusterPart:
        """From the members' table document (`{}` when none was asked: every part unknown)."""
        members, floating, warnings = table.get("members"), table.get("floating_address"), table.get("warnings")
        return cls(
            revision=revision, stopped=stopped, leader=_str(table.get("leader")), self_id=_str(table.get("self")),
            leader_url=_str(table.get("leader_url")), version=_str(table.get("version")),
            member_change=_str(table.get("member_change")),
            members=tuple(MemberRow.from_doc(r) for r in members if isinstance(r, Mapping))
            if isinstance(members, list) else None,
            floating_address=FloatingAddress.from_doc(floating) if isinstance(floating, Mapping) else None,
            gateways=_docs(table.get("gateways")), agents=_docs(table.get("agents")),
            followers_reason=_str(table.get("followers_reason")),
            warnings=tuple(str(w) for w in warnings) if isinstance(warnings, list) else None,
            said=tuple(table), extra={k: v for k, v in table.items() if k not in TABLE_KEYS} or None)

    def to_doc(self) -> dict[str, Any]:
        known: dict[str, Any] = {
            "self": self.self_id, "leader": self.leader, "leader_url": self.leader_url, "version": self.version,
            "member_change": self.member_change,
            "members": None if self.members is None else [m.to_doc() for m in self.members],
            "floating_address": None if self.floating_address is None else self.floating_address.to_doc(),
            "gateways": None if self.gateways is None else [dict(d) for d in self.gateways],
            "agents": None if self.agents is None else [dict(d) for d in self.agents],
            "followers_reason": self.followers_reason,
            "warnings": None if self.warnings is None else list(self.warnings),
        }
        extra = self.extra or {}
        doc = {k: known[k] if k in known else extra.get(k) for k in self.said}
        return {**doc, "revision": self.revision, "stopped": self.stopped}


# --- the whole summary ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Notify(Doc):
    webhooks: int  # URLs in notify.webhooks


@dataclass(frozen=True)
class CertRow(Doc):
    """A certificate the cluster holds for a machine (its newest), or an intermediate CA (role "ca",
    its id as the name): when it stops being valid."""

    role: str
    name: str
    not_after: float
    expires_in_s: float | None  # None: the summary has no clock


def certificates(state: ClusterState, now: float | None) -> tuple[CertRow, ...]:
    rows = [CertRow(m.role, m.name, m.not_after, None if now is None else m.not_after - now)
            for _, m in sorted(state.machines.items())]
    rows += [CertRow("ca", aid, a.not_after, None if now is None else a.not_after - now)
             for aid, a in sorted(state.authorities.items())]
    return tuple(rows)


@dataclass(frozen=True)
class Summary:
    """The cluster now, as `ctl status` shows it. `conditions` is None until `with_conditions` sets the
    failures found in it (`llmgw.domain.conditions`)."""

    cluster: ClusterPart
    nodes: tuple[NodeRow, ...]
    node_counts: NodeCounts
    capacity: tuple[CapacityRow, ...]
    fabrics: tuple[Fabric, ...]
    weights: tuple[Weight, ...]
    models: tuple[ModelRow, ...]
    totals: Totals
    idle: tuple[IdleRow, ...]
    warnings: tuple[str, ...]
    notify: Notify
    guard: Guard  # enabled, policies, judges (domain/judges.py)
    certificates: tuple[CertRow, ...] = ()  # machines' and the CA's (domain/trust.py)
    conditions: tuple[Condition, ...] | None = None

    def with_conditions(self, found: Iterable[Condition]) -> Summary:
        """This summary with the failures true now; a failing webhook's words join the warnings too (the
        one failure the summary cannot know by itself: `ctl status` prints it with the rest)."""
        found = tuple(found)
        return replace(self, conditions=found,
                       warnings=self.warnings + tuple(c.words for c in found if c.kind == "webhook_failing"))

    def to_doc(self) -> dict[str, Any]:
        """The document `GET /api/v1/status` answers (and `ctl status --json` prints)."""
        doc = {
            "cluster": self.cluster.to_doc(),
            "nodes": [n.to_doc() for n in self.nodes],
            "node_counts": self.node_counts.to_doc(),
            "capacity": [c.to_doc() for c in self.capacity],
            "fabrics": [f.to_doc() for f in self.fabrics],
            "weights": [w.to_doc() for w in self.weights],
            "models": [m.to_doc() for m in self.models],
            "totals": self.totals.to_doc(),
            "idle": [r.to_doc() for r in self.idle],
            "warnings": list(self.warnings),
            "notify": self.notify.to_doc(),
            "guard": self.guard.to_doc(),
            "certificates": [c.to_doc() for c in self.certificates],
        }
        if self.conditions is not None:
            doc["conditions"] = [c.to_doc() for c in self.conditions]
        return doc


def summarize(
    state: ClusterState,
    observed: Observed,
    views: Mapping[str, Any] | None,
    cluster: Mapping[str, Any],
    now: float | None = None,
) -> Summary:
    """The whole summary. `views`: the reconciler's ModelView per model (None: it has not run);
    `cluster`: the members' table document; `now`: the clock demand times are on (None: every idle
    time is unknown)."""
    guard, guard_warnings = judges.guard_summary(state, observed, views, now)  # views None: not planned yet
    views = views or {}
    known = node_rows(state, observed)
    by_model: dict[str, list[Placement]] = {}
    for p in state.placements.values():
        by_model.setdefault(p.model, []).append(p)
    failed: dict[str, int] = {}
    for r in observed.replicas.values():
        if r.state == "failed":
            failed[r.model] = failed.get(r.model, 0) + 1
    storm = int(effective(state.settings, "health.restart_storm_restarts"))
    # Restarts this leader counted within restart_window_s: a crash loop beside a ready replica shows.
    models = tuple(model_row(state, name, views.get(name), failed.get(name, 0),
                             len(observed.restarts.get(name, ())), storm, now) for name in sorted(state.models))
    warnings = [w for m in models for w in _model_warnings(m)]
    stopped = bool(effective(state.settings, "serving.stopped"))
    if stopped:
        warnings.append("serving is stopped: every model wants 0 replicas (`llmgw start` resumes)")
    warnings += guard_warnings
    hooks = effective(state.settings, "notify.webhooks")
    if not hooks:
        warnings.append("no notify.webhooks set: lost nodes and parked models reach nobody "
                        "(llmgw ctl settings notify.webhooks '[\"https://...\"]')")
    used, grouped = fleet.used_devices(state.placements.values())
    capacity = fleet.capacity(observed, used)
    fabrics = fleet.fabrics(observed, used, grouped)
    warnings += fleet.fleet_warnings(fabrics, capacity, [n.node for n in known if not n.connected])
    warnings += _probe_warnings(known)
    pending = sorted(state.pending_nodes(observed.nodes))
    if pending:  # nodes.require_approval: connected, counted in capacity, but nothing is placed on them
        shown = ", ".join(pending[:5]) + (f" and {len(pending) - 5} more" if len(pending) > 5 else "")
        warnings.append(f"{len(pending)} node(s) waiting for approval: {shown} (nothing is placed on them until "
                        f"`llmgw ctl nodes approve NAME`)")
    for name, mode in sorted(state.cordoned_nodes.items()):  # maintenance (`ctl nodes cordon|drain`)
        if mode == "drain":
            left = len({p.group or p.replica_id for p in state.placements.values() if p.node == name})
            warnings.append(f"node {name} is draining: {left} replica(s) left" if left else
                            f"node {name} is drained: no replica left (`llmgw ctl nodes uncordon {name}` "
                            f"ends it)")
        else:
            warnings.append(f"node {name} is cordoned: nothing new is placed on it (`llmgw ctl nodes uncordon "
                            f"{name}` ends it)")
    members = cluster.get("members")
    warnings += member_warnings(members if isinstance(members, list) else [])
    return Summary(
        cluster=ClusterPart.from_table(cluster, state.revision, stopped),
        nodes=known,
        node_counts=NodeCounts(known=len(known), connected=len(observed.nodes),
                               not_connected=sum(1 for n in known if not n.connected)),
        capacity=capacity,
        fabrics=fabrics,
        weights=fleet.weights(fabrics),
        models=models,
        totals=fleet.totals(models),
        idle=fleet.idle(state, observed, now, by_model),
        warnings=tuple(warnings),
        notify=Notify(len(hooks)),
        guard=guard,
        certificates=certificates(state, now),
    )


def _model_warnings(m: ModelRow) -> list[str]:
    """A model's warnings, its last error said once: a restart storm of a model that is parked or failing its
    starts is one line, not two quoting the same error."""
    storm = (f"{m.restarts} restarts of its replicas in the last restart window (a restart storm)"
             if m.restart_storm else "")
    if m.parked:
        return [f"model {m.name} is parked: {m.reason}" + (f" ({storm})" if storm else "")]
    out = []
    if m.state == "unplaceable" and m.base:
        out.append(f"LoRA adapter {m.name} of {m.base} is loaded on no replica: {m.reason}")
    elif m.state == "unplaceable":
        out.append(f"model {m.name} cannot be placed: {m.reason}")
    elif m.failures_in_row and m.state not in ("stopped", "absent"):
        # "ready 1/3" and nothing more is how a crash loop hides behind one good replica.
        said = f"{storm}, " if storm else ""
        return [f"model {m.name}: {said}{m.failures_in_row} failed start(s) in a row, "
                f"{m.ready}/{m.desired} ready: {m.last_error or 'no error text'}"]
    if storm:
        out.insert(0, f"model {m.name}: {storm}, {m.ready}/{m.desired} ready: {m.last_error or 'no error text'}")
    return out


def model_row(state: ClusterState, name: str, view: Any | None, failed: int, restarts: int, storm: int,
              now: float | None = None) -> ModelRow:
    """One model as the summary counts it, from the reconciler's view (never re-derived here):
    desired is what it should have now, so a parked model that should run reads `0/1 parked`.
    `failed`: its replicas whose agents report a failed start; `restarts`: counted within the
    restart window, a storm at `storm` or more; `now`: the clock the activation's ETA is read on."""
    m = state.models[name]
    health = state.model_health(name)
    return ModelRow(
        name=name, engine=m.engine, role=m.role, mode=m.mode,
        desired=view.desired if view else None,
        ready=view.ready if view else None,
        starting=view.starting if view else None,
        placed=view.placed if view else None,
        failed=getattr(view, "failed", failed) if view else None,
        state=view.state if view else "unknown",
        reason=view.reason if view else "the reconciler has not run yet",
        parked=health.parked,
        unplaceable=view.state == "unplaceable" if view else None,
        satisfied=fleet.satisfied(view, health.parked),
        # The view's, when it says: failed starts counted across the model's replicas.
        failures_in_row=getattr(view, "failures_in_row", health.failures_in_row),
        last_error=getattr(view, "last_error", "") or health.last_error,
        restarts=restarts,
        restart_storm=restarts >= storm,
        activation=activation_doc(view, now),
        window_s=(getattr(view, "window_s", 0.0) or m.activation_window_s) if view else None,
        base=m.base,
        schedule=str(_schedule_status(state, name, now).get("schedule", {}).get("words", "")),
    )


def activation_doc(view: Any | None, now: float | None) -> dict[str, Any] | None:
    """A starting model's progress for the API (`eta_s`, `elapsed_s` and `words` as of `now`, when given);
    None when it is not starting or the view does not say."""
    progress: Progress | None = getattr(view, "activation", None) if view else None
    if progress is None:
        return None
    if now is None:
        return progress.to_doc()
    return {**progress.to_doc(now), "words": progress.words(now)}


def node_rows(state: ClusterState, observed: Observed) -> tuple[NodeRow, ...]:
    """Every node known: connected, lost, or still holding placements; unknown values are None."""
    rows = []
    used: dict[str, set[int]] = {}
    for p in state.placements.values():
        used.setdefault(p.node, set()).update(p.gpus)
    for name in sorted(set(observed.nodes) | set(observed.lost) | {p.node for p in state.placements.values()}):
        info = observed.nodes.get(name)
        rows.append(NodeRow(
            node=name,
            connected=info is not None,
            hostname=info.hostname if info else None,
            cpus=info.cpus if info else None,
            memory_total=info.memory_total if info else None,
            gpus=tuple(info.gpus) if info else None,
            gpu_counts=gpu_counts(info.gpus, used.get(name, set()), set(info.reserved_gpus)) if info else None,
            engines=tuple(info.engines) if info else None,
            engine_versions=dict(info.engine_versions) if info else None,
            cpu_flags=tuple(info.cpu_flags) if info else None,
            fabric=info.fabric if info else None,
            storage=tuple(dict(s) for s in info.storage) if info else None,
            probe=info.probe if info else None,
            warnings=tuple(info.warnings) if info else None,
            lost_at=observed.lost.get(name),
            reserved_memory=info.reserved_memory if info else None,
            reserved_vram=info.reserved_vram if info else None,
        ))
    return tuple(rows)


def nodes(state: ClusterState, observed: Observed) -> list[dict[str, Any]]:
    """`node_rows` as documents (the nodes route's)."""
    return [n.to_doc() for n in node_rows(state, observed)]


def gpu_counts(gpus: Sequence[Gpu], used_indexes: set[int], reserved: set[int] | None = None) -> GpuCounts:
    """Devices as capacity: only usable ones (healthy and placeable) count, as used (a placement
    holds them) or free; the others are listed apart with their reasons, never counted as free
    or used (an unhealthy card, a MIG-mode card whose instances count instead, nothing carved).
    Usable devices the node reserves for other work are listed apart too (`reserved`), unless a
    placement still holds one (from before the reserve): that one counts as used."""
    by_class: dict[str, list[int]] = {}
    kept: list[str] = []
    for g in gpus:
        if g.usable and reserved and g.index in reserved and g.index not in used_indexes:
            kept.append(g.label)
        elif g.usable:
            by_class.setdefault(g.gpu_class, [0, 0])[0 if g.index in used_indexes else 1] += 1
    unusable = tuple(UnusableGpu(g.label, g.gpu_class, g.healthy, g.reason) for g in gpus if not g.usable)
    return GpuCounts(used=sum(u for u, _ in by_class.values()), free=sum(f for _, f in by_class.values()),
                     by_class={c: GpuUse(u, f) for c, (u, f) in by_class.items()}, unusable=unusable,
                     reserved=tuple(kept))


def _probe_warnings(rows: Iterable[NodeRow]) -> list[str]:
    """The probes' words on GPU states, the same words on many nodes said once with how many."""
    said: dict[str, list[str]] = {}
    for n in rows:
        for w in n.warnings or ():
            said.setdefault(str(w), []).append(n.node)
    out = []
    for text, where in said.items():
        if len(where) == 1:
            out.append(f"node {where[0]}: {text}")
        else:
            more = f" and {len(where) - 3} more" if len(where) > 3 else ""
            out.append(f"{len(where)} nodes ({', '.join(where[:3])}{more}): {text}")
    return out


def model_status(state: ClusterState, observed: Observed, name: str, view: Any | None,
                 now: float | None = None) -> dict[str, Any]:
    """A model's health as the API shows it; `view` is the reconciler's ModelView or None (unknown); `now`
    the clock its activation's ETA is read on."""
    health = state.model_health(name)
    replicas = []
    for p in state.placements_of(name):
        obs = observed.replicas.get(p.replica_id)
        replicas.append({
            "replica_id": p.replica_id,
            "node": p.node,
            "gpus": list(p.gpus),
            "state": obs.state if obs else ("unknown" if p.node not in observed.nodes else "starting"),
            "url": obs.url if obs else "",
            "error": obs.error if obs else "",
        })
    return {
        "desired": view.desired if view else None,
        "ready": view.ready if view else None,
        "starting": view.starting if view else None,
        "state": view.state if view else "unknown",
        "reason": view.reason if view else "the reconciler has not run yet",
        "parked": health.parked,
        "failures_in_row": health.failures_in_row,
        "flaps": health.flaps,  # of those failures, replicas that served less than stable_ready_s, then failed
        "flap_ready_s": health.flap_ready_s,  # the longest any of them served
        "last_error": health.last_error,
        "activation": activation_doc(view, now),
        "window_s": (getattr(view, "window_s", 0.0) or state.models[name].activation_window_s) if view else None,
        "replicas": replicas,
        **_adapter_status(state, observed, name),
        **_schedule_status(state, name, now),
    }


def _schedule_status(state: ClusterState, name: str, now: float | None) -> dict[str, Any]:
    """A model with schedule rules: `schedule`, which rules at `now` and when that changes (`Ruling.to_doc`)."""
    model = state.models[name]
    if not model.schedules or now is None:
        return {}
    ruled = schedule.in_force(model.schedules, model.replicas_min, model.replicas_max, now,
                              effective(state.settings, "cluster.time_zone"))
    return {"schedule": ruled.to_doc(model.schedules)} if ruled is not None else {}


def _adapter_status(state: ClusterState, observed: Observed, name: str) -> dict[str, Any]:
    """A LoRA adapter's state on each replica of its base (`adapter_on`: replica id -> loaded, loading, or
    "failed: why"; a replica not asked yet is absent); a base's adapters (`adapters`: their names)."""
    model = state.models[name]
    if model.base:
        on = {p.replica_id: obs.adapter(name) for p in state.placements_of(model.base)
              if (obs := observed.replicas.get(p.replica_id)) is not None and obs.adapter(name)}
        return {"adapter_on": on}
    adapters = sorted(n for n, m in state.models.items() if m.base == name)
    return {"adapters": adapters} if adapters else {}


# A member further than this behind the leader's commit index is "catching up", not "healthy".
MEMBER_LAG_HEALTHY = 100


def member_rows(views: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """The control planes as `GET /api/v1/cluster/members` shows them, from what the asking member
    saw of each: `{"id", "admin_url", "answer": its /cluster/self document or None, "error": why
    it did not answer, "last_contact": when it last did (unix time) or None}`.

    Each row: healthy, catching up or missing, with its reason; a number this member does not know
    is None, never 0. The lag is counted against the leader's commit index (the highest answered
    when no leader answered)."""
    answers = [v["answer"] for v in views if v.get("answer")]
    leaders = sorted((a for a in answers if a.get("role") == "leader"), key=lambda a: a.get("term") or 0)
    commits = [a.get("commit_index") for a in (leaders[-1:] or answers) if isinstance(a.get("commit_index"), int)]
    reference = max(commits) if commits else None
    rows = []
    for v in views:
        a: Mapping[str, Any] = v.get("answer") or {}
        applied = a.get("applied_index")
        lag = reference - applied if isinstance(reference, int) and isinstance(applied, int) else None
        if not a:
            state, reason = "missing", str(v.get("error") or "it did not answer")
        elif not a.get("ready"):
            state, reason = "catching up", "it has not applied its Raft log yet (starting, or no leader)"
        elif a.get("leader") is None:
            state, reason = "catching up", "it knows no leader (cut off from the others' Raft traffic?)"
        elif lag is not None and lag > MEMBER_LAG_HEALTHY:
            state, reason = "catching up", f"{lag} entries behind the leader's commit index"
        else:
            state, reason = "healthy", ""
        contact = v.get("last_contact")
        rows.append({
            "id": v["id"],
            "raft_addr": v["id"],
            "admin_url": a.get("admin_url") or v.get("admin_url"),
            "version": a.get("version"),
            "store_level": a.get("store_level"),  # what its release reads (llmgw.domain.levels)
            "release_sha256": a.get("release_sha256"),  # the file it runs (llmgw/release.py): `ctl upgrade`
            "role": a.get("role"),
            "state": state,
            "reason": reason,
            "leader": a.get("leader"),
            "term": a.get("term"),
            "commit_index": a.get("commit_index"),
            "applied_index": applied,
            "revision": a.get("revision"),
            "lag": max(lag, 0) if lag is not None else None,
            "last_contact": contact,
            "last_contact_age_s": round(max(now - contact, 0.0), 3) if isinstance(contact, (int, float)) else None,
            "state_hash": a.get("state_hash"),
        })
    return rows


def member_warnings(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What an operator should know about the control planes: who is missing or behind, how many
    more failures the group survives, two leaders, states that differ at the same revision."""
    warnings = []
    for r in rows:
        if r.get("state") in ("missing", "catching up"):
            warnings.append(f"control plane {r.get('id')} is {r.get('state')}: {r.get('reason')}")
    n = len(rows)
    healthy = sum(1 for r in rows if r.get("state") == "healthy")
    majority = n // 2 + 1
    if n > 1 and healthy < majority:
        warnings.append(f"only {healthy} of {n} control planes are healthy: writes need {majority} (a majority)")
    elif n > 1 and healthy == majority:
        warnings.append(f"{healthy} of {n} control planes are healthy: one more failure stops writes")
    if n > 1 and n % 2 == 0:
        warnings.append(f"the group has {n} members: it survives no more failures than {n - 1} would; "
                        f"add or remove one (`llmgw ctl members`)")
    versions = sorted({str(r["version"]) for r in rows if r.get("version")})
    if len(versions) > 1:
        older = [str(r.get("id")) for r in rows if r.get("version") and r.get("store_level") is not None
                 and r["store_level"] < max(x.get("store_level") or 0 for x in rows)]
        warnings.append(f"the control planes run {len(versions)} versions ({', '.join(versions)}): an upgrade is under "
                        f"way" + (f"; what the newer release brought waits until {', '.join(older)} run it too"
                                  if older else ""))
    leading = sorted(str(r.get("id")) for r in rows if r.get("role") == "leader")
    if len(leading) > 1:
        warnings.append(f"more than one member says it leads ({', '.join(leading)}): the older term steps down "
                        f"within raft_leader_fallback_s")
    by_revision: dict[Any, set[str]] = {}
    for r in rows:
        if r.get("revision") is not None and r.get("state_hash"):
            by_revision.setdefault(r["revision"], set()).add(str(r["state_hash"]))
    for revision, hashes in sorted(by_revision.items()):
        if len(hashes) > 1:
            warnings.append(f"control planes hold different states at revision {revision} (state hashes differ): "
                            f"a member diverged; replace its state dir from a healthy member")
    return warnings


def followers(views: Sequence[Mapping[str, Any]], leader: str | None) -> dict[str, Any]:
    """The gateways and agents, as the leader's own answer lists them (they attach to the leader
    alone, so no other member knows them): `None`, with the reason, when the leader did not
    answer — unknown, never an empty list."""
    view = next((v for v in views if leader is not None and v.get("id") == leader), None)
    answer: Mapping[str, Any] = (view or {}).get("answer") or {}
    if answer.get("role") == "leader":
        return {"gateways": answer.get("gateways"), "agents": answer.get("agents"), "followers_reason": ""}
    if leader is None:
        why = "no leader is elected"
    elif not answer:
        why = f"the leader {leader} did not answer ({(view or {}).get('error') or 'not asked'})"
    else:
        why = f"{leader} no longer says it leads"
    return {"gateways": None, "agents": None,
            "followers_reason": f"{why}: gateways and agents attach to the leader alone, so only it lists them"}


def floating_address(views: Sequence[Mapping[str, Any]], leader: str | None) -> dict[str, Any]:
    """Whether the floating address is on the leader, from what each member said of its own
    (`FloatingDuty.status()`, or `{"configured": False}`): `on_leader` True, False or None
    (unknown), `state` in words, `held_by` the members that say they hold it."""
    said = {str(v.get("id")): (v.get("answer") or {}).get("floating") for v in views if v.get("answer")}
    configured = {m: f for m, f in said.items() if isinstance(f, Mapping) and f.get("configured")}
    if not configured:
        if said:
            return {"configured": False, "address": None, "on_leader": None, "held_by": [],
                    "state": "not configured", "reason": "no member runs with --floating-address"}
        return {"configured": None, "address": None, "on_leader": None, "held_by": [],
                "state": "unknown", "reason": "no member answered"}
    address = next(iter(configured.values())).get("address")
    held_by = sorted(m for m, f in configured.items() if f.get("held") is True)
    mine = configured.get(leader or "")
    if leader is None:
        on_leader, state, reason = None, "no leader", "no leader is elected: no member should hold it"
    elif mine is None:
        on_leader = None if leader not in said else False
        state = "unknown" if on_leader is None else "not on the leader"
        reason = (f"the leader {leader} did not answer" if on_leader is None
                  else f"the leader {leader} runs without --floating-address")
    elif mine.get("held") is True:
        on_leader, state, reason = True, "on the leader", ""
    elif mine.get("held") is False:
        on_leader, state = False, "not on the leader"
        reason = str(mine.get("error") or "the leader has not claimed it yet")
    else:
        on_leader, state = None, "unknown"
        reason = str(mine.get("error") or "the leader has not checked it yet")
    return {"configured": True, "address": address, "on_leader": on_leader, "held_by": held_by,
            "state": state, "reason": reason}


def floating_warnings(floating: Mapping[str, Any], leader: str | None) -> list[str]:
    if not floating.get("configured"):
        return []
    warnings = []
    if floating.get("on_leader") is False:
        warnings.append(f"the floating address {floating.get('address')} is not on the leader: "
                        f"{floating.get('reason')}")
    others = [m for m in floating.get("held_by") or () if m != leader]
    if others:
        warnings.append(f"the floating address {floating.get('address')} is held by {', '.join(others)}, which "
                        f"does not lead: it releases it within floating_verify_s")
    return warnings


