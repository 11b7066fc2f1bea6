"""`FleetView`: the fleet as placement sees it, indexed once per plan and kept up to date as
placements are added or removed, so one more placement costs about the same at 10 or 1,000 nodes,
whether the nodes are all alike or each of its own shape.

Nodes with the same hardware, engines, fabrics and memory form one *shape*; whether a profile fits
is judged once per shape, one kind of device at a time (`_quick`: the usable, unreserved devices
of one class and size count once), and the words of a refusal only when asked (`_judge`). A *pool*
(`_Pool`) ranks the nodes whose hardware fits a GPU profile (`Need`): those with room now sorted best
first (fullest once the replica is there, then by name), one list per set of storage fabrics (holding
the weights outranks packing). Profiles that differ only in their memory figures (and the share of each
GPU their engine takes) share one: their *family's* (the profile without them, which fits every node they
fit), each passing over the nodes of it that it does not fit; a profile fitting under half of its
family's nodes, or passing over too many, keeps its own (`_Ranking`). A placement only re-sorts the node
it changed, and only in the pools asked afterwards (`_log`; each node also keeps where in it it last
changed, so a long-lived view trims the log without forgetting). The best node is then the head of a few
lists; nodes whose score differs from the rest (running the model already, or holding its weights
locally) are looked at one by one. When nothing fits, every node's refusal is given; a GPU profile
explained again judges only the nodes whose devices changed since. `verdict` (one node judged in full:
`_judge`, then its score) is the plain reference the fast path must agree with
(tests/unit/test_placement_mixed.py).
Pure; nothing here reads a clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmgw.domain.memory import MemoryEstimate, WeightsIndex, estimate_for
from llmgw.domain.model import ModelDef, is_mig_class
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


_SLOT = Refusal("", NEVER, "", "")  # a place `_judged` fills
# The refusals of a GPU profile that depend only on the node, the classes the profile names and whether it takes
# more than one device: approval and cordon come first, then `filters.devices` decides these before memory and
# count. Every profile alike in both is told the same there (`FleetView._judged`).
_BEFORE_MEMORY = frozenset({"awaiting_approval", "cordoned", "no_gpu", "node_not_ready", "mig_single", "class"})
# ... and with the memory per device and the share of it taken (and the engine the words name), memory's too.
_BEFORE_COUNT = _BEFORE_MEMORY | {"memory"}
# A profile ranked by its family's pool passes over the nodes it does not fit there; past this many in one
# look (its nodes are the emptier ones, say) it keeps a pool of its own from then on (`FleetView._best_gpu`).
PASSED_OVER = 16


class _Shape:
    def __init__(self, info: NodeInfo, pending: bool = False, cordoned: bool = False) -> None:
        self.rep = info  # any node of the shape judges for all of them (names are swapped in)
        self.pending = pending  # its nodes wait for approval: each refuses every replica
        self.cordoned = cordoned  # its nodes are cordoned or draining: each refuses every new replica
        placeable = [g for g in info.gpus if info.placeable(g)]
        self.usable = frozenset(g.index for g in placeable)  # reserved ones are not
        self.capacity = len(self.usable)
        self.fabric = info.fabric
        self.fabrics = node_fabrics(info)
        self.names: list[str] = []  # its nodes, by name
        self.static: dict[Need, Refusal | _Fit] = {}
        # (classes, more than one device) -> the refusal when no device of theirs is here, None when one is: what
        # every GPU profile naming those classes is told first (`_static`), judged once, not once per profile. Shared
        # by the shapes of one `class_layout` (a view sets it): the words name no node.
        self.by_class: dict[tuple[tuple[str, ...], bool], Refusal | None] = {}
        # The devices placement may use (usable, not reserved) by kind: (class, MIG instance, memory, indexes).
        kinds: dict[tuple[str, int], list[int]] = {}
        for g in placeable:
            kinds.setdefault((g.gpu_class, g.memory_total), []).append(g.index)
        self.kinds = tuple((c, is_mig_class(c), memory, tuple(sorted(indexes)))
                           for (c, memory), indexes in kinds.items())
        # What `_quick` finds when one kind of device fits, or all of them: made once.
        self.kind_fits = tuple(_Fit(indexes, len(indexes) == self.capacity) for _, _, _, indexes in self.kinds)
        self.whole = _Fit(tuple(sorted(self.usable)), True)
        self.engines = frozenset(info.engines)
        self.reserve = bool(info.reserved_gpus or info.reserved_vram)
        self.reserved_vram = info.reserved_vram
        # No reserve and no MIG instance: for a profile naming no class, every device is alike but for its
        # memory, so the smallest one's says whether all of them fit (`_quick`).
        self.plain = not self.reserve and not any(mig for _, mig, _, _ in self.kinds)
        self.classes = frozenset(c for c, _, _, _ in self.kinds)  # of the devices placement may use
        self.least_memory = min((memory for _, _, memory, _ in self.kinds), default=0)

    def class_layout(self) -> tuple[object, ...]:
        """What says whether a GPU profile naming classes is refused here for its class (`filters.devices`, after
        approval and cordon): the classes of the node's devices (a MIG instance's says it is one)."""
        return self.pending, self.cordoned, frozenset(g.gpu_class for g in self.rep.gpus)


class _Pool:
    """Nodes best first for replicas of `taking` devices: per set of storage fabrics, the ones with
    room now as (-pack once the replica is there, name), sorted. `fits`: the nodes it ranks, with the
    devices each may use; `seen`: how much of the view's log of changed nodes it has taken in."""

    __slots__ = ("taking", "fits", "lists", "keys", "seen")

    def __init__(self, seen: int, taking: int, fits: dict[str, _Fit]) -> None:
        self.taking = taking
        self.fits = fits  # node -> the devices it may use
        self.lists: dict[frozenset[str], list[tuple[float, str]]] = {}
        self.keys: dict[str, tuple[float, str] | None] = {}  # node -> its entry (None: no room now)
        self.seen = seen


