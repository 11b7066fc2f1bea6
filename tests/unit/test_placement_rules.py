"""S2, S9 placement rules beyond devices: storage as a preference (the notes' three distinctions),
memory from the estimate and "short by", CPU memory, nodes not ready, sim models on GPUs, the
reason and weight tables in docs/placement.md."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement import FITS, NEVER, NOT_NOW, REASONS, WEIGHTS, FleetView, place
from llmgw.testing.builders import GIB, cpu_node, fleet, model, node

DOCS = Path(__file__).resolve().parents[2] / "docs" / "placement.md"
MIB = 1 << 20


def with_storage(info: NodeInfo, *reports: dict[str, Any]) -> NodeInfo:
    return replace(info, storage=tuple(reports))


def report(path: str, fabric: str, *models: str, shared: bool = False, not_weights: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"path": path, "fabric": fabric, "shared": shared, "error": "",
            "models": [{"name": m.rsplit("/", 1)[-1], "path": m, "kind": "safetensors", "size": 1} for m in models],
            "not_weights": [{"path": p, "reason": "partial download (.part file)"} for p in not_weights]}


def gpu(name: str, fabric: str = "ib-a", count: int = 8) -> NodeInfo:
    return node(name).gpus(count).engines("vllm").fabric(fabric).build()


QWEN = model("qwen").vllm("/srv/models/qwen").gpus(1).build()


def scores(m: ModelDef, nodes: dict[str, NodeInfo], placements: list[Placement] | None = None) -> dict[str, float]:
    return {v.node: v.score.total for v in FleetView(nodes, placements or []).verdicts(m) if v.score is not None}


# --- storage: a preference, never a filter -------------------------------------------


def test_a_node_holding_the_weights_is_preferred_over_an_emptier_one():
    holder = with_storage(gpu("z"), report("/srv/models", "ib-a", "/srv/models/qwen"))
    nodes = fleet(gpu("a"), holder)
    # Without storage, "a" would win the tie by name.
    assert place(QWEN, nodes, []).choice.node == "z"  # type: ignore[union-attr]
    assert scores(QWEN, nodes) == {"a": 52.5, "z": 82.5}  # spread 50 + pack 1/8 × 20 (+ weights 30)


def test_storage_is_never_a_filter():
    holder = with_storage(cpu_node("z", "vllm"), report("/srv/models", "ib-a", "/srv/models/qwen"))
    result = place(QWEN, fleet(gpu("a"), holder), [])
    assert result.choice is not None and result.choice.node == "a"  # z holds it but has no GPU


def test_a_node_never_asked_to_look_ranks_with_one_that_looked_and_found_nothing():
    asked = with_storage(gpu("b"), report("/srv/models", "ib-a"))  # looked: nothing there
    never = gpu("a")  # told nothing: reports nothing
    assert asked.storage and not never.storage
    s = scores(QWEN, fleet(never, asked))
    assert s["a"] == s["b"]
    # And enabling storage on one node drains no other: "a" still wins the tie by name.
    assert place(QWEN, fleet(never, asked), []).choice.node == "a"  # type: ignore[union-attr]


def test_an_empty_or_half_written_directory_is_not_weights():
    half = with_storage(gpu("z"), report("/srv/models", "ib-a", not_weights=("/srv/models/qwen",
                                                                             "/srv/models/qwen/model.safetensors.part")))
    s = scores(QWEN, fleet(gpu("a"), half))
    assert s["a"] == s["z"], "not_weights entries never count as holding the model"


def test_local_storage_is_never_read_as_shared():
    local = with_storage(gpu("a"), report("/srv/models", "ib-a", "/srv/models/qwen"))
    s = scores(QWEN, fleet(local, gpu("b"), gpu("c")))
    assert s["a"] > s["b"] == s["c"], "a local copy counts for its own node only"


def test_a_shared_filer_counts_for_every_node_of_its_fabric_only():
    filer = with_storage(gpu("a"), report("/filer", "ib-a", "/filer/qwen", shared=True))
    m = model("qwen").vllm("/filer/qwen").gpus(1).build()
    s = scores(m, fleet(filer, gpu("b"), gpu("c", fabric="ib-b")))
    assert s["a"] == s["b"] > s["c"], "one filer counts once per fabric, for every node on it"


def test_a_source_matches_weights_at_or_under_it_and_named_sources_by_name():
    split = report("/srv", "ib-a", "/srv/big/big-00001-of-00002.gguf")
    nodes = fleet(gpu("a"), with_storage(gpu("z"), split))
    under = model("big").vllm("/srv/big").gpus(1).build()
    elsewhere = model("big").vllm("/srv/bigger").gpus(1).build()
    assert place(under, nodes, []).choice.node == "z"  # type: ignore[union-attr]
    assert place(elsewhere, nodes, []).choice.node == "a"  # type: ignore[union-attr]
    hf = with_storage(gpu("z"), report("/hf", "ib-a", "/hf/models--org--repo/snapshots/abc"))
    hf = replace(hf, storage=({**hf.storage[0], "models": [{"name": "org/repo", "path": "/hf/x", "kind": "safetensors",
                                                              "size": 1}]},))
    assert place(model("r").vllm("hf://org/repo").gpus(1).build(), fleet(gpu("a"), hf), []).choice.node == "z"  # type: ignore[union-attr]


def test_spread_outranks_storage_and_storage_outranks_packing():
    holder = with_storage(gpu("a"), report("/srv/models", "ib-a", "/srv/models/qwen"))
    nodes = fleet(holder, gpu("b"))
    second = place(QWEN, nodes, [Placement("qwen-r1", "qwen", "a", (0,), "h", 0)])
    assert second.choice is not None and second.choice.node == "b", "a second replica goes where none runs"
    fuller = place(QWEN, nodes, [Placement("o-r1", "other", "b", (0, 1, 2, 3, 4, 5), "h", 0)])
    assert fuller.choice is not None and fuller.choice.node == "a", "the weights beat a fuller node"


# --- memory ------------------------------------------------------------------------------


def test_a_model_that_fits_nowhere_says_by_how_much():
    h100 = node("a").gpus(2, memory_gib=81559 / 1024).engines("llama.cpp").build()  # 79.6 GiB as NVML says
    m = model("huge").llamacpp().gpus(1).memory(90).build()
    result = place(m, fleet(h100), [])
    assert result.choice is None
    assert result.short_by == "needs 90 GiB per GPU; the largest GPU has 79.6 GiB (short by 10.4 GiB)"
    assert result.reason().startswith(result.short_by + " — a: ")
    (r,) = result.refusals
    assert (r.verdict, r.code) == (NEVER, "memory")
    assert r.numbers == {"need_bytes": 90 * GIB, "largest_bytes": 81559 * MIB}


def test_short_by_is_said_only_when_nothing_could_ever_fit():
    m = model("huge").llamacpp().gpus(1).memory(90).build()
    big = node("b").gpus(1, "h200-141g", memory_gib=141).engines("llama.cpp").build()
    small = node("a").gpus(1, memory_gib=80).engines("llama.cpp").build()
    busy = place(m, fleet(small, big), [Placement("o-r1", "other", "b", (0,), "h", 0)])
    assert busy.choice is None and busy.short_by == "", "b fits once its GPU frees: not 'fits nowhere'"
    assert busy.reason().startswith("no node fits — ")


def test_vllm_is_sized_against_the_share_of_each_gpu_it_takes():
    m = model("v").vllm().gpus(1).memory(75).build()  # 75 GiB: under 80, over vLLM's 90% of 80
    r = place(m, fleet(node("a").gpus(1, memory_gib=80).engines("vllm")), [])
    assert r.choice is None and r.refusals[0].code == "memory"
    assert "72 GiB" in r.refusals[0].message and "90%" in r.refusals[0].message
    assert place(model("l").llamacpp().gpus(1).memory(75).build(), fleet(node("a").gpus(1).engines("llama.cpp")),
                 []).choice is not None


def test_cpu_replicas_share_a_node_memory_by_their_estimates():
    m = model("small").llamacpp().cpu().memory(24).build()
    n = cpu_node("c", "llama.cpp")  # 64 GiB
    mine = [Placement(f"small-r{i}", "small", "c", (), "h", 0) for i in (1, 2)]
    r = place(m, fleet(n), mine, models={"small": m})
    assert r.choice is None
    (refusal,) = r.refusals
    assert (refusal.verdict, refusal.code) == (NOT_NOW, "cpu_memory_busy")
    assert refusal.message == "needs 24 GiB of memory, 16 GiB free of 64 (CPU replicas here take 48 GiB)"
    # A placed replica of unknown size is not guessed at, but said.
    unknown = [Placement("x-r1", "mystery", "c", (), "h", 0)]
    r = place(m, fleet(n), [*mine[:1], *unknown], models={"small": m})
    assert r.choice is not None
    r = place(m, fleet(n), [*mine, *unknown], models={"small": m})
    assert "and 1 of unknown size" in r.refusals[0].message


# --- nodes not ready, sim models with GPUs ---------------------------------------------------


def test_a_node_whose_gpu_discovery_failed_waits_for_gpu_replicas_but_runs_cpu_ones():
    broken = replace(cpu_node("n", "vllm", "llama.cpp"), probe="none",
                     warnings=("no GPU discovery worked: NVML: driver not loaded; nvidia-smi failed",))
    r = place(model("g").vllm().gpus(1).build(), fleet(broken), [])
    (refusal,) = r.refusals
    assert (refusal.verdict, refusal.code) == (NOT_NOW, "node_not_ready")
    assert "driver not loaded" in refusal.message
    assert place(model("c").llamacpp().cpu().build(), fleet(broken), []).choice is not None
    plain = replace(cpu_node("m", "vllm"), probe="none")  # a CPU node: no GPU, no warning
    assert place(model("g").vllm().gpus(1).build(), fleet(plain), []).refusals[0].code == "no_gpu"


def test_a_sim_model_with_a_gpu_profile_takes_gpus_like_a_real_one():
    m = model("s").sim().gpus(2).build()
    assert not m.profile.cpu
    r = place(m, fleet(node("g").gpus(4).engines("sim"), cpu_node("c", "sim")), [])
    assert r.choice is not None and (r.choice.node, r.choice.gpus) == ("g", (0, 1))
    assert [(x.node, x.code) for x in r.refusals] == [("c", "no_gpu")]
    mig = model("s").sim().gpus(1).classes("a100-80g-mig-3g.40gb").build()
    n = node("m").mig(0, "a100-80g", ("3g.40gb", 40)).engines("sim")
    assert place(mig, fleet(n), []).choice.gpus == (1000,)  # type: ignore[union-attr]
    assert place(model("s").sim().build(), fleet(node("g").gpus(4).engines("sim")), []).choice.gpus == ()  # type: ignore[union-attr]


# --- reasons and docs ------------------------------------------------------------------------


def test_every_refusal_code_is_in_the_docs_table_with_its_verdict():
    text = DOCS.read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (never|not now) \|", text, re.M))
    assert rows == {code: ("never" if v == NEVER else "not now") for code, (v, _) in REASONS.items()}


def test_the_docs_weights_table_is_the_code_s():
    text = DOCS.read_text(encoding="utf-8")
    rows = {k: float(v) for k, v in re.findall(r"^\| (spread|weights|pack) \| ([0-9.]+) \|", text, re.M)}
    assert rows == WEIGHTS and abs(sum(WEIGHTS.values()) - 1.0) < 1e-9


def test_a_reason_names_a_few_nodes_and_counts_the_rest():
    nodes = fleet(*(cpu_node(f"n{i:02d}", "vllm") for i in range(40)))
    reason = place(model("g").vllm().gpus(1).build(), nodes, []).reason()
    assert reason == ("no node fits — n00, n01, n02, n03, n04, n05 and 34 more: "
                      "node has no GPU and the model's profile does not allow CPU")


def test_verdicts_say_fits_with_a_score_or_why_not():
    nodes = fleet(gpu("a"), cpu_node("c", "vllm"))
    by_node = {v.node: v for v in FleetView(nodes).verdicts(QWEN)}
    assert by_node["a"].verdict == FITS and by_node["a"].score is not None and by_node["a"].gpus == (0,)
    assert (by_node["c"].verdict, by_node["c"].code, by_node["c"].score) == (NEVER, "no_gpu", None)
