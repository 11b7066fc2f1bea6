"""The memory estimate: from real storage reports (a tiny GGUF and a safetensors model scanned for
real by the agent's StorageScanner), hand-computed; the profile's override; unknown is None."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.storage import StorageDir, StorageScanner
from llmgw.domain.memory import (
    ENGINE_OVERHEAD_BYTES, GIB, MIB, MemoryEstimate, WeightsIndex, estimate_for, gib, holds,
)
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from tests.support.weights_tree import write_safetensors_model

# The tiny llama (tests.support.tiny_gguf): 21 F32 tensors; 2 layers, 2 KV heads of 64 / 4 = 16.
TINY_WEIGHTS = 4 * (2 * 512 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64 + 2 * 64) + 64)
TINY_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # K and V x layers x kv heads x head dim x 2 bytes (f16)


def model(source: str, engine: str = "llama.cpp", *, args: list[str] | None = None, **profile: Any) -> ModelDef:
    return ModelDef.from_doc({"name": "m", "engine": engine, "source": source, "args": args or [],
                              "profile": profile})


def node(name: str, root: Path) -> NodeInfo:
    return NodeInfo(node=name, storage=StorageScanner([StorageDir(root, "ib-a")]).scan())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf")


def test_a_scanned_gguf_on_cpu_is_weights_kv_at_the_default_context_and_overhead(tiny: Path) -> None:
    est = estimate_for(model(str(tiny), cpu=True), {"n1": node("n1", tiny.parent)})
    kv = 2048 * TINY_KV_PER_TOKEN  # llama.cpp's CPU default, 2048, is also the trained context
    assert est.total_bytes == TINY_WEIGHTS + kv + 512 * MIB
    assert (est.source, est.devices, est.complete, est.device_share) == ("gguf", 1, True, None)
    assert est.detail == ("gguf: weights 545.2 KiB + KV cache 512 KiB for 2048 tokens (llama.cpp's default) "
                          "+ overhead 512 MiB")


def test_ctx_size_is_taken_as_asked_and_overhead_counts_per_gpu(tiny: Path) -> None:
    nodes = {"n1": node("n1", tiny.parent)}
    est = estimate_for(model(str(tiny), args=["--ctx-size=8192"], gpus=2, tp=2), nodes)
    assert est.total_bytes == TINY_WEIGHTS + 8192 * TINY_KV_PER_TOKEN + 2 * 512 * MIB
    assert est.devices == 2 and est.per_device(2) == -(-est.total_bytes // 2)
    assert "for 8192 tokens + overhead 512 MiB × 2 GPUs" in est.detail
    # On GPUs llama-server's default (4096) applies, capped by the trained context (2048).
    default = estimate_for(model(str(tiny)), nodes)
    assert default.total_bytes == TINY_WEIGHTS + 2048 * TINY_KV_PER_TOKEN + 512 * MIB
    # The last of two flags wins, as in the engine's parser; a value the engine refuses is not used.
    assert estimate_for(model(str(tiny), args=["--ctx-size", "4", "--ctx-size", "16"], cpu=True), nodes) \
        .total_bytes == TINY_WEIGHTS + 16 * TINY_KV_PER_TOKEN + 512 * MIB


def test_the_same_path_or_a_file_inside_the_model_directory_matches(tiny: Path, tmp_path: Path) -> None:
    nodes = {"n1": node("n1", tiny.parent)}
    assert estimate_for(model(str(tiny.parent) + "//tiny.gguf", cpu=True), nodes).source == "gguf"
    for other in (tiny.parent, tiny.parent / "other.gguf", tiny / "x"):  # a folder of GGUFs is not one
        assert estimate_for(model(str(other), cpu=True), nodes).total_bytes is None
    entry = {"path": "/srv/models/qwen", "name": "Qwen/Qwen2-7B", "kind": "safetensors"}
    assert holds(entry, "/srv/models/qwen/") and holds(entry, "/srv/models/qwen/model.safetensors")
    assert holds(entry, "hf://Qwen/Qwen2-7B") and not holds(entry, "hf://Qwen/Qwen2-72B")
    assert not holds(entry, "/srv/models/qwen2") and not holds(entry, "/srv/models")  # a parent of a dir: no


def qwen_dir(root: Path, **config: Any) -> Path:
    d = write_safetensors_model(root / "qwen", shards=2)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 28, "num_key_value_heads": 4,
        "hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16", **config}))
    return d


def test_safetensors_with_config_json_on_vllm(tmp_path: Path) -> None:
    d = qwen_dir(tmp_path)
    nodes = {"n1": node("n1", tmp_path)}
    weights = sum(p.stat().st_size for p in d.glob("*.safetensors"))
    per_token = 28 * 4 * (128 + 128) * 2  # head dim 3584 / 28 = 128; bf16
    est = estimate_for(model(str(d), "vllm"), nodes)
    assert est.total_bytes == weights + 32768 * per_token + 3 * GIB // 2
    assert est.source == "safetensors" and est.device_share == 0.9
    assert est.detail == (f"safetensors: weights {gib(weights)} + KV cache 1.8 GiB for 32768 tokens "
                          "(the trained context) + overhead 1.5 GiB")
    short = estimate_for(model(str(d), "vllm", args=["--max-model-len", "8192", "--kv-cache-dtype", "fp8",
                                                     "--gpu-memory-utilization", "0.5"]), nodes)
    assert short.total_bytes == weights + 8192 * per_token // 2 + 3 * GIB // 2
    assert short.device_share == 0.5


def test_a_float32_model_caches_four_bytes_and_head_dim_is_taken_when_said(tmp_path: Path) -> None:
    d = qwen_dir(tmp_path, torch_dtype="float32", head_dim=64)
    weights = sum(p.stat().st_size for p in d.glob("*.safetensors"))
    est = estimate_for(model(str(d), "vllm", args=["--max-model-len=100"]), {"n1": node("n1", tmp_path)})
    assert est.total_bytes == weights + 100 * 28 * 4 * (64 + 64) * 4 + 3 * GIB // 2


def test_without_head_counts_the_figure_is_a_lower_bound(tmp_path: Path) -> None:
    d = write_safetensors_model(tmp_path / "bare", shards=1)  # config.json names only the architecture
    weights = (d / "model.safetensors").stat().st_size
    est = estimate_for(model(str(d), "vllm"), {"n1": node("n1", tmp_path)})
    assert est.total_bytes == weights + 3 * GIB // 2 and est.complete is False
    assert "KV cache unknown (no context length in the safetensors facts): a lower bound" in est.detail


def test_the_profile_overrides_what_storage_says(tiny: Path) -> None:
    est = estimate_for(model(str(tiny), memory_gib=12.5, gpus=2, tp=2), {"n1": node("n1", tiny.parent)})
    assert (est.total_bytes, est.source, est.detail, est.devices) == (
        int(12.5 * GIB), "profile", "profile.memory_gib", 2)
    assert est.per_device(2) == int(6.25 * GIB)


def test_unknown_is_none_never_zero(tiny: Path, tmp_path: Path) -> None:
    elsewhere = {"n1": node("n1", tmp_path)}  # a node that looked and holds something else
    for m, nodes in [(model(str(tiny), cpu=True), {}), (model(str(tiny), cpu=True), elsewhere),
                     (model("hf://org/absent", "vllm"), {"n1": node("n1", tiny.parent)})]:
        est = estimate_for(m, nodes)
        assert est.total_bytes is None and est.per_device(4) is None and est.source == "unknown"
        assert est.detail == "no node reports these weights; set profile.memory_gib"
        assert est.to_doc()["bytes"] is None and est.to_doc()["per_device"] is None
    sim = estimate_for(model("sim://x", "sim"), {})
    assert sim.total_bytes is None and "sim engine" in sim.detail
    assert MemoryEstimate(None, "unknown").per_device(1) is None


def test_when_reports_disagree_the_largest_counts(tmp_path: Path) -> None:
    for name, shards in (("a", 1), ("b", 3)):
        write_safetensors_model(tmp_path / name / "models" / "m", shards=shards)
    nodes = {"a": node("a", tmp_path / "a"), "b": node("b", tmp_path / "b")}
    small = (tmp_path / "a" / "models" / "m" / "model.safetensors").stat().st_size
    big = sum(p.stat().st_size for p in (tmp_path / "b" / "models" / "m").glob("*.safetensors"))
    assert big > small
    # The same model name on both nodes through a Hugging Face style name: each report counts.
    est = estimate_for(model("mirror://m", "vllm"), nodes)
    assert est.total_bytes == big + ENGINE_OVERHEAD_BYTES["vllm"]


def test_an_index_holds_a_shared_file_once_and_follows_changed_reports(tmp_path: Path) -> None:
    d = qwen_dir(tmp_path)
    seen = node("n0", tmp_path)
    nodes = {f"n{i}": NodeInfo(node=f"n{i}", storage=seen.storage) for i in range(200)}  # one filer
    index = WeightsIndex.of(nodes)
    assert len(index.entries(str(d))) == 1 and index.entries("relative/path") == []
    first = estimate_for(model(str(d), "vllm"), nodes, index)
    assert first == estimate_for(model(str(d), "vllm"), dict(nodes)) and first.total_bytes is not None
    # The model changes on one node (a new report): the next estimate sees it, not the memo.
    qwen_dir(tmp_path, max_position_embeddings=65536)
    nodes["n7"] = node("n7", tmp_path)
    assert (estimate_for(model(str(d), "vllm"), nodes).total_bytes or 0) > first.total_bytes
    del nodes["n7"]
    assert estimate_for(model(str(d), "vllm"), nodes) == first


# --- through the admin API to `ctl model show` ----------------------------------------------------


async def test_the_admin_api_sends_the_estimate_and_ctl_shows_it(tiny: Path) -> None:
    import httpx
    import trio

    from llmgw.cli.ctl.render import render_model
    from llmgw.control.api import make_app
    from llmgw.control.context import Context
    from llmgw.control.hub import AgentHub
    from llmgw.control.reconciler import Reconciler
    from llmgw.domain import commands
    from llmgw.domain.keys import hash_key
    from llmgw.testing import MemoryStore

    store, hub = MemoryStore(), AgentHub(clock=lambda: 0.0)
    store.submit_nowait(commands.add_key(hash_key("sk-admin"), "admin", "admin", 0.0))
    for name, source in (("tiny", str(tiny)), ("elsewhere", "/srv/other.gguf")):
        doc = {"name": name, "engine": "llama.cpp", "source": source, "profile": {"cpu": True}}
        store.submit_nowait(commands.put_model(ModelDef.from_doc(doc), 0.0))
    send, _receive = trio.open_memory_channel[dict[str, Any]](1)
    hub.report_inventory(hub.connect("n1", send), node("n1", tiny.parent))
    app = make_app(Context(store=store, hub=hub, reconciler=Reconciler(store, hub), clock=lambda: 0.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                 base_url="http://member",
                                 headers={"Authorization": "Bearer sk-admin"}) as c:
        known = (await c.get("/api/v1/models/tiny")).json()["model"]
        unknown = (await c.get("/api/v1/models/elsewhere")).json()["model"]
    total = TINY_WEIGHTS + 2048 * TINY_KV_PER_TOKEN + 512 * MIB
    assert known["estimate"]["bytes"] == total and known["estimate"]["per_device"] == total
    assert unknown["estimate"]["bytes"] is None and unknown["estimate"]["source"] == "unknown"
    line = next(x for x in render_model(known).splitlines() if x.startswith("memory:"))
    assert line.split(":", 1)[1].strip() == (
        "0.5 GiB (gguf: weights 545.2 KiB + KV cache 512 KiB for 2048 tokens (llama.cpp's default) "
        "+ overhead 512 MiB)")
    line = next(x for x in render_model(unknown).splitlines() if x.startswith("memory:"))
    assert line.split(":", 1)[1].strip() == "unknown (no node reports these weights; set profile.memory_gib)"


def test_a_lower_bound_reads_as_one() -> None:
    from llmgw.cli.ctl.render import render_model

    est = MemoryEstimate(5 * GIB, "safetensors", "safetensors: weights …", complete=False)
    assert "memory:" in render_model({"estimate": est.to_doc()})
    assert "at least 5.0 GiB (safetensors: weights …)" in render_model({"estimate": est.to_doc()})
    assert "\nmemory:" in render_model({}) and "at least" not in render_model({})  # an older server: '-'


def test_the_documented_constants_are_the_code_s() -> None:
    from llmgw.domain import memory

    text = (Path(__file__).resolve().parents[2] / "docs" / "placement.md").read_text(encoding="utf-8")
    section = text[text.index("## Memory estimate"):]
    for said in (f"{gib(memory.ENGINE_OVERHEAD_BYTES['llama.cpp'])}: the CUDA context",
                 f"{gib(memory.ENGINE_OVERHEAD_BYTES['vllm'])}: the CUDA context",
                 f"{memory.LLAMA_CPP_CONTEXT_CPU} on CPU", f"{memory.LLAMA_CPP_CONTEXT_GPU} on GPUs",
                 f"(default {memory.VLLM_DEFAULT_SHARE:g})"):
        assert said in section, said


def test_placement_sizes_a_replica_from_what_storage_says(tiny: Path) -> None:
    """No memory_gib in the profile: the estimate made from the scanned GGUF decides where the
    replica fits, and where it fits nowhere the refusal says by how much."""
    from dataclasses import replace

    from llmgw.domain.observed import Gpu
    from llmgw.placement import place

    need = estimate_for(model(str(tiny), gpus=1), {"n": node("n", tiny.parent)}).total_bytes
    assert need is not None and need > 256 << 20
    seen = node("small", tiny.parent)
    gpu = Gpu(0, "GPU-0", "tiny card", "tiny-0g", 256 << 20, 0)  # a quarter GiB: less than weights + overhead
    small = replace(seen, gpus=(gpu,), engines=("llama.cpp",))
    big = replace(seen, node="big", gpus=(replace(gpu, uuid="GPU-1", memory_total=4 << 30),), engines=("llama.cpp",))
    m = model(str(tiny), gpus=1)
    result = place(m, {"small": small, "big": big}, [])
    assert result.choice is not None and result.choice.node == "big"
    alone = place(m, {"small": small}, [])
    assert alone.choice is None and "short by" in alone.short_by, alone.short_by
