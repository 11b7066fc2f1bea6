"""The fleet-scale parts of the cluster summary: capacity per GPU class, free whole nodes and
stored weights per fabric, model and replica counts, and what has gone unasked-for.

Pure aggregates over the state and what agents report, so `ctl status` reads the same at 4 nodes
as at 400. Unknown stays unknown: None (or a negative idle time), never 0.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from llmgw.domain.model import is_mig_class
from llmgw.domain.observed import Gpu, NodeInfo, Observed
from llmgw.domain.state import ClusterState, Placement

NO_FABRIC = ""  # nodes with no fabric configured: never hosts of a multi-node replica
UNKNOWN_IDLE = -1.0  # JSON's word for "not observed since this leader started": never idle


def used_devices(placements: Iterable[Placement]) -> tuple[dict[str, set[int]], set[str]]:
    """Per node, the device indexes placements hold; and the nodes running a group member."""
    used: dict[str, set[int]] = {}
    grouped: set[str] = set()
    for p in placements:
        used.setdefault(p.node, set()).update(p.gpus)
        if p.group:
            grouped.add(p.node)
    return used, grouped


def _carved_cards(gpus: Iterable[Gpu]) -> set[int]:
    """Cards whose MIG instances are listed: their capacity is counted as the instances'."""
    return {g.parent_index for g in gpus if g.parent_index is not None}


def whole_free(info: NodeInfo, used: set[int], grouped: bool) -> bool:
    """Whether a node could host a member of a multi-node replica now, as placement reads it:
    it has usable whole cards, none of its usable devices is placed, no group member runs there."""
    usable = [g for g in info.gpus if g.usable]
    return (not grouped and any(not is_mig_class(g.gpu_class) for g in usable)
            and not any(g.index in used for g in usable))


def capacity(observed: Observed, used: Mapping[str, set[int]]) -> list[dict[str, Any]]:
    """Per GPU class (MIG instance profiles are classes of their own): devices used by a
    placement, free, and unusable (unhealthy, or placeable no longer). Connected nodes only: a
    lost node's devices are unknown. A card split into MIG instances counts as its instances."""
    rows: dict[str, dict[str, Any]] = {}
    for name in sorted(observed.nodes):
        info = observed.nodes[name]
        carved = _carved_cards(info.gpus)
        taken = used.get(name, set())
        for g in info.gpus:
            if g.index in carved:
                continue
            row = rows.setdefault(g.gpu_class, {"class": g.gpu_class, "mig": is_mig_class(g.gpu_class),
                                                "used": 0, "free": 0, "unusable": 0, "nodes": set()})
            row["nodes"].add(name)
            if not g.usable:
                row["unusable"] += 1
            elif g.index in taken:
                row["used"] += 1
            else:
                row["free"] += 1
    out = []
    for gpu_class in sorted(rows):
        row = rows[gpu_class]
        out.append({**row, "nodes": len(row["nodes"]), "total": row["used"] + row["free"] + row["unusable"]})
    return out


def fabrics(observed: Observed, used: Mapping[str, set[int]], grouped: set[str]) -> list[dict[str, Any]]:
    """Per fabric (the nodes' own; "" = none configured): its connected nodes, how many are
    whole and free (what a multi-node replica needs: free cards on another fabric do not count),
    GPUs used and free, and the weights its storage holds. A shared directory counts once for
    the fabric however many nodes mount it; a local one once per node holding it."""
    out: dict[str, dict[str, Any]] = {}

    def row(fabric: str) -> dict[str, Any]:
        return out.setdefault(fabric, {
            "fabric": fabric, "nodes": 0, "whole_free_nodes": 0, "gpus_used": 0, "gpus_free": 0,
            "shared": {}, "local_dirs": 0, "local_nodes": set(), "models": {}, "not_weights": 0, "errors": [],
        })

    for name in sorted(observed.nodes):
        info = observed.nodes[name]
        r = row(info.fabric)
        r["nodes"] += 1
        taken = used.get(name, set())
        r["whole_free_nodes"] += whole_free(info, taken, name in grouped)
        for g in info.gpus:
            if g.usable:
                r["gpus_used" if g.index in taken else "gpus_free"] += 1
        for report in info.storage:
            _add_storage(row(str(report.get("fabric") or info.fabric)), name, report)
    return [_fabric_doc(out[f]) for f in sorted(out)]


def _add_storage(r: dict[str, Any], node: str, report: Mapping[str, Any]) -> None:
    path = str(report.get("path", ""))
    names = sorted({str(m.get("name")) for m in report.get("models") or () if isinstance(m, Mapping)})
    r["not_weights"] += len(report.get("not_weights") or ()) + int(report.get("omitted") or 0)
    if report.get("error"):
        r["errors"].append(f"{node}:{path}: {report.get('error')}")
    if report.get("shared") is True:
        shared = r["shared"].setdefault(path, {"path": path, "nodes": set(), "models": set()})
        shared["nodes"].add(node)
        shared["models"].update(names)
        for n in names:
            r["models"].setdefault(n, {"name": n, "shared": True, "nodes": set()})["shared"] = True
        return
    r["local_dirs"] += 1
    r["local_nodes"].add(node)
    for n in names:
        r["models"].setdefault(n, {"name": n, "shared": False, "nodes": set()})["nodes"].add(node)


