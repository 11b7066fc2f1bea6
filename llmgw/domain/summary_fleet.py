"""The fleet-scale parts of the cluster summary: capacity per GPU class, free whole nodes and
stored weights per fabric, model and replica counts, and what has gone unasked-for.

Pure aggregates over the state and what agents report, so `ctl status` reads the same at 4 nodes
as at 400. Unknown stays unknown: None (or a negative idle time), never 0. Each part is a frozen
row with the `to_doc()` the status document carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmgw.domain.frozen import Doc
from llmgw.domain.model import is_mig_class
from llmgw.domain.observed import Gpu, NodeInfo, Observed
from llmgw.domain.state import ClusterState, Placement

if TYPE_CHECKING:
    from llmgw.domain.summary import ModelRow

NO_FABRIC = ""  # nodes with no fabric configured: never hosts of a multi-node replica
UNKNOWN_IDLE = -1.0  # JSON's word for "not observed since this leader started": never idle


@dataclass(frozen=True)
class CapacityRow:
    """One GPU class (a MIG instance profile is a class of its own) over the connected nodes."""

    gpu_class: str
    mig: bool
    used: int  # held by a placement
    free: int
    unusable: int  # unhealthy, or not placeable: counted neither used nor free
    nodes: int  # connected nodes with a device of this class
    reserved: int = 0  # usable, but kept for other work (`llmgw agent --reserve`): neither used nor free

    @property
    def total(self) -> int:
        return self.used + self.free + self.unusable + self.reserved

    def to_doc(self) -> dict[str, Any]:
        return {"class": self.gpu_class, "mig": self.mig, "used": self.used, "free": self.free,
                "unusable": self.unusable, "reserved": self.reserved, "nodes": self.nodes, "total": self.total}


@dataclass(frozen=True)
class SharedDir(Doc):
    """A shared storage directory of a fabric, counted once however many nodes mount it."""

    path: str
    nodes: int  # nodes reporting it
    models: tuple[str, ...]  # the weights it holds, by name


@dataclass(frozen=True)
class StoredModel(Doc):
    """A model's weights on one fabric: in a shared directory, and/or local copies on some nodes."""

    name: str
    shared: bool
    local_nodes: int


@dataclass(frozen=True)
class Fabric(Doc):
    """One fabric ("" = none configured): its connected nodes, how many are whole and free, its GPUs,
    and the weights its storage holds."""

    fabric: str
    nodes: int
    whole_free_nodes: int  # what a multi-node replica needs: free cards on another fabric do not count
    gpus_used: int
    gpus_free: int
    shared: tuple[SharedDir, ...]
    local_dirs: int
    local_nodes: int
    models: tuple[StoredModel, ...]
    not_weights: int  # files in its directories that are not weights (or left unlisted)
    errors: tuple[str, ...]  # "node:path: why" for each directory that could not be read


@dataclass(frozen=True)
class Weight(Doc):
    """A stored model by name: the fabrics holding it, those that share it, and its local copies."""

    name: str
    fabrics: tuple[str, ...]
    shared_on: tuple[str, ...]
    local_nodes: int


@dataclass(frozen=True)
class IdleRow(Doc):
    """A model holding replicas, and how long nobody asked for it (`idle_s` negative: unknown)."""

    model: str
    mode: str
    replicas: int  # serving ones
    gpus: int
    idle_s: float
    idle_timeout_s: float | None  # on-demand models only

    @property
    def idle_known(self) -> bool:
        return self.idle_s >= 0


@dataclass(frozen=True)
class ReplicaCounts(Doc):
    """Replicas summed over the models the reconciler has judged."""

    desired: int = 0
    ready: int = 0
    starting: int = 0
    failed: int = 0


@dataclass(frozen=True)
class Totals(Doc):
    """Models by how they stand; `unknown` counts those not judged yet (left out of the replica sums)."""

    models: int = 0
    satisfied: int = 0
    short: int = 0
    starting: int = 0
    parked: int = 0
    unplaceable: int = 0
    stopped: int = 0
    unknown: int = 0
    replicas: ReplicaCounts = field(default_factory=ReplicaCounts)

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
    usable = [g for g in info.gpus if info.placeable(g)]
    return (not grouped and any(not is_mig_class(g.gpu_class) for g in usable)
            and not any(g.index in used for g in usable))


def capacity(observed: Observed, used: Mapping[str, set[int]]) -> tuple[CapacityRow, ...]:
    """Per GPU class (MIG instance profiles are classes of their own): devices used by a
    placement, free, unusable (unhealthy, or placeable no longer), and reserved (usable, but kept for
    other work: `llmgw agent --reserve`; one a placement still holds counts as used). Connected nodes only: a
    lost node's devices are unknown. A card split into MIG instances counts as its instances."""
    counts: dict[str, dict[str, int]] = {}
    nodes: dict[str, set[str]] = {}
    for name in sorted(observed.nodes):
        info = observed.nodes[name]
        carved = _carved_cards(info.gpus)
        taken = used.get(name, set())
        for g in info.gpus:
            if g.index in carved:
                continue
            row = counts.setdefault(g.gpu_class, {"used": 0, "free": 0, "unusable": 0, "reserved": 0})
            nodes.setdefault(g.gpu_class, set()).add(name)
            row["unusable" if not g.usable else "used" if g.index in taken else
                "reserved" if info.reserved(g) else "free"] += 1
    return tuple(CapacityRow(c, is_mig_class(c), counts[c]["used"], counts[c]["free"], counts[c]["unusable"],
                             len(nodes[c]), counts[c]["reserved"]) for c in sorted(counts))


