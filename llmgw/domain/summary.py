"""The cluster summary (S10): one function that `ctl status`, the API and later the
console and metrics all read, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from llmgw.domain import judges
from llmgw.domain import summary_fleet as fleet
from llmgw.domain.observed import Gpu, Observed
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, Placement


def model_status(state: ClusterState, observed: Observed, name: str, view: Any | None) -> dict[str, Any]:
    """A model's health as the API shows it; `view` is the reconciler's ModelView or None (unknown)."""
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
        "last_error": health.last_error,
        "replicas": replicas,
    }


def nodes(state: ClusterState, observed: Observed) -> list[dict[str, Any]]:
    """Every node known: connected, lost, or still holding placements; unknown values are None."""
    docs = []
    used: dict[str, set[int]] = {}
    for p in state.placements.values():
        used.setdefault(p.node, set()).update(p.gpus)
    for name in sorted(set(observed.nodes) | set(observed.lost) | {p.node for p in state.placements.values()}):
        info = observed.nodes.get(name)
        docs.append({
            "node": name,
            "connected": info is not None,
            "hostname": info.hostname if info else None,
            "cpus": info.cpus if info else None,
            "memory_total": info.memory_total if info else None,
            "gpus": [g.to_doc() for g in info.gpus] if info else None,
            "gpu_counts": gpu_counts(info.gpus, used.get(name, set())) if info else None,
            "engines": list(info.engines) if info else None,
            # The engines installed there, each with its version ("" = installed, version not said).
            "engine_versions": dict(info.engine_versions) if info else None,
            "cpu_flags": list(info.cpu_flags) if info else None,
            "fabric": info.fabric if info else None,
            "storage": [dict(s) for s in info.storage] if info else None,
            "probe": info.probe if info else None,
            "warnings": list(info.warnings) if info else None,
            "lost_at": observed.lost.get(name),
        })
    return docs


def gpu_counts(gpus: Sequence[Gpu], used_indexes: set[int]) -> dict[str, Any]:
    """Devices as capacity: only usable ones (healthy and placeable) count, as used (a placement
    holds them) or free; the others are listed apart with their reasons, never counted as free
    or used (an unhealthy card, a MIG-mode card whose instances count instead, nothing carved)."""
    by_class: dict[str, dict[str, int]] = {}
    used = free = 0
    for g in gpus:
        if not g.usable:
            continue
        row = by_class.setdefault(g.gpu_class, {"used": 0, "free": 0})
        if g.index in used_indexes:
            used, row["used"] = used + 1, row["used"] + 1
        else:
            free, row["free"] = free + 1, row["free"] + 1
    unusable = [{"label": g.label, "class": g.gpu_class, "healthy": g.healthy, "reason": g.reason}
                for g in gpus if not g.usable]
    return {"used": used, "free": free, "by_class": by_class, "unusable": unusable}


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


def build(
    state: ClusterState,
    observed: Observed,
    views: Mapping[str, Any] | None,
    cluster: Mapping[str, Any],
    now: float | None = None,
) -> dict[str, Any]:
    """The whole summary. `views`: the reconciler's ModelView per model (None: it has not run);
    `now`: the clock demand times are on (None: every idle time is unknown)."""
    guard, guard_warnings = judges.guard_summary(state, observed, views, now)  # views None: not planned yet
    views = views or {}
    node_docs = nodes(state, observed)
    by_model: dict[str, list[Placement]] = {}
    for p in state.placements.values():
        by_model.setdefault(p.model, []).append(p)
    failed: dict[str, int] = {}
    for r in observed.replicas.values():
        if r.state == "failed":
            failed[r.model] = failed.get(r.model, 0) + 1
    models = []
    warnings: list[str] = []
    storm = int(effective(state.settings, "health.restart_storm_restarts"))
    for name, m in sorted(state.models.items()):
        row = model_row(state, name, views.get(name), failed.get(name, 0))
        # Restarts this leader counted within restart_window_s: a crash loop beside a ready replica shows.
        restarts = len(observed.restarts.get(name, ()))
        row |= {"restarts": restarts, "restart_storm": restarts >= storm}
        models.append({"name": name, "engine": m.engine, "role": m.role, "mode": m.mode, **row})
        if row["restart_storm"]:
            warnings.append(f"model {name}: {restarts} restarts of its replicas in the last restart window "
                            f"(a restart storm), {row['ready']}/{row['desired']} ready: "
                            f"{row['last_error'] or 'no error text'}")
        if row["parked"]:
            warnings.append(f"model {name} is parked: {row['reason']}")
        elif row["state"] == "unplaceable":
            warnings.append(f"model {name} cannot be placed: {row['reason']}")
        elif row["failures_in_row"] and row["state"] not in ("stopped", "absent"):
            # "ready 1/3" and nothing more is how a crash loop hides behind one good replica.
            warnings.append(f"model {name}: {row['failures_in_row']} failed start(s) in a row, "
                            f"{row['ready']}/{row['desired']} ready: {row['last_error'] or 'no error text'}")
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
    fabric_docs = fleet.fabrics(observed, used, grouped)
    warnings += fleet.fleet_warnings(fabric_docs, capacity, [n["node"] for n in node_docs if not n["connected"]])
    warnings += _probe_warnings(node_docs)
    members = cluster.get("members")
    warnings += member_warnings(members if isinstance(members, list) else [])
    return {
        "cluster": {**cluster, "revision": state.revision, "stopped": stopped},
        "nodes": node_docs,
        "node_counts": {"known": len(node_docs), "connected": len(observed.nodes),
                        "not_connected": sum(1 for n in node_docs if not n["connected"])},
        "capacity": capacity,
        "fabrics": fabric_docs,
        "weights": fleet.weights(fabric_docs),
        "models": models,
        "totals": fleet.totals(models),
        "idle": fleet.idle(state, observed, now, by_model),
        "warnings": warnings,
        "notify": {"webhooks": len(hooks)},
        "guard": guard,  # enabled, policies, judges (domain/judges.py)
    }


def model_row(state: ClusterState, name: str, view: Any | None, failed: int) -> dict[str, Any]:
    """One model as the summary counts it, from the reconciler's view (never re-derived here):
    desired is what it should have now, so a parked model that should run reads `0/1 parked`.
    `failed`: its replicas whose agents report a failed start."""
    health = state.model_health(name)
    return {
        "desired": view.desired if view else None,
        "ready": view.ready if view else None,
        "starting": view.starting if view else None,
        "placed": view.placed if view else None,
        "failed": getattr(view, "failed", failed) if view else None,
        "state": view.state if view else "unknown",
        "reason": view.reason if view else "the reconciler has not run yet",
        "parked": health.parked,
        "unplaceable": view.state == "unplaceable" if view else None,
        "satisfied": fleet.satisfied(view, health.parked),
        # The view's, when it says: failed starts counted across the model's replicas.
        "failures_in_row": getattr(view, "failures_in_row", health.failures_in_row),
        "last_error": getattr(view, "last_error", "") or health.last_error,
    }


def _probe_warnings(node_docs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The probes' words on GPU states, the same words on many nodes said once with how many."""
    said: dict[str, list[str]] = {}
    for n in node_docs:
        for w in n["warnings"] or ():
            said.setdefault(str(w), []).append(str(n["node"]))
    out = []
    for text, where in said.items():
        if len(where) == 1:
            out.append(f"node {where[0]}: {text}")
        else:
            more = f" and {len(where) - 3} more" if len(where) > 3 else ""
            out.append(f"{len(where)} nodes ({', '.join(where[:3])}{more}): {text}")
    return out