class _Ranking:
    """How one GPU profile finds its best node: the nodes its hardware fits, with the devices each may use,
    and the pool it ranks them by: its own (`own`), or its family's, whose nodes it walks past where it does
    not fit them (`FleetView._best_gpu`)."""

    __slots__ = ("fits", "pool", "own")

    def __init__(self, fits: dict[str, _Fit], pool: _Pool, own: bool) -> None:
        self.fits = fits
        self.pool = pool
        self.own = own


class _Node:
    __slots__ = ("info", "shape", "used", "used_usable", "cpu_used", "cpu_unknown", "groups", "changed")

    def __init__(self, info: NodeInfo, shape: _Shape) -> None:
        self.info = info
        self.shape = shape
        self.used: dict[int, int] = {}  # device index -> placements on it (one, unless the state is wrong)
        self.used_usable = 0
        self.cpu_used = 0  # bytes the known-size CPU replicas here take
        self.cpu_unknown = 0  # CPU replicas here whose size is unknown (not counted, but said)
        self.groups: dict[str, int] = {}  # multi-node replicas with a member here
        self.changed = -1  # where in the view's log its devices last changed (-1: never)

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
        self._estimates: dict[int, tuple[ModelDef, MemoryEstimate]] = {}  # id(model) -> (model, its estimate)
        self._index: WeightsIndex | None = None  # built on the first estimate
        self._interned: dict[tuple[Any, ...], Need] = {}  # a need's fields -> the one object for them
        self._by_id: dict[int, tuple[ModelDef, Need]] = {}
        self._fits: dict[Need, list[tuple[_Shape, _Fit]]] = {}
        self._rankings: dict[Need, _Ranking] = {}  # per GPU profile asked to place (`_ranking`)
        self._refused: dict[Need, tuple[list[Verdict | Refusal], list[tuple[int, _Node, _Fit]], dict[str, int]]] = {}
        # (classes, more than one device[, memory per device, share, engine]) -> the refusals said before memory
        # (or the count) is read, by node (`_SLOT` elsewhere), and the other nodes' places: what `_judged` starts
        # from for a GPU profile alike in those.
        self._alike: dict[tuple[Any, ...], tuple[list[Verdict | Refusal], list[int]]] = {}
        # A GPU profile's last judgement (`_judged`): (log position, the list, the slots that were FITS).
        self._judgement: dict[Need, tuple[int, list[Verdict | Refusal], list[int]]] = {}
        # The nodes whose devices were taken or freed, in order (read by the pools); positions count from
        # the view's start: `_base` is the position of `_log[0]` (the log is trimmed in a long-lived view).
        self._log: list[str] = []
        self._base = 0
        self._launch: dict[int, tuple[ModelDef, str]] = {}  # id(model) -> (model, its launch hash)
        self._failed: dict[Need, tuple[int, int, PlacementResult]] = {}  # need -> (version, log position, result)
        self.version = 0  # counts changes: a need that fitted nowhere at this version still does not
        self._held: dict[str, Held] = {}
        self._busy_refusals: dict[tuple[str, int, int], Refusal] = {}
        shapes: dict[tuple[object, ...], _Shape] = {}
        layouts: dict[tuple[object, ...], dict[tuple[tuple[str, ...], bool], Refusal | None]] = {}
        self.nodes: dict[str, _Node] = {}
        waiting, fenced = frozenset(pending), frozenset(cordoned)
        for name in sorted(nodes):
            info = nodes[name]
            key = (*_shape_key(info), name in waiting, name in fenced)
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = _Shape(info, name in waiting, name in fenced)
                shape.by_class = layouts.setdefault(shape.class_layout(), shape.by_class)
            self.nodes[name] = _Node(info, shape)
        self.shapes = [shapes[k] for k in shapes]
        self.placements: dict[str, Placement] = {}
        self.hosting: dict[str, dict[str, int]] = {}  # model -> node -> replicas (members) there
        for p in placements:
            self._apply(p, +1)
        for n in self.nodes.values():
            n.shape.names.append(n.info.node)  # in name order
        self._items = list(self.nodes.items())  # in name order

    # --- what a model needs ---------------------------------------------------------------

    def estimate(self, model: ModelDef) -> MemoryEstimate:
        # By identity, as `need`: hashing a whole definition costs more than the lookup saves.
        known = self._estimates.get(id(model))
        if known is not None and known[0] is model:
            return known[1]
        if self._index is None:
            self._index = WeightsIndex.of(self.infos)
        found = estimate_for(model, self.infos, self._index, self.sources)
        self._estimates[id(model)] = (model, found)
        return found

    def need(self, model: ModelDef) -> Need:
        # By identity: hashing a whole definition on every placement is most of its cost. Equal needs
        # are one object, so the caches keyed by need find it by identity too.
        known = self._by_id.get(id(model))
        if known is not None and known[0] is model:
            return known[1]
        found = self._intern(Need.fields(model, self.estimate(model)))
        self._by_id[id(model)] = (model, found)
        return found

    def _intern(self, fields: tuple[Any, ...]) -> Need:
        found = self._interned.get(fields)
        if found is None:
            found = self._interned[fields] = Need(*fields)
        return found

    def _fitting(self, need: Need) -> list[tuple[_Shape, _Fit]]:
        """The shapes whose hardware, engines and memory can take `need`, with their devices."""
        found = self._fits.get(need)
        if found is None:
            if need.cpu or need.gpus < 1:
                found = [(shape, fit) for shape in self.shapes if isinstance(fit := _static(need, shape), _Fit)]
            else:
                found = _quick(need, self.shapes)
            self._fits[need] = found
        return found

    def _ranking(self, need: Need) -> _Ranking:
        """The GPU profile's ranking, made on first use. A profile with memory figures (or a share of each
        GPU) is ranked by its family's pool (the profile without them: it fits every node the profile fits, with
        every device the profile may use there, and maybe more) while it fits at least half of that pool's
        nodes; the others (and the families) keep a pool of their own."""
        found = self._rankings.get(need)
        if found is None:
            fits = {name: fit for shape, fit in self._fitting(need) for name in shape.names}
            if need.per_device is not None or need.total is not None or need.share is not None:
                family = self._ranking(self._intern(need.family()))
                if 2 * len(fits) >= len(family.fits):
                    found = self._rankings[need] = _Ranking(fits, family.pool, False)
                    return found
            found = self._rankings[need] = _Ranking(fits, self._filled(_Pool(self._base + len(self._log), need.gpus,
                                                                              fits)), True)
        return found

    def _filled(self, pool: _Pool) -> _Pool:
        nodes, keys, lists, taking = self.nodes, pool.keys, pool.lists, pool.taking
        for name, fit in pool.fits.items():
            node = nodes[name]
            key = keys[name] = _entry(taking, node, fit)
            if key is not None:
                lists.setdefault(node.shape.fabrics, []).append(key)
        for entries in lists.values():
            entries.sort()
        return pool

    def _caught_up(self, pool: _Pool) -> _Pool:
        seen = pool.seen
        now = self._base + len(self._log)
        if seen < now:
            fits, keys, taking = pool.fits, pool.keys, pool.taking
            for name in self._changed(seen, fits):
                node = self.nodes[name]
                key = _entry(taking, node, fits[name])
                old = keys[name]
                if key != old:
                    entries = pool.lists.setdefault(node.shape.fabrics, [])
                    if old is not None:
                        del entries[bisect.bisect_left(entries, old)]
                    if key is not None:
                        bisect.insort(entries, key)
                    keys[name] = key
            pool.seen = now
        return pool

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
        known = self._launch.get(id(model))
        if known is None or known[0] is not model:
            known = self._launch[id(model)] = (model, model.launch_hash())
        launch = known[1]
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
        self._apply(p, sign)
        node = self.nodes.get(p.node)
        if node is not None and p.gpus:
            if len(self._log) > 4 * len(self.nodes) + 64:
                # The log stays short in a long-lived view: what was judged or sorted before the trim
                # asks each of its nodes when it last changed instead (`_changed`).
                self._base += len(self._log)
                self._log.clear()
            node.changed = self._base + len(self._log)
            self._log.append(p.node)

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
        found = _static(need, self.nodes[name].shape)
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
            if fit.all_usable and node.shape.capacity - node.used_usable < need.gpus:
                return self._busy(name, need.gpus, node.shape.capacity - node.used_usable)
            free = [i for i in fit.candidates if i not in used] if used else list(fit.candidates)
            if len(free) < need.gpus:
                return self._busy(name, need.gpus, len(free))
            pack = gpu_pack(node.used_usable, need.gpus, node.shape.capacity)
        spread = 0.0 if self.hosting.get(model.name, {}).get(name) else 100.0
        weights = 100.0 if self.holds(model, name) else 0.0
        return Verdict(name, FITS, score=Score(spread, weights, pack), gpus=tuple(free[: need.gpus]))

    def _busy(self, name: str, need: int, free: int) -> Refusal:
        """NOT_NOW for want of free devices: one object per node and count (a full fleet says it per failure)."""
        key = (name, need, free)
        found = self._busy_refusals.get(key)
        if found is None:
            found = self._busy_refusals[key] = Refusal(name, NOT_NOW, "gpus_busy", f"needs {need} free GPUs, {free} free",
                                                       {"need": need, "free": free})
        return found

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
        copied with each node's name once per need (it cannot change); only the nodes of fitting
        shapes are judged, into their slots of that list. A GPU profile judged before keeps that
        list: judged again are the nodes whose devices changed since, and those that were FITS (a
        score is the model's; a refusal for want of devices is not)."""
        found = self._refused.get(need)
        if found is None:
            fits = {id(shape): fit for shape, fit in self._fitting(need)}
            items = self._items
            # A GPU profile naming the classes of one judged before, and alike taking one device or more, is told
            # the same where that one was refused before memory counts; alike also in the memory per device and
            # the share of it taken (and the engine, which the words name), also where refused for memory. Only
            # the other nodes are looked at.
            keys: list[tuple[Any, ...]] = [] if need.cpu else [(need.classes, need.gpus > 1 or need.nodes > 1)]
            if keys and need.per_device is not None:
                keys.append((*keys[0], need.per_device, need.share, need.engine))
            alike = next((known for key in reversed(keys) if (known := self._alike.get(key)) is not None), None)
            template: list[Verdict | Refusal] = [_SLOT] * len(items) if alike is None else alike[0].copy()
            slots: list[tuple[int, _Node, _Fit]] = []
            for i in range(len(items)) if alike is None else alike[1]:  # in name order
                name, node = items[i]
                fit = fits.get(id(node.shape))
                if fit is None:
                    r = _static(need, node.shape)
                    assert isinstance(r, Refusal)
                    # Said of the shape's first node: the others get a copy with their names.
                    template[i] = r if r.node == name else Refusal(name, r.verdict, r.code, r.message, r.numbers)
                else:
                    slots.append((i, node, fit))
            for key, codes in zip(keys, (_BEFORE_MEMORY, _BEFORE_COUNT)):
                if key not in self._alike:
                    said: list[Verdict | Refusal] = [r if isinstance(r, Refusal) and r.code in codes else _SLOT
                                                     for r in template]
                    self._alike[key] = (said, [i for i, r in enumerate(said) if r is _SLOT])
            found = self._refused[need] = (template, slots, {node.info.node: k for k, (_, node, _) in enumerate(slots)})
        template, slots, slot_of = found
        now = self._base + len(self._log)
        last = None if need.cpu else self._judgement.get(need)  # CPU replicas change nodes unlogged
        if last is None:
            out = template.copy()
            again: Iterable[int] = range(len(slots))
        else:
            out = last[1].copy()
            again = {*(slot_of[name] for name in self._changed(last[0], slot_of)), *last[2]}
        fitting = []
        for k in again:
            i, node, fit = slots[k]
            v = out[i] = self._dynamic(model, need, node, fit)
            if isinstance(v, Verdict):
                fitting.append(k)
        if not need.cpu:
            self._judgement[need] = (now, out.copy(), fitting)
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
        if failed is not None and (failed[0] == self.version or (not need.cpu and self._untouched(need, failed[1]))):
            return failed[2]  # nothing it depends on changed since this very need fitted nowhere
        best = None if need.cpu else self._best_gpu(model, need)
        if need.cpu or best is None or explain:
            result = self._explained(model, need)
            if result.choice is None:
                self._failed[need] = (self.version, self._base + len(self._log), result)
            return result
        return PlacementResult(best, ())

    def _untouched(self, need: Need, since: int) -> bool:
        """Whether no node whose hardware fits the GPU profile changed since the log's `since`: its
        refusals (the rest are its hardware's, and no device of those nodes was taken or freed) hold."""
        ranking = self._rankings.get(need)
        return ranking is not None and not self._changed(since, ranking.fits)

    def _changed(self, since: int, among: Mapping[str, object]) -> Iterable[str]:
        """The nodes of `among` whose devices were taken or freed since the log's position `since`: read
        from the log, or, where it was trimmed since, from each node's last change."""
        if since >= self._base:
            return {name for name in self._log[since - self._base:] if name in among}
        return [name for name in among if self.nodes[name].changed >= since]

    def _best_gpu(self, model: ModelDef, need: Need) -> Choice | None:
        """The best node by the head of each list (storage fabrics holding the weights first) of the
        profile's pool, or of its family's; the nodes scored unlike the rest are judged one by one."""
        held = self.held(model)
        hosting = self.hosting.get(model.name) or {}
        special = held.nodes | hosting.keys() if held.nodes or hosting else frozenset()
        ranking = self._rankings.get(need) or self._ranking(need)
        fits = ranking.fits
        pool = self._caught_up(ranking.pool)
        heads = None if ranking.own else self._heads_passing_over(pool, fits, special)
        if heads is None:
            if not ranking.own:  # it passed over too many nodes it does not fit: a pool of its own from now on
                ranking.pool = pool = self._filled(_Pool(self._base + len(self._log), need.gpus, fits))
                ranking.own = True
            heads = []
            for fabrics, entries in pool.lists.items():
                for entry in entries:
                    if entry[1] not in special:
                        heads.append((fabrics, entry))
                        break
        best_rank: tuple[float, float, float] | None = None
        best_name = ""
        for fabrics, (neg_pack, name) in heads:
            weights = 100.0 if held.fabrics and held.fabrics & fabrics else 0.0
            rank = (combine(100.0, weights, -neg_pack), 100.0, weights)
            if best_rank is None or rank > best_rank or (rank == best_rank and name < best_name):
                best_rank, best_name = rank, name
        for name in sorted(n for n in special if n in fits) if special else ():
            v = self._dynamic(model, need, self.nodes[name], fits[name])
            if isinstance(v, Verdict) and v.score is not None:
                rank = v.score.rank()
                if best_rank is None or rank > best_rank or (rank == best_rank and name < best_name):
                    best_rank, best_name = rank, name
        if best_rank is None:
            return None
        used, candidates = self.nodes[best_name].used, fits[best_name].candidates
        gpus = tuple([i for i in candidates if i not in used][: need.gpus] if used else candidates[: need.gpus])
        return Choice(best_name, gpus, best_rank[0])

    def _heads_passing_over(self, family: _Pool, fits: Mapping[str, _Fit], special: Container[str],
                            ) -> list[tuple[frozenset[str], tuple[float, str]]] | None:
        """The first node of each of the family's lists that the profile fits and has room on (its place
        in a pool of the profile's own would be the same: a pack counts every usable device), or None when
        more than `PASSED_OVER` nodes were passed over."""
        taking, nodes = family.taking, self.nodes
        passed = 0
        out: list[tuple[frozenset[str], tuple[float, str]]] = []
        for fabrics, entries in family.lists.items():
            for entry in entries:
                name = entry[1]
                fit = fits.get(name)
                if fit is not None and name not in special and (
                        fit.all_usable or sum(1 for i in fit.candidates if i not in nodes[name].used) >= taking):
                    out.append((fabrics, entry))
                    break
                passed += 1
                if passed > PASSED_OVER:
                    return None
        return out

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


def _entry(taking: int, node: _Node, fit: _Fit) -> tuple[float, str] | None:
    """A node's place in a pool: (-pack once the replica of `taking` devices is there, as `gpu_pack` says
    it), name), or None with too few of the devices the profile may use free now."""
    used = node.used
    if fit.all_usable:
        if node.shape.capacity - node.used_usable < taking:
            return None
    elif used and sum(1 for i in fit.candidates if i not in used) < taking:
        return None
    # What `gpu_pack` says: the devices it may use are usable ones, so used + taking <= capacity.
    return -(100.0 * (node.used_usable + taking) / node.shape.capacity), node.info.node


def _static(need: Need, shape: _Shape) -> Refusal | _Fit:
    """The shape's verdict with its words (for its representative node; a refusal for the class may name a node of
    another shape of its `class_layout`: callers name their own node): a refusal or its fit."""
    found = shape.static.get(need)
    if found is None:
        if need.classes and not need.cpu:
            # `filters.devices` refuses for the class before memory or count: profiles that name the same classes
            # (and alike need one device or more, for the MIG rule before it) get the same refusal, in the same words.
            key = (need.classes, need.gpus > 1 or need.nodes > 1)
            if key in shape.by_class:
                found = shape.by_class[key] or _judge(need, shape)
            else:
                found = _judge(need, shape)
                shape.by_class[key] = found if isinstance(found, Refusal) and found.code == "class" else None
        else:
            found = _judge(need, shape)
        shape.static[need] = found
    return found


def _quick(need: Need, shapes: list[_Shape]) -> list[tuple[_Shape, _Fit]]:
    """The shapes that can take a GPU profile, with their devices, as `_judge` decides it but without
    the words of a refusal (`_judge` writes them when asked): each kind of device judged once by the
    filters of `filters.devices` (MIG, class, memory, reserve; an unusable or reserved device never
    counts), then the count. One loop over every shape: a fleet of 1,000 shapes asks it per profile."""
    taking, engine = need.gpus, need.engine
    many = taking > 1 or need.nodes > 1
    classes, per_device, share = need.classes, need.per_device, need.share
    least = 1 if per_device is None else per_device
    out: list[tuple[_Shape, _Fit]] = []
    llama = engine == "llama.cpp"
    for shape in shapes:
        if shape.capacity < taking or shape.pending or shape.cordoned or engine not in shape.engines:
            continue
        if llama and engine_refusal(need, shape.rep) is not None:  # its form (llama-server)
            continue
        if not classes:
            if shape.plain and (per_device is None or per_device <= (
                    shape.least_memory if share is None else int(shape.least_memory * share))):
                out.append((shape, shape.whole))  # every device fits: what the loop below finds, sooner
                continue
        elif shape.classes.isdisjoint(classes):
            continue  # no device of those classes: the loop below finds none
        vram = shape.reserved_vram
        reserve = shape.reserve
        hits: list[int] = []  # the kinds that fit
        count = 0
        for k, (gpu_class, mig, memory, indexes) in enumerate(shape.kinds):
            if (many and mig) or (classes and gpu_class not in classes):
                continue
            room = memory if share is None else int(memory * share)  # `Need.room`
            if per_device is not None and room < per_device:
                continue
            if reserve:  # `filters._unreserved`: what the GPU's reserve leaves
                if vram:
                    room = min(room, memory - vram) if share is None else (room if room <= memory - vram else 0)
                if room < least:
                    continue
            hits.append(k)
            count += len(indexes)
        if count >= taking:
            if len(hits) == 1:
                fit = shape.kind_fits[hits[0]]
            elif count == shape.capacity:  # the kinds hold only usable devices: all of them
                fit = shape.whole
            else:
                fit = _Fit(tuple(sorted(i for k in hits for i in shape.kinds[k][3])), False)
            out.append((shape, fit))
    return out


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
