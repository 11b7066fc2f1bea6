"""S2 placement: filters with named verdicts, bin-pack and spread scoring, and safety properties."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Iterable, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement import NEVER, NOT_NOW, Choice, PlacementResult, Refusal, place
from llmgw.testing.builders import GIB, cpu_node, fleet, model, node


def on(node_name: str, *gpus: int, model_name: str = "other", n: int = 1, at: float = 0.0) -> Placement:
    return Placement(f"{model_name}-r{n}-{node_name}-{'-'.join(map(str, gpus))}", model_name, node_name,
                     tuple(gpus), "h", at)


def only_refusal(result: PlacementResult) -> Refusal:
    assert result.choice is None
    (refusal,) = result.refusals
    return refusal


GPU_MODEL = model("big").vllm().gpus(1)


# --- CPU profiles ---------------------------------------------------------------


def test_cpu_profile_fits_any_node_with_the_engine():
    sim = model("demo").sim().build()
    # Spread 100 (× 0.5) everywhere; pack 100 (× 0.2) on a node with no GPU: CPU work keeps off GPU nodes.
    for info, score in [(cpu_node("local"), 70.0), (node("g").gpus(8).engines("sim").build(), 50.0)]:
        result = place(sim, fleet(info), [])
        assert result.choice == Choice(info.node, (), score) and result.refusals == ()


def test_cpu_profile_never_takes_a_gpu_even_when_all_are_free():
    llama = model("small").llamacpp().cpu().build()
    result = place(llama, fleet(node("g").gpus(2).engines("llama.cpp")), [])
    assert result.choice is not None and result.choice.gpus == ()


def test_cpu_replica_is_sized_against_the_node_memory():
    llama = model("small").llamacpp().cpu().memory(24).build()
    small = node("small").memory_gib(16).engines("llama.cpp").build()
    large = node("large").memory_gib(64).engines("llama.cpp").build()
    result = place(llama, fleet(small, large), [])
    assert result.choice is not None and result.choice.node == "large"
    (refusal,) = result.refusals
    assert (refusal.node, refusal.verdict, refusal.code) == ("small", NEVER, "cpu_memory")
    assert refusal.message == "needs 24 GiB of memory, node has 16.0 GiB"
    unknown = node("unknown").memory_gib(0).engines("llama.cpp").build()  # said nothing: not refused on a guess
    assert place(llama, fleet(unknown), []).choice is not None


def test_missing_engine_is_not_now_with_a_hint():
    llama = model("small").llamacpp().cpu().build()
    refusal = only_refusal(place(llama, fleet(cpu_node("local", "sim")), []))
    assert (refusal.node, refusal.verdict, refusal.code) == ("local", NOT_NOW, "engine_missing")
    assert "llama.cpp" in refusal.message and "pip install" in refusal.message


def test_missing_sim_engine_has_no_hint_but_still_names_the_engine():
    refusal = only_refusal(place(model("demo").build(), fleet(cpu_node("x", "llama.cpp")), []))
    assert refusal.message == "engine sim is not installed"


# --- GPU filters ------------------------------------------------------------------


def test_gpu_model_on_a_cpu_node_is_never_no_gpu():
    refusal = only_refusal(place(GPU_MODEL.build(), fleet(cpu_node("local", "vllm")), []))
    assert (refusal.verdict, refusal.code) == (NEVER, "no_gpu")
    assert "CPU" in refusal.message


def test_class_filter():
    m = model("big").vllm().gpus(1).classes("h100-80g").build()
    nodes = fleet(node("a").gpus(4, "a100-40g", memory_gib=40).engines("vllm"),
                  node("h").gpus(1, "h100-80g").engines("vllm"))
    result = place(m, nodes, [])
    assert result.choice == Choice("h", (0,), 70.0)  # spread 100 × 0.5 + pack 100 × 0.2; no weights
    (refusal,) = result.refusals
    assert (refusal.node, refusal.verdict, refusal.code) == ("a", NEVER, "class")
    assert "h100-80g" in refusal.message


def test_class_filter_takes_only_the_allowed_gpus_of_a_mixed_node():
    m = model("big").vllm().gpus(2, tp=2).classes("l4-24g").build()
    mixed = node("m").gpus(2, "h100-80g").gpus(2, "l4-24g", memory_gib=24).engines("vllm")
    choice = place(m, fleet(mixed), []).choice
    assert choice is not None and (choice.node, choice.gpus) == ("m", (2, 3))


def test_memory_filter_is_per_gpu():
    m = model("big").vllm().gpus(2, tp=2).memory(100).build()  # 50 GiB on each of two GPUs
    small = node("s").gpus(4, "a100-40g", memory_gib=40).engines("vllm")
    large = node("l").gpus(2, "h100-80g", memory_gib=80).engines("vllm")
    result = place(m, fleet(small, large), [])
    assert result.choice is not None and result.choice.node == "l"
    (refusal,) = result.refusals
    assert (refusal.node, refusal.verdict, refusal.code) == ("s", NEVER, "memory")
    assert "50 GiB" in refusal.message


def test_memory_filter_uses_only_the_large_gpus_of_a_node():
    m = model("big").vllm().gpus(1).memory(60).build()
    mixed = node("m").gpus(2, "a100-40g", memory_gib=40).gpus(1, "h100-80g", memory_gib=80).engines("vllm")
    choice = place(m, fleet(mixed), []).choice
    assert choice is not None and (choice.node, choice.gpus) == ("m", (2,))
    busy = place(m, fleet(mixed), [on("m", 2)])
    assert (only_refusal(busy).verdict, only_refusal(busy).code) == (NOT_NOW, "gpus_busy")


def test_gpus_busy_is_not_now_but_too_few_is_never():
    two = model("big").vllm().gpus(2, tp=2).build()
    busy = only_refusal(place(two, fleet(node("n").gpus(2).engines("vllm")), [on("n", 1)]))
    assert (busy.verdict, busy.code) == (NOT_NOW, "gpus_busy")
    assert busy.message == "needs 2 free GPUs, 1 free"
    few = only_refusal(place(two, fleet(node("n").gpus(1).engines("vllm")), []))
    assert (few.verdict, few.code) == (NEVER, "gpu_count")


def test_multi_node_replicas_need_nodes_with_a_fabric():
    # The rest of multi-node placement: tests/unit/test_group_placement.py.
    m = model("big").vllm().build()
    m = ModelDef.from_doc({**m.to_doc(), "profile": {"gpus": 2, "tp": 4, "nodes": 2}})
    result = place(m, fleet(node("n").gpus(8).engines("vllm")), [])
    refusal = only_refusal(result)
    assert (refusal.verdict, refusal.code) == (NEVER, "no_fabric")
    assert result.reason().startswith("no fabric with 2 free whole nodes: no node has a fabric configured")


def test_unhealthy_gpus_are_neither_used_nor_free():
    n = node("n").gpus(2, unhealthy=[0]).engines("vllm")
    one = place(GPU_MODEL.build(), fleet(n), [])
    assert one.choice is not None and one.choice.gpus == (1,)
    two = only_refusal(place(model("big").vllm().gpus(2, tp=2).build(), fleet(n), []))
    # Not "never": the unhealthy GPU may come back, and then the model fits.
    assert (two.verdict, two.code) == (NOT_NOW, "gpus_unhealthy") and "1 healthy now" in two.message
    three = only_refusal(place(model("big").vllm().gpus(4, tp=4).build(), fleet(n), []))
    assert (three.verdict, three.code) == (NEVER, "gpu_count") and "node has 2" in three.message
    busy = only_refusal(place(GPU_MODEL.build(), fleet(n), [on("n", 1)]))
    assert (busy.verdict, busy.code) == (NOT_NOW, "gpus_busy") and "0 free" in busy.message


def test_a_node_of_unhealthy_gpus_takes_nothing():
    assert place(GPU_MODEL.build(), fleet(node("n").gpus(4, unhealthy=range(4)).engines("vllm")), []).choice is None


def test_placements_on_other_nodes_do_not_count():
    nodes = fleet(node("a").gpus(1).engines("vllm"))
    assert place(GPU_MODEL.build(), nodes, [on("b", 0)]).choice == Choice("a", (0,), 70.0)


def test_lowest_free_indexes_are_chosen():
    m = model("big").vllm().gpus(2, tp=2).build()
    result = place(m, fleet(node("n").gpus(8).engines("vllm")), [on("n", 0), on("n", 2)])
    assert result.choice is not None and result.choice.gpus == (1, 3)


# --- scoring ---------------------------------------------------------------------


def test_bin_pack_prefers_the_fuller_node():
    nodes = fleet(node("a").gpus(8).engines("vllm"), node("b").gpus(8).engines("vllm"))
    result = place(GPU_MODEL.build(), nodes, [on("b", 0, 1, 2, 3)])
    assert result.choice is not None and result.choice.node == "b" and result.choice.gpus == (4,)


def test_bin_pack_prefers_a_smaller_node_that_it_fills():
    nodes = fleet(node("eight").gpus(8).engines("vllm"), node("two").gpus(2).engines("vllm"))
    result = place(model("big").vllm().gpus(2, tp=2).build(), nodes, [])
    assert result.choice is not None and result.choice.node == "two"


def test_spread_prefers_a_node_without_a_replica_of_the_same_model():
    sim = model("demo").build()
    nodes = fleet(cpu_node("a"), cpu_node("b"))
    first = place(sim, nodes, [])
    assert first.choice is not None and first.choice.node == "a"
    second = place(sim, nodes, [Placement("demo-r1", "demo", "a", (), "h", 0)])
    assert second.choice == Choice("b", (), 70.0)


def test_spread_among_equally_full_gpu_nodes():
    nodes = fleet(node("a").gpus(8).engines("vllm"), node("b").gpus(8).engines("vllm"))
    result = place(GPU_MODEL.build(), nodes, [on("a", 0, model_name="big"), on("b", 0, model_name="other")])
    assert result.choice is not None and result.choice.node == "b"


def test_scores_are_between_0_and_100_for_healthy_clusters():
    nodes = fleet(node("a").gpus(4).engines("vllm"), node("b").gpus(8).engines("vllm"), cpu_node("c"))
    for m in [GPU_MODEL.build(), model("demo").build()]:
        result = place(m, nodes, [on("a", 0, 1, 2), on("b", 5)])
        assert result.choice is not None and 0 <= result.choice.score <= 100


def test_score_stays_within_100_when_a_placed_gpu_turns_unhealthy():
    n = node("a").gpus(2, unhealthy=[0]).engines("vllm")
    result = place(GPU_MODEL.build(), fleet(n), [on("a", 0)])
    assert result.choice is not None and result.choice.score <= 100


def test_planner_offers_one_mig_instance_or_none():
    mig = node("m").mig(0, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40)).engines("vllm")
    result = place(model("big").vllm().gpus(2, tp=2).build(), fleet(mig), [])
    assert result.choice is None


def card(index: int, cls: str = "a100-80g", *, healthy: bool = True, placeable: bool = True, reason: str = "",
         memory_gib: float = 80) -> Gpu:
    return Gpu(index, f"GPU-{index}", cls.upper(), cls, int(memory_gib * GIB), 0, healthy, reason, placeable)


def instance(card_index: int, n: int, profile: str = "3g.40gb", memory_gib: float = 40) -> Gpu:
    return Gpu(1000 + 100 * card_index + n, f"MIG-{card_index}-{n}", f"A100 MIG {profile}",
               f"a100-80g-mig-{profile}", int(memory_gib * GIB), 0, mig_profile=profile, parent_index=card_index)


MIG_ON = "MIG mode is on: its instances are placed instead"


def with_gpus(name: str, *gpus: Gpu, engines: tuple[str, ...] = ("vllm",)) -> NodeInfo:
    return NodeInfo(name, hostname=name, gpus=gpus, engines=engines)


def test_a_mig_card_with_nothing_carved_is_refused_with_the_probes_reason():
    empty = with_gpus("m", card(0, placeable=False, reason="0: MIG mode is on but no instances are carved"))
    refusal = only_refusal(place(GPU_MODEL.build(), fleet(empty), []))
    # Not NEVER: carving instances (or turning MIG off) makes it fit.
    assert (refusal.verdict, refusal.code) == (NOT_NOW, "gpus_unusable")
    assert "0: MIG mode is on but no instances are carved" in refusal.message
    assert "needs 1 usable GPUs, 0 usable now" in refusal.message


def test_a_card_whose_mig_mode_change_is_pending_is_never_chosen():
    pending = card(1, placeable=False, reason="a MIG mode change is pending: reset the GPU")
    result = place(GPU_MODEL.build(), fleet(with_gpus("n", pending, card(2))), [])
    assert result.choice is not None and result.choice.gpus == (2,)
    refusal = only_refusal(place(GPU_MODEL.build(), fleet(with_gpus("n", pending, card(2))), [on("n", 2)]))
    # The pending card is neither used nor free: one usable GPU, and it is busy.
    assert (refusal.code, refusal.message) == ("gpus_busy", "needs 1 free GPUs, 0 free")


def test_the_mig_parent_card_is_never_placed_its_instances_are():
    node_ = with_gpus("m", card(0, placeable=False, reason=MIG_ON), instance(0, 0), instance(0, 1))
    whole = model("big").vllm().gpus(1).classes("a100-80g").build()
    refusal = only_refusal(place(whole, fleet(node_), []))
    assert refusal.code == "gpus_unusable" and MIG_ON in refusal.message
    any_device = place(GPU_MODEL.build(), fleet(node_), [])
    assert any_device.choice is not None and any_device.choice.gpus == (1000,)


def test_one_mig_instance_per_replica():
    node_ = with_gpus("m", card(0, placeable=False, reason=MIG_ON), instance(0, 0), instance(0, 1))
    m = model("small").vllm().gpus(1).classes("a100-80g-mig-3g.40gb").build()
    placements: list[Placement] = []
    for n in range(2):
        choice = place(m, fleet(node_), placements).choice
        assert choice is not None and len(choice.gpus) == 1
        placements.append(Placement(f"small-r{n}", "small", "m", choice.gpus, "h", 0))
    assert [p.gpus for p in placements] == [(1000,), (1001,)]
    assert only_refusal(place(m, fleet(node_), placements)).code == "gpus_busy"


def test_tensor_or_pipeline_parallel_on_a_mig_class_is_refused_here_too():
    # Validation refuses it; a definition built around validation is refused by placement as well.
    base = model("big").vllm().gpus(1).classes("a100-80g-mig-3g.40gb").build()
    node_ = with_gpus("m", instance(0, 0), instance(0, 1))
    for profile in (replace(base.profile, tp=2, gpus=2), replace(base.profile, pp=2, nodes=2, gpus=1)):
        refusal = only_refusal(place(replace(base, profile=profile), fleet(node_), []))
        assert (refusal.verdict, refusal.code) == (NEVER, "mig_single")


def test_unhealthy_reason_reaches_the_refusal():
    sick = card(0, healthy=False, reason="uncorrectable ECC errors (volatile: 2)")
    refusal = only_refusal(place(GPU_MODEL.build(), fleet(with_gpus("n", sick)), []))
    assert refusal.code == "gpus_unhealthy" and "0: uncorrectable ECC errors (volatile: 2)" in refusal.message


def test_a_mig_instance_is_placed_like_a_gpu():
    mig = node("m").mig(0, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40)).engines("vllm")
    m = model("big").vllm().gpus(1).classes("a100-80g-mig-3g.40gb").build()
    choice = place(m, fleet(mig), []).choice
    assert choice is not None and (choice.node, choice.gpus) == ("m", (1000,))


# --- reasons -----------------------------------------------------------------------


def test_reason_groups_nodes_that_share_a_refusal():
    m = model("big").vllm().gpus(2, tp=2).build()
    nodes = fleet(cpu_node("c1", "vllm"), cpu_node("c2", "vllm"), node("g").gpus(1).engines("vllm"),
                  cpu_node("z", "sim"))
    result = place(m, nodes, [])
    assert result.choice is None and len(result.refusals) == 4
    # One clause per distinct message, in the message's order, each naming its nodes sorted.
    # Hardware is judged before engines: z can never run it, whatever it installs.
    assert result.reason() == (
        "no node fits — "
        "g: needs 2 GPUs, node has 1 that fit; "
        "c1, c2, z: node has no GPU and the model's profile does not allow CPU"
    )


def test_reason_with_no_agents_and_with_a_choice():
    assert place(model("demo").build(), {}, []).reason() == "no agent is connected"
    assert place(model("demo").build(), fleet(cpu_node()), []).reason() == ""


def test_refusals_are_kept_beside_a_choice():
    nodes = fleet(cpu_node("a", "llama.cpp"), cpu_node("b", "sim"))
    result = place(model("demo").build(), nodes, [])
    assert result.choice is not None and result.choice.node == "b"
    assert [r.node for r in result.refusals] == ["a"]


# --- determinism ---------------------------------------------------------------------


def test_same_input_same_answer_whatever_the_order():
    infos = [node(n).gpus(8).engines("vllm").build() for n in "dcba"]
    placements = [on("c", 0), on("a", 0), on("b", 1)]
    forward = place(GPU_MODEL.build(), {i.node: i for i in infos}, placements)
    backward = place(GPU_MODEL.build(), {i.node: i for i in reversed(infos)}, list(reversed(placements)))
    assert forward == backward
    assert forward.choice is not None and forward.choice.node == "a", "ties go to the first name"


# --- properties ------------------------------------------------------------------------

CLASSES = ["h100-80g", "a100-40g", "l4-24g"]
MEMORY = {"h100-80g": 80, "a100-40g": 40, "l4-24g": 24}


@st.composite
def gpu_nodes(draw: st.DrawFn, name: str) -> NodeInfo:
    """Whole cards, some unhealthy or not placeable (a pending MIG mode change), and MIG cards
    listed as an unplaceable parent plus their instances (some unhealthy)."""
    count = draw(st.integers(0, 8))
    gpus = []
    for index in range(count):
        cls = draw(st.sampled_from(CLASSES))
        healthy = draw(st.integers(0, 3)) > 0
        placeable = draw(st.integers(0, 5)) > 0
        if draw(st.integers(0, 4)) == 0:  # a card in MIG mode: its instances are the devices
            gpus.append(Gpu(index, f"GPU-{name}-{index}", cls, cls, MEMORY[cls] * GIB, 0, healthy,
                            "MIG mode is on", False))
            for n in range(draw(st.integers(0, 3))):
                mig = f"{cls}-mig-1g.10gb"
                gpus.append(Gpu(1000 + 100 * index + n, f"MIG-{name}-{index}-{n}", mig, mig, 10 * GIB, 0,
                                draw(st.integers(0, 5)) > 0, mig_profile="1g.10gb", parent_index=index))
            continue
        gpus.append(Gpu(index, f"GPU-{name}-{index}", cls, cls, MEMORY[cls] * GIB, 0, healthy,
                        "" if placeable else "a MIG mode change is pending", placeable))
    engines = draw(st.lists(st.sampled_from(["vllm", "llama.cpp", "sim"]), unique=True, min_size=1))
    return NodeInfo(name, gpus=tuple(gpus), engines=tuple(engines))


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, NodeInfo]:
    names = draw(st.lists(st.sampled_from(["n1", "n2", "n3", "n4", "n5"]), unique=True, min_size=0, max_size=4))
    return {n: draw(gpu_nodes(n)) for n in names}


@st.composite
def gpu_models(draw: st.DrawFn, name: str = "m") -> ModelDef:
    b = model(name)
    if draw(st.booleans()):
        b = b.vllm()
    else:
        b = b.llamacpp()
    gpus = draw(st.sampled_from([1, 1, 2, 4]))
    b = b.gpus(gpus)
    if draw(st.booleans()):
        b = b.classes(*draw(st.lists(st.sampled_from(CLASSES), min_size=1, max_size=2, unique=True)))
    elif gpus == 1 and draw(st.integers(0, 3)) == 0:
        b = b.classes(draw(st.sampled_from(CLASSES)) + "-mig-1g.10gb")
    if draw(st.booleans()):
        b = b.memory(draw(st.sampled_from([10, 30, 50, 70, 100, 200])) * gpus / 2)
    if draw(st.integers(0, 9)) == 0:
        b = b.cpu()
    return b.build()


@st.composite
def existing_placements(draw: st.DrawFn, nodes: Mapping[str, NodeInfo]) -> list[Placement]:
    """Other models' placements that never overlap (the reconciler's invariant)."""
    out = []
    for name, info in sorted(nodes.items()):
        usable = [g.index for g in info.gpus if g.usable]
        taken = draw(st.lists(st.sampled_from(usable), unique=True)) if usable else []
        for n, index in enumerate(taken):
            out.append(Placement(f"other-r{name}{n}", "other", name, (index,), "h", 0))
    return out


def oracle_fits(m: ModelDef, info: NodeInfo, used: set[int]) -> bool:
    """Brute force: does any set of devices on this node satisfy every filter?"""
    prof = m.profile
    if m.engine not in info.engines:
        return False
    if prof.cpu:
        return True
    if prof.nodes > 1:
        return False
    need = prof.memory_gib * GIB / prof.gpus
    share = 0.9 if m.engine == "vllm" else 1.0  # vLLM takes 90% of each GPU
    for combo in itertools.combinations(info.gpus, prof.gpus):
        if all(
            g.healthy
            and g.placeable
            and (prof.gpus == 1 or "-mig-" not in g.gpu_class)
            and g.index not in used
            and (not prof.classes or g.gpu_class in prof.classes)
            and g.memory_total * share >= need
            for g in combo
        ):
            return True
    return False


def check_choice(m: ModelDef, info: NodeInfo, used: set[int], choice: Choice) -> None:
    prof = m.profile
    assert m.engine in info.engines
    if prof.cpu:
        assert choice.gpus == ()
        return
    assert len(choice.gpus) == prof.gpus, "never more (or fewer) GPUs than requested"
    assert len(set(choice.gpus)) == len(choice.gpus)
    by_index = {g.index: g for g in info.gpus}
    for index in choice.gpus:
        g = by_index[index]
        assert g.healthy, "never an unhealthy GPU"
        assert g.placeable, "never a device that is not placeable (a MIG parent, a pending mode change)"
        assert prof.gpus == 1 or "-mig-" not in g.gpu_class, "one MIG instance per replica, never more"
        assert index not in used, "never a GPU twice on a node"
        assert not prof.classes or g.gpu_class in prof.classes
        assert g.memory_total * (0.9 if m.engine == "vllm" else 1.0) >= prof.memory_gib * GIB / prof.gpus


def used_by_node(placements: Iterable[Placement]) -> dict[str, set[int]]:
    used: dict[str, set[int]] = {}
    for p in placements:
        used.setdefault(p.node, set()).update(p.gpus)
    return used


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_placing_one_by_one_never_over_commits(data: Any):
    nodes = data.draw(fleets())
    m = data.draw(gpu_models())
    placements = data.draw(existing_placements(nodes))
    for n in range(12):
        result = place(m, nodes, placements)
        if result.choice is None:
            break
        used = used_by_node(placements).get(result.choice.node, set())
        check_choice(m, nodes[result.choice.node], used, result.choice)
        placements.append(Placement(f"m-r{n}", m.name, result.choice.node, result.choice.gpus, "h", n))
    seen: set[tuple[str, int]] = set()
    for p in placements:
        for index in p.gpus:
            assert (p.node, index) not in seen
            seen.add((p.node, index))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_choice_exists_iff_some_node_passes_every_filter(data: Any):
    nodes = data.draw(fleets())
    m = data.draw(gpu_models())
    placements = data.draw(existing_placements(nodes))
    used = used_by_node(placements)
    result = place(m, nodes, placements)
    feasible = {name for name, info in nodes.items() if oracle_fits(m, info, used.get(name, set()))}
    assert (result.choice is not None) == bool(feasible)
    if result.choice is not None:
        assert result.choice.node in feasible
        check_choice(m, nodes[result.choice.node], used.get(result.choice.node, set()), result.choice)
    # Every node is either chosen-able or refused with a named reason, never both, never neither.
    refused = {r.node for r in result.refusals}
    assert refused == set(nodes) - feasible
    for r in result.refusals:
        assert r.verdict in (NOT_NOW, NEVER) and r.code and r.message
    assert (result.reason() == "") == (result.choice is not None)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_never_verdicts_do_not_depend_on_other_placements(data: Any):
    """NEVER means the node cannot run it as defined: freeing every GPU must not change that."""
    nodes = data.draw(fleets())
    m = data.draw(gpu_models())
    placements = data.draw(existing_placements(nodes))
    busy = {r.node: r for r in place(m, nodes, placements).refusals}
    idle = {r.node: r for r in place(m, nodes, []).refusals}
    for name, r in busy.items():
        if r.verdict == NEVER:
            assert idle.get(name) == r
    for name, r in idle.items():
        assert busy.get(name) == r, "a node refused while idle is refused the same way while busy"


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_placement_is_deterministic(data: Any):
    nodes = data.draw(fleets())
    m = data.draw(gpu_models())
    placements = data.draw(existing_placements(nodes))
    shuffled = data.draw(st.permutations(placements))
    reordered = dict(reversed(list(nodes.items())))
    assert place(m, nodes, placements) == place(m, reordered, shuffled)
