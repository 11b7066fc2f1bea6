"""The cluster summary (S10): one function that `ctl status`, the API and later the
console and metrics all read, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any, Mapping

from llmgw.domain.observed import Observed
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState


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
    for name in sorted(set(observed.nodes) | set(observed.lost) | {p.node for p in state.placements.values()}):
        info = observed.nodes.get(name)
        docs.append({
            "node": name,
            "connected": info is not None,
            "hostname": info.hostname if info else None,
            "cpus": info.cpus if info else None,
            "memory_total": info.memory_total if info else None,
            "gpus": [g.to_doc() for g in info.gpus] if info else None,
            "engines": list(info.engines) if info else None,
            "lost_at": observed.lost.get(name),
        })
    return docs


def build(
    state: ClusterState,
    observed: Observed,
    views: Mapping[str, Any] | None,
    cluster: Mapping[str, Any],
) -> dict[str, Any]:
    views = views or {}
    node_docs = nodes(state, observed)
    models = []
    warnings: list[str] = []
    for name, m in sorted(state.models.items()):
        st = model_status(state, observed, name, views.get(name))
        st.pop("replicas")
        models.append({"name": name, "engine": m.engine, "role": m.role, "mode": m.mode, **st})
        if st["parked"]:
            warnings.append(f"model {name} is parked: {st['reason']}")
        elif st["state"] == "unplaceable":
            warnings.append(f"model {name} cannot be placed: {st['reason']}")
    stopped = bool(effective(state.settings, "serving.stopped"))
    if stopped:
        warnings.append("serving is stopped: every model wants 0 replicas (`llmgw ctl settings serving.stopped false` resumes)")
    hooks = effective(state.settings, "notify.webhooks")
    if not hooks:
        warnings.append("no notify.webhooks set: lost nodes and parked models reach nobody "
                        "(llmgw ctl settings notify.webhooks '[\"https://...\"]')")
    for n in node_docs:
        if not n["connected"]:
            warnings.append(f"node {n['node']} is not connected")
    return {
        "cluster": {**cluster, "revision": state.revision, "stopped": stopped},
        "nodes": node_docs,
        "models": models,
        "warnings": warnings,
        "notify": {"webhooks": len(hooks)},
    }
