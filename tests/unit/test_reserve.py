"""S2 per-node budgets (issue 25, point 3): `llmgw agent --reserve` parsed and checked, placement never
using what a node keeps for other work (by example and a property), and capacity counting it apart."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.agent.service import AgentConfig, _observe_once, serve
from llmgw.agent.storage import StorageScanner
from llmgw.cli.ctl.nodes import render_nodes
from llmgw.cli.roles import agent
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo, Observed
from llmgw.domain.reserve import Reserve, parse_reserve
from llmgw.domain.state import ClusterState, Placement
from llmgw.domain.summary import gpu_counts, node_rows
from llmgw.domain.summary_fleet import capacity, fabrics, used_devices
from llmgw.placement import NEVER, NOT_NOW, REASONS, FleetView, place
from llmgw.startup import CannotStart
from llmgw.testing import FakeGpuProbe
from llmgw.testing.builders import GIB, cpu_node, fleet, model, node


def reserved(info: NodeInfo, gpus: tuple[int, ...] = (), memory_gib: float = 0, vram_gib: float = 0) -> NodeInfo:
    return replace(info, reserved_gpus=gpus, reserved_memory=int(memory_gib * GIB), reserved_vram=int(vram_gib * GIB))


# --- the flag ------------------------------------------------------------------------------------------------


def test_reserve_flags_parse_into_devices_and_bytes():
    r = parse_reserve(["gpu=0,1", "memory_gib=16", "vram_gib=8", "gpu=1, 3"])
    assert r == Reserve(("0", "1", "3"), 16 * GIB, 8 * GIB)
    assert parse_reserve(["vram_gib=0.5"]).vram == GIB // 2
    assert not parse_reserve([])


@pytest.mark.parametrize("flag, words", [
    ("gpu", "expected KEY=VALUE with KEY one of gpu, memory_gib, vram_gib"),
    ("cpus=4", "expected KEY=VALUE with KEY one of gpu, memory_gib, vram_gib"),
    ("gpu=", "expected KEY=VALUE"),
    ("gpu=0,,1", "an empty device in the list"),
    ("memory_gib=lots", "memory_gib must be a positive number of GiB"),
    ("vram_gib=-2", "vram_gib must be a positive number of GiB"),
    ("vram_gib=nan", "vram_gib must be a positive number of GiB"),
])
def test_a_malformed_reserve_is_refused_with_the_syntax(flag: str, words: str):
    with pytest.raises(ValueError, match=words):
        parse_reserve([flag])


def test_a_size_given_twice_is_refused():
    with pytest.raises(ValueError, match="memory_gib is given twice"):
        parse_reserve(["memory_gib=4", "memory_gib=8"])


def test_the_agent_refuses_a_malformed_reserve_before_touching_its_state_dir(tmp_path: Path):
    state = tmp_path / "agent"
    with pytest.raises(SystemExit, match=r"^error: --reserve 'memory_gib=x'") as e:
        agent(control=["https://127.0.0.1:1"], state_dir=state, node="n1", reserve=["memory_gib=x"])
    assert "memory_gib must be a positive number of GiB" in str(e.value)
    assert not state.exists()


def test_a_reserve_is_checked_against_the_node():
    info = node("n").gpus(4).memory_gib(64).build()
    Reserve(("0", "3", "GPU-n-2")).check(info)
    with pytest.raises(ValueError, match=r"gpu=7: no such GPU on this node \(its GPUs: 0, 1, 2, 3\)"):
        Reserve(("7",)).check(info)
    with pytest.raises(ValueError, match="the node has 64 GiB of memory; a reserve must leave some"):
        Reserve(memory=64 * GIB).check(info)
    with pytest.raises(ValueError, match="the largest GPU here has 80 GiB"):
        Reserve(vram=80 * GIB).check(info)
    with pytest.raises(ValueError, match="this node has no GPU"):
        Reserve(vram=GIB).check(cpu_node("c"))


def test_the_inventory_carries_the_reserve_and_a_mig_card_reserves_its_instances():
    info = node("n").gpus(2).build()
    card = replace(info.gpus[1], placeable=False)
    mig = [replace(info.gpus[1], index=1100 + i, uuid=f"MIG-{i}", parent_index=1) for i in range(2)]
    info = replace(info, gpus=(info.gpus[0], card, *mig))
    out = Reserve(("1", "gone"), 2 * GIB, GIB).apply(info)
    assert (out.reserved_gpus, out.reserved_memory, out.reserved_vram) == ((1, 1100, 1101), 2 * GIB, GIB)
    assert NodeInfo.from_doc(out.to_doc()) == out  # over the stream as it is


async def test_an_agent_whose_reserve_names_a_missing_gpu_cannot_start(tmp_path: Path):
    probe = FakeGpuProbe(node("n").gpus(2).build())
    config = AgentConfig(controls=["https://127.0.0.1:1"], tls=None, state_dir=tmp_path, node="n", probe=probe,
                         reserve=Reserve(("5",)))
    with pytest.raises(CannotStart, match=r"--reserve gpu=5: no such GPU on this node \(its GPUs: 0, 1\)"):
        with trio.fail_after(30):
            await serve(config)


async def test_the_agent_reports_its_reserve_with_every_inventory(tmp_path: Path):
    probe = FakeGpuProbe(node("n").gpus(2).build())
    config = AgentConfig(controls=["https://127.0.0.1:1"], tls=None, state_dir=tmp_path, node="n", probe=probe,
                         reserve=parse_reserve(["gpu=GPU-n-1", "vram_gib=4"]))
    info = await _observe_once(config, StorageScanner(()))
    assert (info.reserved_gpus, info.reserved_memory, info.reserved_vram) == ((1,), 0, 4 * GIB)


# --- placement -----------------------------------------------------------------------------------------------


ONE_GPU = model("m").vllm("/srv/m").gpus(1).memory(40).build()


def test_placement_never_takes_a_reserved_gpu():
    n = reserved(node("a").gpus(4).engines("vllm").build(), gpus=(0, 1))
    r = place(ONE_GPU, fleet(n), [])
    assert r.choice is not None and r.choice.gpus == (2,)
    taken = [Placement("x", "m", "a", (2,), "h", 0), Placement("y", "m", "a", (3,), "h", 0)]
    r = place(ONE_GPU, fleet(n), taken, models={"m": ONE_GPU})
    assert r.choice is None
    assert [(x.code, x.verdict) for x in r.refusals] == [("gpus_busy", NOT_NOW)]  # the rest is busy, not free


def test_a_model_that_fits_only_in_reserved_devices_says_so():
    n = reserved(node("a").gpus(2).engines("vllm").build(), gpus=(0, 1))
    two = model("big").vllm("/srv/b").gpus(2).build()
    (refusal,) = place(two, fleet(n), []).refusals
    assert (refusal.verdict, refusal.code) == (NEVER, "reserved")
    assert refusal.message == "needs 2 GPUs: 0 fit outside what is reserved for other work (GPUs 0, 1)"
    assert "reserved for other work" in place(two, fleet(n), []).reason()


def test_reserved_gpu_memory_shrinks_each_gpu():
    n = node("a").gpus(2).engines("vllm").build()
    m = model("m").vllm("/srv/m").gpus(1).memory(76).build()  # vLLM's 90% of 80 GiB is 72: no
    big = model("b").llamacpp().gpus(1).memory(76).build()
    nodes = fleet(reserved(replace(n, engines=("vllm", "llama.cpp")), vram_gib=8))
    (refusal,) = place(big, nodes, []).refusals
    assert (refusal.code, refusal.message) == ("reserved", "needs 1 GPU of 76 GiB: 0 fit outside what is reserved "
                                               "for other work (8 GiB of each GPU)")
    assert place(big, fleet(replace(n, engines=("llama.cpp",))), []).choice is not None  # without the reserve
    assert place(m, nodes, []).refusals[0].code == "memory"  # hardware first: too big for the card whatever
    small = model("f").vllm("/srv/f").gpus(1).memory(10).build()  # vLLM takes its 72 GiB share whatever it needs
    (refusal,) = place(small, fleet(reserved(n, vram_gib=12)), []).refusals  # 72 > 80 - 12: it would take the reserve
    assert (refusal.code, refusal.message) == ("reserved", "needs 1 GPU of 10 GiB: 0 fit outside what is reserved "
                                               "for other work (12 GiB of each GPU; vllm takes 90% of a GPU, lower "
                                               "its --gpu-memory-utilization)")
    assert place(small, fleet(reserved(n, vram_gib=8)), []).choice is not None  # 72 <= 80 - 8


def test_cpu_replicas_share_the_memory_left_by_the_reserve():
    m = model("small").llamacpp().cpu().memory(24).build()
    n = reserved(cpu_node("c", "llama.cpp"), memory_gib=48)  # 64 GiB, 16 left
    (refusal,) = place(m, fleet(n), []).refusals
    assert (refusal.verdict, refusal.code) == (NEVER, "reserved")
    assert refusal.message == "needs 24 GiB of memory: the node has 64 GiB, of which 48 GiB are reserved for other work"
    n = reserved(cpu_node("c", "llama.cpp"), memory_gib=16)  # 48 left: one fits, not two
    mine = [Placement("small-r1", "small", "c", (), "h", 0)]
    assert place(m, fleet(n), mine, models={"small": m}).choice is not None
    mine.append(Placement("small-r2", "small", "c", (), "h", 0))
    (refusal,) = place(m, fleet(n), mine, models={"small": m}).refusals
    assert refusal.code == "cpu_memory_busy"
    assert refusal.message == ("needs 24 GiB of memory, 0 GiB free of 48 (CPU replicas here take 48 GiB; "
                               "16 GiB more are reserved for other work)")


def group_model(gpus: int) -> ModelDef:
    doc = model(f"g{gpus}").vllm().doc()
    return ModelDef.from_doc({**doc, "profile": {"nodes": 2, "gpus": gpus, "tp": gpus * 2}})


def test_a_multi_node_replica_counts_only_unreserved_gpus():
    nodes = fleet(*(replace(reserved(node(f"n{i}").gpus(4).engines("vllm").fabric("ib").build(), gpus=(0,)),
                            address=f"10.0.0.{i + 1}") for i in range(2)))
    r = place(group_model(4), nodes, [])
    assert r.choice is None and {x.code for x in r.refusals} == {"reserved"}
    r = place(group_model(2), nodes, [])
    assert r.choice is not None and all(0 not in m.gpus for m in r.choice.members)


def test_the_reserved_code_is_in_the_reasons_table():
    assert REASONS["reserved"][0] == NEVER


GPU_COUNTS = st.integers(1, 4)


@st.composite
def reserved_nodes(draw: st.DrawFn) -> dict[str, NodeInfo]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        b = node(f"n{i}").engines("vllm", "llama.cpp").memory_gib(draw(st.sampled_from([32, 64, 128])))
        b.gpus(draw(st.integers(0, 4)), memory_gib=draw(st.sampled_from([24, 48, 80])))
        info = b.build()
        kept = tuple(g.index for g in info.gpus if draw(st.booleans()))
        out.append(reserved(info, kept, draw(st.sampled_from([0, 8, 30])),
                            draw(st.sampled_from([0, 4, 20])) if info.gpus else 0))
    return fleet(*out)


MODELS = st.one_of(
    st.builds(lambda g, m: model("v").vllm("/srv/v").gpus(g).memory(m).build(), GPU_COUNTS,
              st.sampled_from([8, 30, 60, 120])),
    st.builds(lambda g, m: model("l").llamacpp().gpus(g).memory(m).build(), GPU_COUNTS,
              st.sampled_from([8, 30, 60, 120])),
    st.builds(lambda m: model("c").llamacpp().cpu().memory(m).build(), st.sampled_from([4, 12, 40])),
)


@settings(max_examples=60, deadline=None)
@given(reserved_nodes(), st.lists(MODELS, min_size=1, max_size=8))
def test_no_placement_ever_uses_what_is_reserved(nodes: dict[str, NodeInfo], wanted: list):  # type: ignore[type-arg]
    named = [replace(m, name=f"{m.name}{i}") for i, m in enumerate(wanted)]
    view = FleetView(nodes, [], {m.name: m for m in named})
    cpu_used: dict[str, int] = {}
    for i, m in enumerate(named):
        for _ in range(3):
            result = view.place(m)
            if result.choice is None:
                assert result.refusals or not nodes
                break
            info = nodes[result.choice.node]
            need = view.need(m)
            for index in result.choice.gpus:
                gpu = next(g for g in info.gpus if g.index == index)
                assert not info.reserved(gpu)
                if need.per_device is not None:
                    assert need.per_device <= gpu.memory_total - info.reserved_vram
                if need.share is not None:  # vLLM's share, taken whatever it needs, stays out of the reserve
                    assert int(gpu.memory_total * need.share) <= gpu.memory_total - info.reserved_vram
            if not result.choice.gpus and need.total is not None:
                cpu_used[info.node] = cpu_used.get(info.node, 0) + need.total
                assert cpu_used[info.node] <= info.memory_total - info.reserved_memory
            view.take(m, result.choice, f"{m.name}-r{_}")


# --- capacity ------------------------------------------------------------------------------------------------


def test_capacity_counts_reserved_devices_apart():
    a = reserved(node("a").gpus(4).fabric("ib").build(), gpus=(0, 1))
    b = node("b").gpus(2).unhealthy(1).fabric("ib").build()
    observed = Observed(nodes={"a": a, "b": b})
    placements = [Placement("x", "m", "a", (2,), "h", 0), Placement("old", "m", "a", (1,), "h", 0)]
    used, grouped = used_devices(placements)
    (row,) = capacity(observed, used)
    # a: 1 reserved, 1 reserved but still held (used), 1 used, 1 free; b: 1 free, 1 unusable.
    assert (row.used, row.free, row.unusable, row.reserved, row.total) == (2, 2, 1, 1, 6)
    assert row.to_doc()["reserved"] == 1
    counts = gpu_counts(a.gpus, used["a"], set(a.reserved_gpus))
    assert (counts.used, counts.free, counts.reserved) == (2, 1, ("0",))
    (fab,) = fabrics(observed, used, grouped)
    assert (fab.gpus_used, fab.gpus_free) == (2, 2)


def test_ctl_nodes_says_what_a_node_keeps_for_other_work():
    info = reserved(node("a").gpus(4).build(), gpus=(0, 1), memory_gib=16, vram_gib=8)
    row = node_rows(ClusterState(), Observed(nodes={"a": info}))[0].to_doc()
    assert (row["reserved_memory"], row["reserved_vram"]) == (16 * GIB, 8 * GIB)
    text = render_nodes({"nodes": [row]})
    assert "a: reserved for other work (--reserve): GPU 0, 1; 16.0 GiB of memory; 8.0 GiB of each GPU" in text
    plain = node_rows(ClusterState(), Observed(nodes={"a": node("a").gpus(4).build()}))[0].to_doc()
    assert "reserved for other work" not in render_nodes({"nodes": [plain]})
