"""`FleetView`: the fleet as placement sees it, indexed once per plan and kept up to date as
placements are added or removed, so one more placement costs about the same at 10 or 1,000 nodes.

Nodes with the same hardware, engines, fabrics and memory form one *shape*; what a profile needs
is judged once per shape (`_judge`), and each shape keeps its nodes in buckets by how many usable
GPUs they have free. The best node of a shape is then the first name in the fullest bucket that
still fits; only nodes whose score differs from their shape's (running the model already, or
holding its weights locally) are looked at one by one. Pure; nothing here reads a clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmgw.domain.memory import MemoryEstimate, WeightsIndex, estimate_for
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement.filters import (
    FITS,
    NEVER,
    NOT_NOW,
    Choice,
    Need,
    PlacementResult,
    Refusal,
    approval_refusal,
    cordon_refusal,
    devices,
    engine_refusal,
    gib,
    Verdict,
    mig_refusal,
)
from llmgw.placement.holdings import Held, Holdings, node_fabrics
from llmgw.placement.scores import Score, combine, cpu_pack, gpu_pack


@dataclass(frozen=True)
class _Fit:
    """A shape can take the profile: its candidate devices (sorted), and whether they are all its
    usable devices (then a node's free count alone says whether it fits)."""

    candidates: tuple[int, ...]
    all_usable: bool


class _Shape:
    def __init__(self, info: NodeInfo, pending: bool = False, cordoned: bool = False) -> None:
        self.rep = info  # any node of the shape judges for all of them (names are swapped in)
        self.pending = pending  # its nodes wait for approval: each refuses every replica
        self.cordoned = cordoned  # its nodes are cordoned or draining: each refuses every new replica
        self.usable = frozenset(g.index for g in info.gpus if info.placeable(g))  # reserved ones are not
        self.capacity = len(self.usable)
        self.fabric = info.fabric
        self.fabrics = node_fabrics(info)
        self.buckets: list[list[str]] = [[] for _ in range(self.capacity + 1)]  # free count -> names
        self.static: dict[Need, Refusal | _Fit] = {}


class _Node:
    __slots__ = ("info", "shape", "used", "used_usable", "cpu_used", "cpu_unknown", "groups")

    def __init__(self, info: NodeInfo, shape: _Shape) -> None:
        self.info = info
        self.shape = shape
        self.used: dict[int, int] = {}  # device index -> placements on it (one, unless the state is wrong)
        self.used_usable = 0
        self.cpu_used = 0  # bytes the known-size CPU replicas here take
        self.cpu_unknown = 0  # CPU replicas here whose size is unknown (not counted, but said)
        self.groups: dict[str, int] = {}  # multi-node replicas with a member here

    @property
    def free(self) -> int:
        return self.shape.capacity - self.used_usable


def _shape_key(info: NodeInfo) -> tuple[object, ...]:
    gpus = tuple((g.index, g.gpu_class, g.memory_total, g.healthy, g.placeable, g.reason, g.parent_index)
                 for g in info.gpus)
    ready = info.warnings if (not info.gpus and info.probe == "none") else ()
    reserve = (info.reserved_gpus, info.reserved_memory, info.reserved_vram)
    forms = info.engine_versions.get("llama.cpp")  # which of llama.cpp's forms it has (`engine_refusal`)
    llama_server = None if forms is None else "llama-server" in forms
    return (gpus, tuple(sorted(info.engines)), info.fabric, info.memory_total, ready, node_fabrics(info), reserve,
            llama_server)


class FleetView:
    """Build once per plan: `FleetView(nodes, placements, models)`; then `place(model)` for a
    choice, `add(placement)` / `remove(replica_id)` as the plan (or the state) changes,
    `verdicts(model)` for every node's verdict. `models` sizes the replicas already placed
    (CPU memory); a placed replica of a model not given there counts as unknown size. `pending`:
    nodes waiting for an operator's approval: listed, each refusing every replica (`awaiting_approval`);
    `cordoned`: nodes under maintenance, likewise (`cordoned`)."""

    def __init__(self, nodes: Mapping[str, NodeInfo], placements: Iterable[Placement] = (),
                 models: Mapping[str, ModelDef] | None = None,
                 sources: Mapping[str, Mapping[str, Any]] | None = None, pending: Iterable[str] = (),
                 cordoned: Iterable[str] = ()) -> None:
        self.infos = nodes
        self.sources = sources  # `Observed.sources`: facts of sources no node reports, for estimates
        self.models = dict(models or {})
        self.holdings = Holdings(nodes)
        self._estimates: dict[ModelDef, MemoryEstimate] = {}
        self._index: WeightsIndex | None = None  # built on the first estimate
        self._needs: dict[ModelDef, Need] = {}
        self._by_id: dict[int, tuple[ModelDef, Need]] = {}
        self._fits: dict[Need, list[tuple[_Shape, _Fit]]] = {}
        self._failed: dict[Need, tuple[int, PlacementResult]] = {}
        self.version = 0  # counts changes: a need that fitted nowhere at this version still does not
        self._held: dict[str, Held] = {}
        shapes: dict[tuple[object, ...], _Shape] = {}
        self.nodes: dict[str, _Node] = {}
        waiting, fenced = frozenset(pending), frozenset(cordoned)
        for name in sorted(nodes):
            info = nodes[name]
            key = (*_shape_key(info), name in waiting, name in fenced)
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = _Shape(info, name in waiting, name in fenced)
            self.nodes[name] = _Node(info, shape)
        self.shapes = [shapes[k] for k in shapes]
        self.placements: dict[str, Placement] = {}
        self.hosting: dict[str, dict[str, int]] = {}  # model -> node -> replicas (members) there
        for p in placements:
            self._apply(p, +1)
        for n in self.nodes.values():
            bisect.insort(n.shape.buckets[n.free], n.info.node)

    # --- what a model needs ---------------------------------------------------------------

    def estimate(self, model: ModelDef) -> MemoryEstimate:
        found = self._estimates.get(model)
        if found is None:
            if self._index is None:
                self._index = WeightsIndex.of(self.infos)
            found = self._estimates[model] = estimate_for(model, self.infos, self._index, self.sources)
        return found

    def need(self, model: ModelDef) -> Need:
        # By identity first: hashing a whole definition on every placement is most of its cost.
        known = self._by_id.get(id(model))
        if known is not None and known[0] is model:
            return known[1]
        found = self._needs.get(model)
        if found is None:
            found = self._needs[model] = Need.of(model, self.estimate(model))
        self._by_id[id(model)] = (model, found)
        return found

    def _fitting(self, need: Need) -> list[tuple[_Shape, _Fit]]:
        """The shapes whose hardware, engines and memory can take `need`, with their devices."""
        found = self._fits.get(need)
        if found is None:
            found = self._fits[need] = []
            for shape in self.shapes:
                fit = shape.static.get(need)
                if fit is None:
                    fit = shape.static[need] = _judge(need, shape)
                if isinstance(fit, _Fit):
                    found.append((shape, fit))
        return found

    def held(self, model: ModelDef) -> Held:
        found = self._held.get(model.source)
        if found is None:
            found = self._held[model.source] = self.holdings.of(model.source)
        return found

    def holds(self, model: ModelDef, node: str) -> bool:
        held = self.held(model)
        return node in held.nodes or bool(held.fabrics & self.nodes[node].shape.fabrics)

    # --- keeping up to date -------------------------------------------------------------

    def add(self, placement: Placement) -> None:
        """A placement the plan made (or the state gained): its devices are taken from now on."""
        if placement.replica_id in self.placements:
            self.remove(placement.replica_id)
        self._move(placement, +1)

    def remove(self, replica_id: str) -> None:
        placement = self.placements.get(replica_id)
        if placement is not None:
            self._move(placement, -1)

    def take(self, model: ModelDef, choice: Choice, replica_id: str, at: float = 0.0) -> list[Placement]:
        """Add the placement(s) a choice stands for (one, or a group's members as `<id>-r<rank>`)."""
        launch = model.launch_hash()
        if not choice.members:
            out = [Placement(replica_id, model.name, choice.node, choice.gpus, launch, at)]
        else:
            size = len(choice.members)
            out = [Placement(f"{replica_id}-r{rank}", model.name, m.node, m.gpus, launch, at, group=replica_id,
                             rank=rank, group_size=size) for rank, m in enumerate(choice.members)]
        for p in out:
            self.add(p)
        return out

    def _move(self, p: Placement, sign: int) -> None:
        self.version += 1
        node = self.nodes.get(p.node)
        if node is not None:
            shape = node.shape
            before = node.free
            self._apply(p, sign)
            if node.free != before:
                bucket = shape.buckets[before]
                del bucket[bisect.bisect_left(bucket, p.node)]
                bisect.insort(shape.buckets[node.free], p.node)
        else:
            self._apply(p, sign)

    def _apply(self, p: Placement, sign: int) -> None:
        if sign > 0:
            self.placements[p.replica_id] = p
        else:
            del self.placements[p.replica_id]
        per_model = self.hosting.setdefault(p.model, {})
        per_model[p.node] = per_model.get(p.node, 0) + sign
        if not per_model[p.node]:
            del per_model[p.node]
        node = self.nodes.get(p.node)
        if node is None:
            return
        for index in p.gpus:
            count = node.used.get(index, 0) + sign
            if (count > 0) != (index in node.used) and index in node.shape.usable:
                node.used_usable += sign
            if count > 0:
                node.used[index] = count
            else:
                node.used.pop(index, None)
        if p.group:
            count = node.groups.get(p.group, 0) + sign
            if count > 0:
                node.groups[p.group] = count
            else:
                node.groups.pop(p.group, None)
        if not p.gpus:
            model = self.models.get(p.model)
            size = self.estimate(model).total_bytes if model is not None else None
            if size is None:
                node.cpu_unknown += sign
            else:
                node.cpu_used += sign * size

    # --- judging -----------------------------------------------------------------------

    def static(self, need: Need, name: str) -> Refusal | _Fit:
        """What the node's hardware, engines and memory say, whatever is placed: a refusal
        (named for this node) or the devices it could use."""
        node = self.nodes[name]
        shape = node.shape
        found = shape.static.get(need)
        if found is None:
            found = shape.static[need] = _judge(need, shape)
        if isinstance(found, Refusal) and found.node != name:
            return replace(found, node=name)
        return found

    def verdict(self, model: ModelDef, name: str) -> Verdict:
        """One node's verdict on one more single-node replica of `model`, with its score."""
        need = self.need(model)
        fit = self.static(need, name)
        if isinstance(fit, Refusal):
            return _as_verdict(fit)
        found = self._dynamic(model, need, self.nodes[name], fit)
        return found if isinstance(found, Verdict) else _as_verdict(found)

    def _dynamic(self, model: ModelDef, need: Need, node: _Node, fit: _Fit) -> Verdict | Refusal:
        """What is placed on a node whose hardware fits: FITS with a score, or NOT_NOW."""
        name = node.info.node
        if need.cpu:
            busy = _cpu_busy(need, node)
            if busy is not None:
                return busy
            pack = cpu_pack(node.shape.capacity > 0)
            free: list[int] = []
        else:
            used = node.used
            free = [i for i in fit.candidates if i not in used] if used else list(fit.candidates)
            if len(free) < need.gpus:
                return Refusal(name, NOT_NOW, "gpus_busy", f"needs {need.gpus} free GPUs, {len(free)} free",
                               {"need": need.gpus, "free": len(free)})
            pack = gpu_pack(node.used_usable, need.gpus, node.shape.capacity)
        spread = 0.0 if self.hosting.get(model.name, {}).get(name) else 100.0
        weights = 100.0 if self.holds(model, name) else 0.0
        return Verdict(name, FITS, score=Score(spread, weights, pack), gpus=tuple(free[: need.gpus]))

    def verdicts(self, model: ModelDef) -> list[Verdict]:
        """Every node's verdict, by node name (a what-if: nothing is added)."""
        need = self.need(model)
        if need.mig_single:
            return [_as_verdict(r) for name in sorted(self.nodes) if (r := mig_refusal(need, name))]
        if need.nodes > 1:
            from llmgw.placement.groups import group_verdicts  # groups builds on this module

            return group_verdicts(model, self)
        return [v if isinstance(v, Verdict) else _as_verdict(v) for v in self._judged(model, need)]

    def _judged(self, model: ModelDef, need: Need) -> list[Verdict | Refusal]:
        """Each node, by name: a refusal, or FITS with its score. A refused shape's refusal is
        copied with each node's name; only the nodes of fitting shapes are judged one by one."""
        fits = {id(shape): fit for shape, fit in self._fitting(need)}
        out: list[Verdict | Refusal] = []
        for name, node in self.nodes.items():  # built in name order
            fit = fits.get(id(node.shape))
            if fit is None:
                r = node.shape.static[need]
                assert isinstance(r, Refusal)
                out.append(Refusal(name, r.verdict, r.code, r.message, r.numbers))
            else:
                out.append(self._dynamic(model, need, node, fit))
        return out

    def place(self, model: ModelDef, *, explain: bool = False) -> PlacementResult:
        """One more replica of `model`: the best node (or set of nodes), or why none. Refusals
        come with a choice only when `explain`; with no choice they always do."""
        need = self.need(model)
        if need.mig_single:
            return PlacementResult(None, tuple(r for name in sorted(self.nodes) if (r := mig_refusal(need, name))))
        if need.nodes > 1:
            from llmgw.placement.groups import place_group

            return place_group(model, self)
        failed = self._failed.get(need)
        if failed is not None and failed[0] == self.version:
            return failed[1]  # nothing changed since this very need fitted nowhere
        best = None if need.cpu else self._best_gpu(model, need)
        if need.cpu or best is None or explain:
            result = self._explained(model, need)
            if result.choice is None:
                self._failed[need] = (self.version, result)
            return result
        return PlacementResult(best, ())

    def _best_gpu(self, model: ModelDef, need: Need) -> Choice | None:
        """The best node by the shape index: in each shape that fits, the first name in the fullest
        bucket that still has room; nodes scored unlike their shape are judged one by one."""
        held = self.held(model)
        hosting = self.hosting.get(model.name) or {}
        special = held.nodes | hosting.keys() if held.nodes or hosting else frozenset()
        taking = need.gpus
        best_rank: tuple[float, float, float] | None = None
        best_name = ""
        best_node: _Node | None = None
        best_fit: _Fit | None = None
        slow: list[str] = sorted(n for n in special if n in self.nodes)
        for shape, fit in self._fitting(need):
            if not fit.all_usable:  # a class or memory filter leaves some devices out: one by one
                slow.extend(n for bucket in shape.buckets for n in bucket if n not in special)
                continue
            weights = 100.0 if held.fabrics and held.fabrics & shape.fabrics else 0.0
            buckets = shape.buckets
            for free in range(taking, shape.capacity + 1):
                bucket = buckets[free]
                if not bucket:
                    continue
                name = bucket[0]
                if name in special:
                    name = next((n for n in bucket if n not in special), "")
                    if not name:
                        continue
                cap = shape.capacity
                rank = (combine(100.0, weights, 100.0 * (cap - free + taking) / cap), 100.0, weights)
                if best_rank is None or rank > best_rank or (rank == best_rank and name < best_name):
                    best_rank, best_name, best_node, best_fit = rank, name, self.nodes[name], fit
                break
        for name in slow:
            v = self.verdict(model, name)
            if v.score is not None:
                rank = v.score.rank()
                if best_rank is None or rank > best_rank or (rank == best_rank and name < best_name):
                    best_rank, best_name, best_node, best_fit = rank, name, None, _Fit(v.gpus, False)
        if best_rank is None or best_fit is None:
            return None
        if best_node is None:
            return Choice(best_name, best_fit.candidates, best_rank[0])
        used = best_node.used
        gpus = tuple(i for i in best_fit.candidates if i not in used)[:taking]
        return Choice(best_name, gpus, best_rank[0])

    def _explained(self, model: ModelDef, need: Need) -> PlacementResult:
        """Every node judged: the choice and each refusal (and, when nothing can ever fit for want
        of memory, by how much)."""
        refusals: list[Refusal] = []
        best: Verdict | None = None
        best_rank: tuple[float, float, float] | None = None
        for v in self._judged(model, need):
            if isinstance(v, Refusal):
                refusals.append(v)
            elif v.score is not None and (best_rank is None or v.score.rank() > best_rank):
                best, best_rank = v, v.score.rank()  # names come sorted: the first of equals stays
        if best is not None and best.score is not None:
            return PlacementResult(Choice(best.node, best.gpus, best.score.total), tuple(refusals))
        return PlacementResult(None, tuple(refusals), short_by=short_by(need, refusals))


def _judge(need: Need, shape: _Shape) -> Refusal | _Fit:
    info = shape.rep
    if shape.pending:
        return approval_refusal(info.node)
    if shape.cordoned:
        return cordon_refusal(info.node)
    if need.cpu:
        total = need.total
        if total is not None and 0 < info.memory_total < total:
            return Refusal(info.node, NEVER, "cpu_memory",
                           f"needs {gib(total)} GiB of memory, node has {info.memory_total / (1 << 30):.1f} GiB",
                           {"need_bytes": total, "memory_bytes": info.memory_total})
        if total is not None and info.reserved_memory and 0 < info.placeable_memory < total:
            return Refusal(info.node, NEVER, "reserved",
                           f"needs {gib(total)} GiB of memory: the node has {gib(info.memory_total)} GiB, of which "
                           f"{gib(info.reserved_memory)} GiB are reserved for other work",
                           {"need_bytes": total, "memory_bytes": info.memory_total,
                            "reserved_bytes": info.reserved_memory})
        return engine_refusal(need, info) or _Fit((), True)
    usable = devices(need, info)
    if isinstance(usable, Refusal):
        return usable
    missing = engine_refusal(need, info)
    if missing is not None:
        return missing
    candidates = tuple(sorted(g.index for g in usable))
    return _Fit(candidates, frozenset(candidates) == shape.usable)


def _cpu_busy(need: Need, node: _Node) -> Refusal | None:
    total, memory = need.total, node.info.placeable_memory  # less the node's reserve
    if total is None or memory <= 0 or node.cpu_used + total <= memory:
        return None
    unknown = f", and {node.cpu_unknown} of unknown size" if node.cpu_unknown else ""
    if node.info.reserved_memory:
        unknown += f"; {gib(node.info.reserved_memory)} GiB more are reserved for other work"
    return Refusal(node.info.node, NOT_NOW, "cpu_memory_busy",
                   f"needs {gib(total)} GiB of memory, {gib(max(memory - node.cpu_used, 0))} GiB free of "
                   f"{gib(memory)} (CPU replicas here take {gib(node.cpu_used)} GiB{unknown})",
                   {"need_bytes": total, "used_bytes": node.cpu_used, "memory_bytes": memory,
                    "unknown_replicas": node.cpu_unknown})


def _as_verdict(r: Refusal) -> Verdict:
    return Verdict(r.node, r.verdict, r.code, r.message, r.numbers)


def short_by(need: Need, refusals: list[Refusal]) -> str:
    """When every node is NEVER and some for want of memory: what the largest offers, and by how
    much it falls short ("needs 90 GiB per GPU; the largest GPU has 79.6 GiB (short by 10.4 GiB)")."""
    if not refusals or any(r.verdict != NEVER for r in refusals):
        return ""
    gpu = [r.numbers["largest_bytes"] for r in refusals if r.code == "memory" and "largest_bytes" in r.numbers]
    if gpu and need.per_device is not None:
        largest = max(gpu)
        return (f"needs {gib(need.per_device)} GiB per GPU; the largest GPU has {gib(largest)} GiB "
                f"(short by {gib(need.per_device - largest)} GiB)")
    cpu = [r.numbers["memory_bytes"] for r in refusals if r.code == "cpu_memory" and "memory_bytes" in r.numbers]
    if cpu and need.total is not None:
        largest = max(cpu)
        return (f"needs {gib(need.total)} GiB of memory; the largest node has {gib(largest)} GiB "
                f"(short by {gib(need.total - largest)} GiB)")
    return ""
