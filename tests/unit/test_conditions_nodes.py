"""A node's own trouble as conditions (llmgw/domain/conditions.py): a GPU its probe says cannot be used (a MIG
card with nothing carved) and a storage directory the agent cannot read. Both showed only as `ctl status`
warnings, with no condition, so no webhook and no alert (found by the fault catalog, tests/integration/
test_faults.py); each from a real summary, gone once fixed, and never from a node that is not connected."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.agent.storage import StorageReport
from llmgw.domain import summary
from llmgw.domain.conditions import KINDS, WARNING, conditions
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.summary import NodeRow
from llmgw.testing.builders import ReconcileLoop, cpu_node, model, store_with
from tests.support.faults import mig_node

NOW = 10_000.0


def found(loop: ReconcileLoop) -> dict[tuple[str, str], Any]:
    plan = loop.decide()
    doc = summary.summarize(loop.state, loop.observed(), plan.views, {}, loop.now)
    return {c.key: c for c in conditions(doc, loop.now)}


def test_a_mig_card_with_nothing_carved_is_a_gpu_problem_until_carved() -> None:
    loop = ReconcileLoop(store_with([model("a").sim().always()]), [cpu_node("n1", "sim"), mig_node("g1", carved=True)],
                         now=NOW)
    loop.settle()
    assert found(loop) == {}, "a carved MIG card (its parent listed unplaceable) is no problem"
    loop.nodes["g1"] = mig_node("g1", carved=False)
    (c,) = found(loop).values()
    assert (c.kind, c.subject, c.severity) == ("gpu_problem", "g1", WARNING) and c.kind in KINDS
    assert "MIG mode is on but no instances are carved" in c.words and "nvidia-smi mig" in c.words
    loop.nodes["g1"] = mig_node("g1", carved=True)
    assert found(loop) == {}


def test_an_unreadable_storage_directory_until_it_is_back() -> None:
    ok = StorageReport("/data/models", "fab-a", False).to_doc()
    gone = StorageReport("/data/models", "fab-a", False,
                         error="cannot read /data/models: No such file or directory").to_doc()
    loop = ReconcileLoop(store_with([]), [replace(cpu_node("n4"), storage=(ok,))], now=NOW)
    loop.settle()
    assert found(loop) == {}
    loop.nodes["n4"] = replace(cpu_node("n4"), storage=(gone,))
    (c,) = found(loop).values()
    assert (c.kind, c.subject, c.severity) == ("storage_unreadable", "n4:/data/models", WARNING)
    assert "No such file or directory" in c.words and "fab-a" in c.words
    loop.nodes["n4"] = replace(cpu_node("n4"), storage=(ok,))
    assert found(loop) == {}


def test_a_lost_nodes_last_words_are_not_conditions_of_their_own() -> None:
    lost = NodeRow("g1", False, hostname=None, cpus=None, memory_total=None, gpus=None, gpu_counts=None,
                   engines=None, engine_versions=None, cpu_flags=None, fabric=None,
                   storage=({"path": "/x", "error": "gone"},), probe=None, warnings=("GPU 0: broken",), lost_at=NOW)
    doc = replace(summary.summarize(ClusterState(), Observed(), None, {}), nodes=(lost,))
    assert {c.kind for c in conditions(doc, NOW)} == set(), "within its grace: nothing; after it, node_lost alone"