def _fabric_doc(r: dict[str, Any]) -> dict[str, Any]:
    shared = [{"path": s["path"], "nodes": len(s["nodes"]), "models": sorted(s["models"])}
              for _, s in sorted(r["shared"].items())]
    models = [{"name": m["name"], "shared": m["shared"], "local_nodes": len(m["nodes"])}
              for _, m in sorted(r["models"].items())]
    return {**r, "shared": shared, "local_nodes": len(r["local_nodes"]), "models": models}


def weights(fabric_docs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each stored model by name: the fabrics that hold it (a shared directory, or local copies)
    and how many nodes hold a local copy. A model on one fabric only cannot be served elsewhere
    without a copy over the management network."""
    by_name: dict[str, dict[str, Any]] = {}
    for f in fabric_docs:
        for m in f["models"]:
            w = by_name.setdefault(m["name"], {"name": m["name"], "fabrics": [], "shared_on": [], "local_nodes": 0})
            w["fabrics"].append(f["fabric"])
            if m["shared"]:
                w["shared_on"].append(f["fabric"])
            w["local_nodes"] += m["local_nodes"]
    return [by_name[n] for n in sorted(by_name)]


def idle(state: ClusterState, observed: Observed, now: float | None,
         by_model: Mapping[str, list[Placement]]) -> list[dict[str, Any]]:
    """Models holding replicas, longest unasked-for first; one never asked for since this
    leader began observing is unknown (`idle_s` negative), listed after the known ones: unknown
    is not idle."""
    rows: list[dict[str, Any]] = []
    for name, mine in by_model.items():
        model = state.models.get(name)
        serving = [p for p in mine if p.serves]
        if model is None or not serving:
            continue
        asked = observed.demand.get(name)
        idle_s = UNKNOWN_IDLE if asked is None or now is None else round(max(now - asked, 0.0), 3)
        rows.append({"model": name, "mode": model.mode, "replicas": len(serving),
                     "gpus": sum(len(p.gpus) for p in mine), "idle_s": idle_s,
                     "idle_timeout_s": model.idle_timeout_s if model.mode == "on-demand" else None})
    rows.sort(key=lambda r: (float(r["idle_s"]) < 0, -float(r["idle_s"]), str(r["model"])))
    return rows


def totals(models: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Models by how they stand, and replicas summed: `unknown` counts models the reconciler
    has not judged yet (their replicas are left out of the sums, not counted as 0)."""
    counts = {"models": 0, "satisfied": 0, "short": 0, "starting": 0, "parked": 0, "unplaceable": 0,
              "stopped": 0, "unknown": 0}
    replicas = {"desired": 0, "ready": 0, "starting": 0, "failed": 0}
    for m in models:
        counts["models"] += 1
        if m.get("satisfied") is None:
            counts["unknown"] += 1
            continue
        counts["satisfied" if m["satisfied"] else "short"] += 1
        state = m.get("state")
        if m.get("parked") or state == "parked":
            counts["parked"] += 1
        elif state in ("unplaceable", "starting", "stopped"):
            counts[str(state)] += 1
        for k in replicas:
            v = m.get(k)
            replicas[k] += v if isinstance(v, int) else 0
    return {**counts, "replicas": replicas}


def satisfied(view: Any, parked: bool) -> bool | None:
    """A model counted against what it should have now: asked for and unplaceable (or parked)
    is not satisfied, whatever its ready count. None: the reconciler has not judged it."""
    if view is None:
        return None
    if parked or view.state in ("parked", "unplaceable"):
        return False
    return bool(view.ready >= view.desired)


def fleet_warnings(fabric_docs: Iterable[Mapping[str, Any]], capacity_rows: Iterable[Mapping[str, Any]],
                   lost: list[str]) -> list[str]:
    """What the aggregates say an operator should know, one line each however many nodes."""
    out = []
    if lost:
        shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        out.append(f"{len(lost)} node(s) not connected: {shown} (`llmgw ctl nodes` says since when; "
                   f"`llmgw ctl nodes forget NAME` drops a lost one)")
    for c in capacity_rows:
        if c["unusable"]:
            out.append(f"{c['unusable']} {c['class']} device(s) unusable: counted neither used nor free "
                       f"(`llmgw ctl nodes` says why)")
    for f in fabric_docs:
        if f["errors"]:
            where = f["fabric"] or "no fabric"
            out.append(f"{len(f['errors'])} storage director{'y' if len(f['errors']) == 1 else 'ies'} on "
                       f"{where} could not be read: {f['errors'][0]}" + (" ..." if len(f["errors"]) > 1 else ""))
    return out
