"""The status summary counts GPUs as capacity: only usable ones are used or free; unhealthy and
unplaceable ones (a MIG-mode card, nothing carved) are listed apart with their reasons."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.gpus import smi
from llmgw.agent.gpus.facts import to_gpus, warnings
from llmgw.domain import summary
from llmgw.domain.observed import NodeInfo, Observed
from llmgw.testing.builders import model, placed, state_with

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"


def a100_box() -> NodeInfo:
    facts = smi.parse((FIXTURES / "v12-535-a100-80g-mig.L.txt").read_text(),
                      (FIXTURES / "v12-535-a100-80g-mig.xml").read_text())
    return NodeInfo("n1", gpus=to_gpus(facts), warnings=warnings(facts), probe="nvidia-smi")


def test_unusable_devices_count_as_neither_used_nor_free() -> None:
    state = state_with([model("m").sim()], [placed("m", "n1", [1001])])
    (doc,) = summary.nodes(state, Observed(nodes={"n1": a100_box()}))
    counts = doc["gpu_counts"]
    assert (counts["used"], counts["free"]) == (1, 3)  # 0/mig1 used; 0/mig0, 0/mig2 and card 3 free
    assert counts["by_class"]["a100-80g-mig-2g.20gb"] == {"used": 1, "free": 0}
    assert counts["by_class"]["a100-80g"] == {"used": 0, "free": 1}
    unusable = {u["label"]: u["reason"] for u in counts["unusable"]}
    assert set(unusable) == {"0", "1", "2"}
    assert "no instances are carved" in unusable["1"] and "GPU reset" in unusable["2"]


def test_an_unhealthy_gpu_holding_a_placement_is_not_counted_used() -> None:
    facts = smi.parse((FIXTURES / "v12-535-unhealthy.L.txt").read_text(),
                      (FIXTURES / "v12-535-unhealthy.xml").read_text())
    info = NodeInfo("n1", gpus=to_gpus(facts), warnings=warnings(facts))
    state = state_with([model("m").sim()], [placed("m", "n1", [0])])
    (doc,) = summary.nodes(state, Observed(nodes={"n1": info}))
    assert (doc["gpu_counts"]["used"], doc["gpu_counts"]["free"]) == (0, 0)
    assert all(not u["healthy"] and u["reason"] for u in doc["gpu_counts"]["unusable"])


def test_the_probes_warnings_reach_the_summary() -> None:
    built = summary.summarize(state_with(), Observed(nodes={"n1": a100_box()}), None, {}).to_doc()
    assert any(w.startswith("node n1: GPU 1: MIG mode is on but no instances") for w in built["warnings"])
    assert built["nodes"][0]["probe"] == "nvidia-smi"


def test_a_node_never_heard_from_has_unknown_counts() -> None:
    state = state_with([model("m").sim()], [placed("m", "gone", [0])])
    (doc,) = summary.nodes(state, Observed())
    assert doc["gpu_counts"] is None and doc["warnings"] is None
    assert doc["engine_versions"] is None and doc["storage"] is None


def test_engine_installs_and_storage_are_shown_per_node() -> None:
    info = NodeInfo("n1", engines=("sim", "llama.cpp"), engine_versions={"sim": "0.1", "llama.cpp": ""},
                    fabric="ib-a", storage=({"path": "/models", "fabric": "ib-a", "shared": True, "models": []},))
    (doc,) = summary.nodes(state_with(), Observed(nodes={"n1": info}))
    assert doc["engine_versions"] == {"sim": "0.1", "llama.cpp": ""}  # installed, version not said: "", not absent
    assert doc["fabric"] == "ib-a" and doc["storage"][0]["shared"] is True
