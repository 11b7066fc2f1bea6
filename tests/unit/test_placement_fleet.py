"""S2 `FleetView`: the incremental planner agrees with `place` rebuilt from scratch, never
over-commits, never uses unhealthy, unplaceable or not-ready devices, keeps a multi-node replica
in one fabric, and gives the same plan whatever order the nodes and placements come in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement import FleetView, place
from llmgw.testing.builders import GIB, model, node

CLASSES = {"h100-80g": 80, "a100-40g": 40}
FABRICS = ["ib-a", "ib-b", ""]


@st.composite
def nodes_(draw: st.DrawFn) -> dict[str, NodeInfo]:
    """Up to 8 nodes: GPUs of two classes (some unhealthy or unplaceable), a MIG instance now and
    then, nodes whose discovery failed, CPU nodes; some holding a model's weights."""
    names = draw(st.lists(st.sampled_from([f"n{i}" for i in range(10)]), unique=True, max_size=8))
    out = {}
    for name in names:
        gpus = []
        if draw(st.integers(0, 6)) == 0:  # discovery failed: no GPU listed, a warning
            info = NodeInfo(name, hostname=name, engines=("vllm", "sim"), probe="none",
                            warnings=("no GPU discovery worked: NVML: driver not loaded",), memory_total=64 * GIB)
        else:
            for index in range(draw(st.integers(0, 8))):
                cls = draw(st.sampled_from(sorted(CLASSES)))
                state = draw(st.integers(0, 7))
                gpus.append(Gpu(index, f"GPU-{name}-{index}", cls, cls, CLASSES[cls] * GIB, 0, healthy=state != 0,
                                placeable=state != 1, reason="" if state > 1 else "not now"))
            if draw(st.integers(0, 5)) == 0:
                gpus.append(Gpu(1000, f"MIG-{name}", "mig", "a100-80g-mig-3g.40gb", 40 * GIB, 0, parent_index=0))
            info = NodeInfo(name, hostname=name, gpus=tuple(gpus), engines=("vllm", "sim"), memory_total=64 * GIB,
                            fabric=draw(st.sampled_from(FABRICS)))
        if draw(st.integers(0, 3)) == 0:
            shared = draw(st.booleans())
            info = replace(info, storage=({"path": "/srv", "fabric": info.fabric or "eth", "shared": shared,
                                           "error": "", "not_weights": [],
                                           "models": [{"name": "m0", "path": "/srv/m0", "kind": "gguf", "size": 1}]},))
        out[name] = info
    return out


@st.composite
def models_(draw: st.DrawFn, name: str) -> ModelDef:
    b = model(name).vllm(f"/srv/{name}")
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return b.cpu().memory(draw(st.sampled_from([8, 30, 70]))).build()
    if kind == 1:  # multi-node
        gpus, nodes = draw(st.integers(1, 2)), 2
        return ModelDef.from_doc({**b.doc(), "profile": {"gpus": gpus, "tp": gpus * nodes, "nodes": nodes}})
    gpus = draw(st.sampled_from([1, 1, 2, 4]))
    b = b.gpus(gpus)
    if draw(st.booleans()):
        b = b.classes(draw(st.sampled_from(sorted(CLASSES))))
    elif gpus == 1 and draw(st.integers(0, 4)) == 0:
        b = b.classes("a100-80g-mig-3g.40gb")
    if draw(st.booleans()):
        b = b.memory(draw(st.sampled_from([10, 30, 60, 140])) * gpus)
    return b.build()


def check(nodes: dict[str, NodeInfo], placements: list[Placement], models: dict[str, ModelDef]) -> None:
    """The safety properties over a whole plan."""
    seen: set[tuple[str, int]] = set()
    cpu_bytes: dict[str, int] = {}
    groups: dict[str, set[str]] = {}
    for p in placements:
        info = nodes[p.node]
        m = models[p.model]
        by_index = {g.index: g for g in info.gpus}
        assert len(p.gpus) == (0 if m.profile.cpu else m.profile.gpus)
        for index in p.gpus:
            assert (p.node, index) not in seen, "a device placed twice"
            seen.add((p.node, index))
            g = by_index[index]
            assert g.healthy and g.placeable, "never an unhealthy or unplaceable device"
            share = 0.9 if m.engine == "vllm" else 1.0
            assert g.memory_total * share >= m.profile.memory_gib * GIB / (m.profile.gpus * m.profile.nodes)
        if not m.profile.cpu:
            assert info.gpus, "never on a node that lists no GPU (not ready, or CPU only)"
        else:
            cpu_bytes[p.node] = cpu_bytes.get(p.node, 0) + int(m.profile.memory_gib * GIB)
        if p.group:
            groups.setdefault(p.group, set()).add(info.fabric)
    for name, used in cpu_bytes.items():
        assert used <= nodes[name].memory_total, "CPU replicas never over-commit a node's memory"
    for fabrics in groups.values():
        assert len(fabrics) == 1 and "" not in fabrics, "a multi-node replica stays in one fabric"


