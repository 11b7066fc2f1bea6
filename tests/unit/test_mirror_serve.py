"""The model definition made from a mirror file's metadata (llmgw/domain/mirror_serve.py): engine, role, a profile
that fits the cluster's GPUs (or CPU), the memory estimate, `source: mirror://NAME`; what is refused."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain.memory import GIB
from llmgw.domain.mirror import MirrorFile
from llmgw.domain.mirror_serve import definition_doc, is_judge, role_of, serve_problem
from llmgw.domain.model import ROLES, ModelDef
from llmgw.domain.observed import Gpu, NodeInfo

SHA = "ab" * 32
# A 1B chat model's facts (SmolLM2-like): 16 layers, 32 heads, 8 KV heads, 2048 wide, ~1 GiB of Q4 tensors.
MEMORY = {"layers": 16, "context_length": 8192, "embedding_length": 2048, "head_count": 32, "head_count_kv": 8,
          "tensor_bytes": GIB}


def gguf(name: str = "smollm2-1.7b", **facts: Any) -> MirrorFile:
    md = {"kind": "gguf", "size": GIB + 4096, "tensor_count": 200, "parameter_count": 1_700_000_000,
          "data_bytes": GIB, "llama_guard": False, "architecture": "llama", "quantization": "Q4_K_M",
          "context_length": 8192, "general_type": "model", "lora_adapter": False, "pooling": None,
          "split_part": None, "split_count": None, "memory": MEMORY, **facts}
    return MirrorFile(name, SHA, GIB + 4096, "gguf", md, 0.0)


def gpu_node(name: str, gib: int) -> NodeInfo:
    return NodeInfo(node=name, memory_total=64 * GIB, gpus=(Gpu(0, "GPU-0", "card", f"c-{gib}g", gib * GIB, 0),))


CPU_ONLY = {"c1": NodeInfo(node="c1", cpus=16, memory_total=64 * GIB)}


def test_a_chat_gguf_runs_on_llama_cpp_on_one_gpu_when_a_gpu_holds_it() -> None:
    doc, estimate, why = definition_doc(gguf(), "smollm2-1.7b", {"g": gpu_node("g", 24)}, {})
    assert doc["engine"] == "llama.cpp" and doc["role"] == "chat" and doc["source"] == "mirror://smollm2-1.7b"
    assert doc["profile"]["gpus"] == 1 and not doc["profile"].get("cpu")
    # weights 1 GiB + KV 16 layers x 8 heads x (64 + 64) x 2 bytes x 4096 tokens (llama-server's default) + 512 MiB
    kv = 16 * 8 * 128 * 2 * 4096
    assert estimate.total_bytes == GIB + kv + 512 * (1 << 20) and estimate.complete
    assert doc["profile"]["memory_gib"] >= estimate.total_bytes / GIB
    assert "one GPU" in why
    ModelDef.from_doc(doc)


def test_a_chat_gguf_runs_on_cpu_where_no_gpu_holds_it() -> None:
    doc, estimate, why = definition_doc(gguf(), "m", CPU_ONLY, {})
    assert doc["profile"]["cpu"] is True and "no node reports a GPU" in why
    small = {"g": gpu_node("g", 1)}  # a 1 GiB card: less than the weights
    doc, _, why = definition_doc(gguf(), "m", small, {})
    assert doc["profile"]["cpu"] is True and "more than the largest GPU" in why


def test_pooling_makes_an_embedding_or_a_rerank_model() -> None:
    doc, _, _ = definition_doc(gguf("nomic-embed", pooling="mean", architecture="nomic-bert"), "e", CPU_ONLY, {})
    assert doc["role"] == "embedding" and doc["engine"] == "llama.cpp"
    doc, _, _ = definition_doc(gguf("bge-reranker", pooling="rank", architecture="bert"), "r", CPU_ONLY, {})
    assert doc["role"] == "rerank"
    assert role_of({"pooling": "none"}) == "chat" and role_of({"pooling": "cls"}) == "embedding"


def test_a_llama_guard_file_is_a_judge_defined_as_enable_defines_one() -> None:
    f = gguf("llama-guard-3-1b", llama_guard=True)
    assert is_judge(f) and role_of(f.metadata) == "guard"
    judge = {"name": "x", "engine": "llama.cpp", "role": "guard", "source": "/x", "mode": "always",
             "replicas": {"min": 1, "max": 1}, "args": ["--ctx-size", "8192"], "profile": {"cpu": True}}
    doc, estimate, _ = definition_doc(f, "llama-guard", {"g": gpu_node("g", 80)}, {}, judge)
    assert doc["role"] == "guard" and doc["name"] == "llama-guard" and doc["source"] == "mirror://llama-guard-3-1b"
    assert doc["profile"]["cpu"] is True  # on CPU even beside a GPU, as `ctl guard judge enable` serves one
    assert estimate.total_bytes == GIB + 16 * 8 * 128 * 2 * 8192 + 512 * (1 << 20)  # its 8192-token context


def test_a_safetensors_file_runs_on_vllm_on_the_fewest_gpus_that_hold_it() -> None:
    md = {"kind": "safetensors", "size": 15 * GIB, "tensor_count": 300, "parameter_count": 7_000_000_000,
          "data_bytes": 15 * GIB, "llama_guard": False, "dtypes": ["BF16"]}
    f = MirrorFile("mistral-7b", SHA, 15 * GIB, "safetensors", md, 0.0)
    doc, estimate, why = definition_doc(f, "mistral-7b", {"g": gpu_node("g", 24)}, {})
    assert doc["engine"] == "vllm" and doc["role"] == "chat" and doc["profile"]["gpus"] == 1
    assert estimate.total_bytes is not None and not estimate.complete  # no head counts: a lower bound
    doc, _, why = definition_doc(f, "mistral-7b", {"g": gpu_node("g", 16)}, {})  # 16.5 GiB > 0.9 x 16 GiB
    assert doc["profile"] == {**doc["profile"], "gpus": 2, "tp": 2} and "2 GPUs" in why


def test_a_lora_adapter_a_split_part_and_a_projector_are_refused() -> None:
    lora = gguf("my-lora", lora_adapter=True, general_type="adapter")
    assert "adapters from the mirror are not supported yet" in (serve_problem(lora) or "")
    assert "merge them first" in (serve_problem(gguf("big-00001-of-00002", split_part=1, split_count=2)) or "")
    assert "not a model" in (serve_problem(gguf("mmproj", general_type="mmproj")) or "")
    assert serve_problem(gguf()) is None


def test_overrides_change_the_definition_and_its_estimate() -> None:
    overrides = {"profile": {"cpu": True}, "mode": "on-demand", "replicas": {"min": 0, "max": 3}}
    doc, estimate, why = definition_doc(gguf(), "m", {"g": gpu_node("g", 24)}, overrides)
    assert doc["mode"] == "on-demand" and doc["replicas"] == {"min": 0, "max": 3} and why == "as given"
    assert estimate.total_bytes == GIB + 16 * 8 * 128 * 2 * 2048 + 512 * (1 << 20)  # CPU: 2048 tokens
    doc, _, _ = definition_doc(gguf(), "m", {}, {"profile": {"memory_gib": 3.5}})
    assert doc["profile"]["memory_gib"] == 3.5  # given: kept


@given(pooling=st.sampled_from([None, "none", "mean", "cls", "last", "rank", "other"]), guard=st.booleans(),
       gpu_gib=st.sampled_from([0, 1, 8, 80]), layers=st.integers(0, 200), tensor_bytes=st.integers(0, 1 << 40))
def test_every_servable_file_makes_a_definition_the_cluster_accepts(pooling: str | None, guard: bool, gpu_gib: int,
                                                                    layers: int, tensor_bytes: int) -> None:
    memory = {**MEMORY, "layers": layers, "tensor_bytes": tensor_bytes}
    f = gguf("f", pooling=pooling, llama_guard=guard, memory=memory)
    nodes = {"g": gpu_node("g", gpu_gib)} if gpu_gib else CPU_ONLY
    doc, estimate, _ = definition_doc(f, "f", nodes, {})
    model = ModelDef.from_doc(doc)
    assert model.role in ROLES and model.source == "mirror://f" and model.engine == "llama.cpp"
    assert (model.role == "guard") == guard
    if estimate.total_bytes is not None:
        assert model.profile.memory_gib * GIB >= estimate.total_bytes