def fabrics(observed: Observed, used: Mapping[str, set[int]], grouped: set[str]) -> tuple[Fabric, ...]:
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
            if g.usable and (g.index in taken or not info.reserved(g)):  # a reserved device is neither
                r["gpus_used" if g.index in taken else "gpus_free"] += 1
        for report in info.storage:
            _add_storage(row(str(report.get("fabric") or info.fabric)), name, report)
    return tuple(_fabric(out[f]) for f in sorted(out))


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


def _fabric(r: Mapping[str, Any]) -> Fabric:
    """The frozen row of what `fabrics` counted for one fabric."""
    shared = tuple(SharedDir(s["path"], len(s["nodes"]), tuple(sorted(s["models"])))
                   for _, s in sorted(r["shared"].items()))
    models = tuple(StoredModel(m["name"], m["shared"], len(m["nodes"])) for _, m in sorted(r["models"].items()))
    return Fabric(fabric=r["fabric"], nodes=r["nodes"], whole_free_nodes=r["whole_free_nodes"],
                  gpus_used=r["gpus_used"], gpus_free=r["gpus_free"], shared=shared, local_dirs=r["local_dirs"],
                  local_nodes=len(r["local_nodes"]), models=models, not_weights=r["not_weights"],
                  errors=tuple(r["errors"]))


def weights(fabric_rows: Iterable[Fabric]) -> tuple[Weight, ...]:
    """Each stored model by name: the fabrics that hold it (a shared directory, or local copies)
    and how many nodes hold a local copy. A model on one fabric only cannot be served elsewhere
    without a copy over the management network."""
    found: dict[str, tuple[list[str], list[str], list[int]]] = {}
    for f in fabric_rows:
        for m in f.models:
            on, shared_on, local = found.setdefault(m.name, ([], [], []))
            on.append(f.fabric)
            if m.shared:
                shared_on.append(f.fabric)
            local.append(m.local_nodes)
    return tuple(Weight(n, tuple(found[n][0]), tuple(found[n][1]), sum(found[n][2])) for n in sorted(found))


def idle(state: ClusterState, observed: Observed, now: float | None,
         by_model: Mapping[str, list[Placement]]) -> tuple[IdleRow, ...]:
    """Models holding replicas, longest unasked-for first; one never asked for since this
    leader began observing is unknown (`idle_s` negative), listed after the known ones: unknown
    is not idle."""
    rows: list[IdleRow] = []
    for name, mine in by_model.items():
        model = state.models.get(name)
        serving = [p for p in mine if p.serves]
        if model is None or not serving:
            continue
        asked = observed.demand.get(name)
        idle_s = UNKNOWN_IDLE if asked is None or now is None else round(max(now - asked, 0.0), 3)
        rows.append(IdleRow(name, model.mode, len(serving), sum(len(p.gpus) for p in mine), idle_s,
                            model.idle_timeout_s if model.mode == "on-demand" else None))
    rows.sort(key=lambda r: (r.idle_s < 0, -r.idle_s, r.model))
    return tuple(rows)


def totals(models: Iterable[ModelRow]) -> Totals:
    """Models by how they stand, and replicas summed: `unknown` counts models the reconciler
    has not judged yet (their replicas are left out of the sums, not counted as 0)."""
    counts = {"models": 0, "satisfied": 0, "short": 0, "starting": 0, "parked": 0, "unplaceable": 0,
              "stopped": 0, "unknown": 0}
    replicas = {"desired": 0, "ready": 0, "starting": 0, "failed": 0}
    for m in models:
        counts["models"] += 1
        if m.satisfied is None:
            counts["unknown"] += 1
            continue
        counts["satisfied" if m.satisfied else "short"] += 1
        if m.parked or m.state == "parked":
            counts["parked"] += 1
        elif m.state in ("unplaceable", "starting", "stopped"):
            counts[m.state] += 1
        for k, v in (("desired", m.desired), ("ready", m.ready), ("starting", m.starting), ("failed", m.failed)):
            replicas[k] += v if isinstance(v, int) else 0
    return Totals(**counts, replicas=ReplicaCounts(**replicas))


def satisfied(view: Any, parked: bool) -> bool | None:
    """A model counted against what it should have now: asked for and unplaceable (or parked)
    is not satisfied, whatever its ready count. None: the reconciler has not judged it."""
    if view is None:
        return None
    if parked or view.state in ("parked", "unplaceable"):
        return False
    return bool(view.ready >= view.desired)


def fleet_warnings(fabric_rows: Iterable[Fabric], capacity_rows: Iterable[CapacityRow],
                   lost: list[str]) -> list[str]:
    """What the aggregates say an operator should know, one line each however many nodes."""
    out = []
    if lost:
        shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        out.append(f"{len(lost)} node(s) not connected: {shown} (`llmgw ctl nodes` says since when; "
                   f"`llmgw ctl nodes forget NAME` drops a lost one)")
    for c in capacity_rows:
        if c.unusable:
            out.append(f"{c.unusable} {c.gpu_class} device(s) unusable: counted neither used nor free "
                       f"(`llmgw ctl nodes` says why)")
    for f in fabric_rows:
        if f.errors:
            where = f.fabric or "no fabric"
            out.append(f"{len(f.errors)} storage director{'y' if len(f.errors) == 1 else 'ies'} on "
                       f"{where} could not be read: {f.errors[0]}" + (" ..." if len(f.errors) > 1 else ""))
    return out
