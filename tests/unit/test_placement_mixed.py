"""S2 `FleetView` on a mixed fleet (issue 26): the fast path (`place`: each GPU profile's pool of nodes,
the per-kind quick fit, the refusals copied once per profile) chooses, and refuses with, exactly what the
straightforward one says: every node judged on its own (`FleetView.verdict`: the full filters, then
its score), the best by score then name. Random small fleets where nodes differ in every way placement
looks at: GPU counts, classes, memory as probes report it, health, MIG instances, reserves (devices,
memory of each GPU, the machine's memory), engines, fabrics, storage, nodes awaiting approval."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement import FITS, FleetView, PlacementResult, Verdict
from llmgw.placement.fleet import PASSED_OVER
from llmgw.testing.builders import GIB, model, node

CLASSES = {"h100-80g": 80, "a100-40g": 40, "l40s-48g": 48}
MIG = {"a100-80g-mig-3g.40gb": 40, "a100-80g-mig-1g.10gb": 10}
FABRICS = ["ib-a", "ib-b", ""]


@st.composite
def mixed_nodes(draw: st.DrawFn) -> dict[str, NodeInfo]:
    names = draw(st.lists(st.sampled_from([f"n{i}" for i in range(12)]), unique=True, max_size=10))
    out = {}
    for name in names:
        gpus = []
        cls = draw(st.sampled_from(sorted(CLASSES)))
        jitter = draw(st.integers(0, 3)) * GIB // 2  # a probe reports a little under the card's size
        for index in range(draw(st.integers(0, 6))):
            state = draw(st.integers(0, 9))
            gpus.append(Gpu(index, f"GPU-{name}-{index}", cls, cls, CLASSES[cls] * GIB - jitter, 0, healthy=state != 0,
                            placeable=state != 1, reason="" if state > 1 else "not now"))
        for n in range(draw(st.integers(0, 3)) if draw(st.integers(0, 2)) == 0 else 0):
            mig = draw(st.sampled_from(sorted(MIG)))
            gpus.append(Gpu(1000 + n, f"MIG-{name}-{n}", "mig", mig, MIG[mig] * GIB, 0, parent_index=0))
        indexes = [g.index for g in gpus]
        memory = draw(st.sampled_from([0, 32, 64, 96])) * GIB
        info = NodeInfo(name, hostname=name, gpus=tuple(gpus), memory_total=memory,
                        engines=draw(st.sampled_from([("vllm", "sim"), ("vllm", "sim"), ("sim",),
                                                      ("llama.cpp", "vllm", "sim")])),
                        # llama.cpp's forms: only the in-process binding cannot run a replica on GPUs
                        engine_versions=draw(st.sampled_from([{}, {"llama.cpp": "xllamacpp 0.2.1"},
                                                              {"llama.cpp": "xllamacpp 0.2.1, llama-server b5000"}])),
                        fabric=draw(st.sampled_from(FABRICS)),
                        reserved_gpus=tuple(draw(st.lists(st.sampled_from(indexes), unique=True, max_size=2)))
                        if indexes and draw(st.integers(0, 3)) == 0 else (),
                        reserved_vram=draw(st.sampled_from([0, 0, 0, 4, 30])) * GIB,
                        reserved_memory=draw(st.sampled_from([0, 0, 16])) * GIB)
        if draw(st.integers(0, 3)) == 0:
            shared = draw(st.booleans())
            info = replace(info, storage=({"path": "/srv", "fabric": info.fabric or "eth", "shared": shared,
                                           "error": "", "not_weights": [],
                                           "models": [{"name": "m0", "path": "/srv/m0", "kind": "gguf", "size": 1}]},))
        out[name] = info
    return out


@st.composite
def single_node_models(draw: st.DrawFn, name: str) -> ModelDef:
    b = model(name).llamacpp() if draw(st.integers(0, 4)) == 0 else model(name).vllm(f"/srv/{name}")
    if draw(st.integers(0, 7)) == 0:
        return b.cpu().memory(draw(st.sampled_from([8, 30, 70]))).build()
    gpus = draw(st.sampled_from([1, 1, 2, 3, 4]))
    b = b.gpus(gpus)
    roll = draw(st.integers(0, 5))
    if roll < 2:
        b = b.classes(*draw(st.lists(st.sampled_from(sorted(CLASSES)), min_size=1, max_size=2, unique=True)))
    elif roll == 2 and gpus == 1:  # a MIG class takes one instance (validation refuses more)
        b = b.classes(draw(st.sampled_from(sorted(MIG))))
    if draw(st.booleans()):
        b = b.memory(draw(st.sampled_from([8, 30, 36, 43, 60, 140])) * gpus)
    return b.build()


Said = tuple[str, str, str, str, dict[str, float]]


def straightforward(view: FleetView, m: ModelDef) -> tuple[tuple[str, tuple[int, ...], float] | None, list[Said]]:
    """Every node judged on its own, in name order: the best score wins, the first name among equals.
    The choice (node, devices, score) and every other node's refusal. Each node judged in a view made afresh
    for it (from the same nodes and placements), so nothing another profile or another node left in the caches
    (of a shape, of its class layout) counts."""
    pending = [n for n, node in view.nodes.items() if node.shape.pending]
    cordoned = [n for n, node in view.nodes.items() if node.shape.cordoned]
    best: Verdict | None = None
    refusals: list[Said] = []
    for name in sorted(view.nodes):
        fresh = FleetView(view.infos, list(view.placements.values()), view.models, pending=pending, cordoned=cordoned)
        v = fresh.verdict(m, name)
        if v.verdict != FITS:
            refusals.append((v.node, v.verdict, v.code, v.message, dict(v.numbers or {})))
        elif v.score is not None and (best is None or best.score is None or v.score.rank() > best.score.rank()):
            best = v
    if best is None or best.score is None:
        return None, refusals
    return (best.node, best.gpus, best.score.total), refusals


def said(result: PlacementResult) -> list[Said]:
    return [(r.node, r.verdict, r.code, r.message, dict(r.numbers)) for r in result.refusals]


def agree(view: FleetView, m: ModelDef) -> PlacementResult:
    fast = view.place(m)
    best, refusals = straightforward(view, m)
    if best is None:
        assert fast.choice is None and said(fast) == refusals
    else:
        assert fast.choice is not None and (fast.choice.node, fast.choice.gpus, fast.choice.score) == best
    explained = view.place(m, explain=True)
    assert explained.choice == fast.choice and said(explained) == refusals
    return fast


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_fast_path_agrees_with_every_node_judged_on_its_own(data: Any):
    nodes = data.draw(mixed_nodes())
    wanted = [data.draw(single_node_models(f"m{i}")) for i in range(data.draw(st.integers(1, 6)))]
    pending = data.draw(st.lists(st.sampled_from(sorted(nodes)), unique=True, max_size=2)) if nodes else []
    cordoned = data.draw(st.lists(st.sampled_from(sorted(nodes)), unique=True, max_size=2)) if nodes else []
    view = FleetView(nodes, (), {m.name: m for m in wanted}, pending=pending, cordoned=cordoned)
    taken: list[Placement] = []
    for m in wanted:
        for r in range(3):
            result = agree(view, m)
            if result.choice is None:
                break
            taken.extend(view.take(m, result.choice, f"{m.name}-r{r}"))
    # Freed devices come back: after removing some, the pools still agree with every node judged anew.
    for p in data.draw(st.lists(st.sampled_from(taken), unique=True)) if taken else []:
        view.remove(p.replica_id)
    for m in wanted:
        agree(view, m)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_long_lived_view_agrees_after_its_log_is_trimmed(data: Any):
    """A view kept over many changes trims its log of changed nodes (past 4 per node and 64): what it
    judged before the trim (a profile that fitted nowhere, every node's verdict) is checked against when
    each node last changed, and still agrees with every node judged on its own."""
    nodes = data.draw(mixed_nodes())
    wanted = [data.draw(single_node_models(f"m{i}")) for i in range(data.draw(st.integers(1, 4)))]
    view = FleetView(nodes, (), {m.name: m for m in wanted})
    taken: dict[str, tuple[ModelDef, Placement]] = {}
    serial = 0
    trims = 0
    for step in range(4 * len(nodes) + 64 + data.draw(st.integers(1, 80))):
        before = len(view._log)
        if taken and data.draw(st.booleans()):
            replica = data.draw(st.sampled_from(sorted(taken)))
            view.remove(replica)
            del taken[replica]
        else:
            m = data.draw(st.sampled_from(wanted))
            result = agree(view, m) if step % 7 == 0 else view.place(m)
            if result.choice is not None:
                serial += 1
                for p in view.take(m, result.choice, f"{m.name}-r{serial}"):
                    taken[p.replica_id] = (m, p)
        trims += len(view._log) < before
    for m in wanted:
        agree(view, m)


def test_a_profile_that_fitted_nowhere_is_not_judged_again_across_a_trim_until_its_nodes_change():
    """The trim keeps what it can: a refusal made before it is given again as it was while none of the
    profile's nodes changed (the same result, nothing judged), and judged anew once one did."""
    nodes = {"n0": node("n0").engines("vllm").gpus(2, "h100-80g").build(),
             "n1": node("n1").engines("vllm").gpus(1, "a100-40g").build()}
    big, h100, a100 = (model("big").vllm("/m/big").gpus(2).classes("h100-80g").build(),
                       model("h100").vllm("/m/h100").classes("h100-80g").build(),
                       model("a100").vllm("/m/a100").classes("a100-40g").build())
    view = FleetView(nodes, (), {m.name: m for m in (big, h100, a100)})
    choice = view.place(h100).choice
    assert choice is not None and choice.node == "n0"
    view.take(h100, choice, "h100-r0")
    refused = agree(view, big)
    assert refused.choice is None and [r.code for r in refused.refusals] == ["gpus_busy", "class"]
    trimmed_at = view._base
    for r in range(4 * len(nodes) + 65):  # only n1 changes, past the log's length: it is trimmed
        choice = view.place(a100).choice
        assert choice is not None and choice.node == "n1"
        view.take(a100, choice, f"a100-r{r}")
        view.remove(f"a100-r{r}")
    assert view._base > trimmed_at
    assert view.place(big) is refused  # n0 did not change: nothing judged again
    agree(view, big)
    view.remove("h100-r0")  # n0 frees its GPU, after the trim: judged again, and it fits
    assert agree(view, big).choice is not None


def test_a_profile_whose_nodes_sit_behind_many_fuller_ones_gets_a_pool_of_its_own_and_still_agrees():
    """A profile with memory figures is ranked by its family's pool (the same profile without them, here the one
    of a model whose weights no node reports), passing over the nodes it does not fit. Here its nodes (80 GiB cards) are the emptiest of the fleet, behind 20 fuller
    nodes of 40 GiB cards it cannot use: past `PASSED_OVER` of them it keeps a pool of its own, and every choice
    still agrees with every node judged on its own."""
    small = {f"s{i:02d}": node(f"s{i:02d}").engines("vllm").gpus(8, "a100-40g", memory_gib=40).build()
             for i in range(20)}
    large = {f"b{i:02d}": node(f"b{i:02d}").engines("vllm").gpus(8, "h100-80g").build() for i in range(20)}
    filler = model("filler").vllm("/m/filler").gpus(1).build()
    big = model("big").vllm("/m/big").gpus(1).memory(60).build()
    assert len(small) > PASSED_OVER
    # With every node empty, the profile's nodes come first in its family's pool: it ranks by that pool.
    empty = FleetView({**small, **large}, (), {m.name: m for m in (filler, big)})
    assert agree(empty, big).choice is not None
    assert not empty._rankings[empty.need(big)].own
    assert empty._rankings[empty.need(big)].pool is empty._rankings[empty.need(filler)].pool
    view = FleetView({**small, **large}, [Placement(f"filler-{n}", "filler", n, (0, 1), "h", 0.0) for n in small],
                     {m.name: m for m in (filler, big)})
    need = view.need(big)
    for r in range(12):
        choice = agree(view, big).choice
        assert choice is not None and choice.node.startswith("b")
        view.take(big, choice, f"big-r{r}")
    assert view._rankings[need].own  # it passed over the 20 fuller nodes once, and ranks its own nodes since
    assert agree(view, filler).choice is not None  # the family's own pool, told of every change, agrees too


def test_profiles_alike_but_for_their_device_count_share_what_was_said_before_the_count_and_no_more():
    """Two profiles alike in classes, memory per device, share and engine, and both taking more than one device:
    the second is told the first's words where the first was refused for memory (the same object), and its own
    where the count decides (needs 4 GPUs, not 2). Both as every node judged on its own says."""
    nodes = {"n0": node("n0").engines("vllm").gpus(2, "a100-40g", memory_gib=40).build(),
             "n1": node("n1").engines("vllm").gpus(4, "h100-80g").build(),
             "n2": node("n2").engines("vllm").gpus(1, "h100-80g").build()}
    two, four = (model("two").vllm("/m/two").gpus(2).memory(120).build(),
                 model("four").vllm("/m/four").gpus(4).memory(240).build())
    view = FleetView(nodes, (), {m.name: m for m in (two, four)})
    agree(view, two), agree(view, four)
    first, second = view.place(two, explain=True), view.place(four, explain=True)
    assert [(r.node, r.code) for r in first.refusals] == [("n0", "memory"), ("n2", "gpu_count")]
    assert [(r.node, r.code) for r in second.refusals] == [("n0", "memory"), ("n2", "gpu_count")]
    assert second.refusals[0] is first.refusals[0]  # said once
    assert "needs 4 GPUs" in second.refusals[1].message and "needs 2 GPUs" in first.refusals[1].message