def plan(nodes: dict[str, NodeInfo], wanted: list[ModelDef], order: list[str] | None = None) -> list[Placement]:
    ordered = {n: nodes[n] for n in (order or sorted(nodes))}
    view = FleetView(ordered, (), {m.name: m for m in wanted})
    for m in wanted:
        for r in range(3):
            result = view.place(m)
            if result.choice is None:
                assert result.reason()
                break
            view.take(m, result.choice, f"{m.name}-r{r}")
    return sorted(view.placements.values(), key=lambda p: p.replica_id)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_plan_never_over_commits_and_is_the_same_in_any_order(data: Any):
    nodes = data.draw(nodes_())
    wanted = [data.draw(models_(f"m{i}")) for i in range(data.draw(st.integers(1, 6)))]
    placements = plan(nodes, wanted)
    check(nodes, placements, {m.name: m for m in wanted})
    shuffled = data.draw(st.permutations(sorted(nodes)))
    assert plan(nodes, wanted, list(shuffled)) == placements, "the same input gives the same plan"


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_view_chooses_what_place_chooses_rebuilt_from_scratch(data: Any):
    nodes = data.draw(nodes_())
    wanted = [data.draw(models_(f"m{i}")) for i in range(data.draw(st.integers(1, 5)))]
    models = {m.name: m for m in wanted}
    view = FleetView(nodes, (), models)
    placements: list[Placement] = []
    for m in wanted:
        for r in range(2):
            fast = view.place(m)
            slow = place(m, nodes, placements, models=models)
            assert fast.choice == slow.choice
            assert view.place(m, explain=True) == slow
            if fast.choice is None:
                assert fast.refusals == slow.refusals and fast.reason() == slow.reason()
                break
            placements.extend(view.take(m, fast.choice, f"{m.name}-r{r}"))
    # Removing gives back what was taken: the view then agrees with a fresh one again.
    for p in placements[::2]:
        view.remove(p.replica_id)
    kept = [p for p in placements[1::2]]
    fresh = FleetView(nodes, kept, models)
    for m in wanted:
        assert view.place(m, explain=True) == fresh.place(m, explain=True)


def test_an_incremental_placement_sees_the_ones_added_before_it():
    nodes = {"a": node("a").gpus(2).engines("vllm").build()}
    m = model("m").vllm().gpus(1).build()
    view = FleetView(nodes)
    first = view.place(m).choice
    assert first is not None and first.gpus == (0,)
    view.take(m, first, "m-r1")
    second = view.place(m).choice
    assert second is not None and second.gpus == (1,)
    view.take(m, second, "m-r2")
    full = view.place(m)
    assert full.choice is None and full.refusals[0].code == "gpus_busy"
    view.remove("m-r1")
    assert view.place(m).choice == replace(first, score=view.place(m).choice.score)  # type: ignore[union-attr]


def test_a_group_taken_through_the_view_makes_its_nodes_busy():
    nodes = {n: node(n).gpus(8).engines("vllm").fabric("ib").build() for n in "abc"}
    g = ModelDef.from_doc({**model("g").vllm().doc(), "profile": {"gpus": 8, "tp": 16, "nodes": 2}})
    view = FleetView(nodes)
    choice = view.place(g).choice
    assert choice is not None and [x.node for x in choice.members] == ["a", "b"]
    taken = view.take(g, choice, "g-g1")
    assert [(p.replica_id, p.rank, p.group) for p in taken] == [("g-g1-r0", 0, "g-g1"), ("g-g1-r1", 1, "g-g1")]
    again = view.place(g)
    assert again.choice is None and again.summary == "no fabric with 2 free whole nodes: ib has 1"
