"""Judge status (llmgw/domain/judges.py): each "what is wrong" case in words, the summary's guard part,
Llama Guard files found in the agents' storage, and a judge failure reported over a gateway's stream."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from llmgw.control.hub import MAX_JUDGES_REMEMBERED, AgentHub
from llmgw.domain import commands, summary
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.judges import GUARDS_OFF, guard_summary, judge_status, pick_guard_file
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo, Observed
from llmgw.domain.state import ClusterState, ModelHealth
from llmgw.gateway.follower import JudgeFailures
from llmgw.reconcile import ModelView
from llmgw.wire import protocol

NOW = 10_000.0


def judge_def(name: str = "lg", role: str = "guard") -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "llama.cpp", "role": role, "source": "/m/lg.gguf",
                              "profile": {"cpu": True}})


def state(*models: ModelDef, judge: str = "lg") -> ClusterState:
    s = ClusterState()
    for m in models:
        s, _ = commands.apply(s, commands.put_model(m, 1.0))
    for name in ("a", "b"):
        p = GuardPolicy.from_doc({"name": name, "judge": judge})
        s, _ = commands.apply(s, commands.set_policy(p, 2.0))
    return s


def view(ready: int, starting: int = 0, reason: str = "", name: str = "lg") -> dict[str, Any]:
    return {name: ModelView(name, desired=1, placed=1, ready=ready, starting=starting,
                            state="ready" if ready else "starting", reason=reason)}


def only(s: ClusterState, views: dict[str, Any] | None, observed: Observed | None = None) -> dict[str, Any]:
    found = judge_status(s, observed or Observed(), views, NOW)
    assert len(found) == 1
    return found[0]


def test_a_judge_no_model_is_defined_for() -> None:
    j = only(state(), view(0))
    assert (j["status"], j["defined"], j["role"], j["ready"] is not None) == ("missing", False, None, True)
    assert j["policies"] == ["a", "b"]
    assert j["problem"] == "no model named lg: define it with role guard, or " \
                           "`llmgw ctl guard judge enable lg --source FILE.gguf`"


def test_a_judge_defined_with_another_role() -> None:
    j = only(state(judge_def(role="chat")), view(1))
    assert j["status"] == "not_a_judge" and j["judge"] is False
    assert j["problem"].startswith("lg has role chat, not guard: ") and "--replace" in j["problem"]


def test_a_judge_with_no_ready_replica_says_how_many_start_and_why() -> None:
    j = only(state(judge_def()), view(0, starting=2))
    assert (j["status"], j["ready"], j["starting"]) == ("down", 0, 2)
    assert j["problem"] == "lg has no ready replica (2 starting)"
    j = only(state(judge_def()), view(0, reason="no node has the llama.cpp engine"))
    assert j["problem"] == "lg has no ready replica (0 starting): no node has the llama.cpp engine"


def test_a_parked_judge() -> None:
    s = state(judge_def())
    s = replace(s, health=MappingProxyType({"lg": ModelHealth(failures_in_row=5, parked=True, last_error="bad magic")}))
    j = only(s, view(0))
    assert j["status"] == "down" and j["parked"] is True
    assert j["problem"] == "lg is parked after 5 failed start(s): bad magic (`llmgw ctl model retry lg` once fixed)"


def test_a_recent_failure_to_answer_and_an_old_one() -> None:
    s = state(judge_def())
    recent = Observed(judge_failures={"lg": (NOW - 30, "no answer within the 2 s budget")})
    j = only(s, view(1), recent)
    assert j["status"] == "failing" and j["last_failure_age_s"] == 30
    assert j["problem"] == "lg failed to answer 30 s ago: no answer within the 2 s budget"
    old = Observed(judge_failures={"lg": (NOW - 3600, "connection refused")})
    j = only(s, view(1), old)
    assert (j["status"], j["problem"], j["last_failure"]) == ("ok", "", "connection refused")


def test_unknown_before_the_reconciler_ran_never_ok() -> None:
    j = only(state(judge_def()), None)
    assert j["status"] == "unknown" and j["ready"] is None and "reconciler has not run" in j["problem"]
    j = only(state(judge_def()), {})
    assert j["status"] == "unknown" and "no view of it yet" in j["problem"]


def test_a_healthy_judge() -> None:
    j = only(state(judge_def()), view(1))
    assert (j["status"], j["problem"], j["ready"], j["desired"], j["last_failure"]) == ("ok", "", 1, 1, None)


def test_the_summary_carries_the_judges_and_says_when_guards_are_off() -> None:
    s = state()
    guard, warnings = guard_summary(s, Observed(), view(0), NOW)
    assert guard.enabled is True and guard.policies == 2 and guard.judges[0].status == "missing"
    assert warnings == ["judge lg (policies a, b): " + guard.judges[0].problem]
    off, _ = commands.apply(s, commands.put_setting("guard.enabled", False, 3.0))
    guard, warnings = guard_summary(off, Observed(), view(0), NOW)
    assert guard.enabled is False and warnings[0] == GUARDS_OFF
    built = summary.summarize(off, Observed(), view(0), {"leader": "cp"}, NOW).to_doc()
    assert built["guard"]["enabled"] is False and GUARDS_OFF in built["warnings"]
    assert any(w.startswith("judge lg") for w in built["warnings"])
    quiet = summary.summarize(ClusterState(), Observed(), None, {"leader": "cp"}, NOW).to_doc()
    assert quiet["guard"] == {"enabled": True, "policies": 0, "judges": []}
    assert not any("guard" in w or "judge" in w for w in quiet["warnings"])


def storage(*paths: str, shared: bool = False) -> tuple[dict[str, Any], ...]:
    return ({"path": "/models", "fabric": "eth", "shared": shared, "error": "", "not_weights": [],
             "models": [{"name": p.rsplit("/", 1)[-1].removesuffix(".gguf"), "path": p, "kind": "gguf", "size": 1}
                        for p in paths]},)


def test_a_llama_guard_file_in_the_agents_storage() -> None:
    assert pick_guard_file(Observed()) is None
    nodes = {
        "n1": NodeInfo("n1", storage=storage("/models/Llama-Guard-3-1B.Q4_K_M.gguf", "/models/smollm2.gguf")),
        "n2": NodeInfo("n2", storage=storage("/models/Llama-Guard-3-1B.Q4_K_M.gguf")),
        "n3": NodeInfo("n3", storage=storage("/data/llama_guard_3_1b-q8_0.gguf")),
        "n4": NodeInfo("n4", storage=storage("/models/Llama-Guard-3-8B.gguf", "/models/llama-3.2-1b.gguf")),
    }
    assert pick_guard_file(Observed(nodes=nodes)) == ("/models/Llama-Guard-3-1B.Q4_K_M.gguf", ["n1", "n2"])
    assert pick_guard_file(Observed(nodes={"n4": nodes["n4"]})) is None


def test_a_failure_reported_over_a_gateways_stream_reaches_the_hub() -> None:
    hub = AgentHub(clock=lambda: NOW)
    message = protocol.loads(protocol.dumps(protocol.judge_failure_message("lg", "answer not parsed: 'sure'")))
    hub.record_judge_failure(*protocol.read_judge_failure(message))
    assert hub.observed().judge_failures == {"lg": (NOW, "answer not parsed: 'sure'")}
    hub.record_judge_failure("lg", "x" * 5000, at=NOW + 1)
    assert hub.observed().judge_failures["lg"] == (NOW + 1, "x" * 500)
    for i in range(MAX_JUDGES_REMEMBERED + 5):
        hub.record_judge_failure(f"j{i}", "down", at=float(i))
    assert len(hub.judge_failures) == MAX_JUDGES_REMEMBERED and "lg" in hub.judge_failures
    for bad in ({"type": "judge_failure"}, {"type": "judge_failure", "model": "", "words": "x"},
                {"type": "judge_failure", "model": "lg", "words": 5}):
        with pytest.raises(protocol.ProtocolError):
            protocol.read_judge_failure(bad)


def test_a_down_or_failing_judge_is_a_warning_of_the_summary() -> None:
    """`ctl status` warns of a judge that is down (no ready replica, or parked) or failing, not only of a
    missing one; a healthy judge or one not yet known is no warning."""
    s = state(judge_def())
    parked = replace(s, health=MappingProxyType({"lg": ModelHealth(failures_in_row=3, parked=True,
                                                                   last_error="bad magic")}))
    failing = Observed(judge_failures={"lg": (NOW - 5, "no answer within the 2 s budget")})
    for st, views, observed, words in (
            (s, view(0, starting=1), Observed(), "lg has no ready replica (1 starting)"),
            (parked, view(0), Observed(), "lg is parked after 3 failed start(s): bad magic"),
            (s, view(1), failing, "lg failed to answer 5 s ago: no answer within the 2 s budget")):
        guard, warnings = guard_summary(st, observed, views, NOW)
        assert warnings == [f"judge lg (policies a, b): {guard.judges[0].problem}"] and words in warnings[0]
        built = summary.summarize(st, observed, views, {"leader": "cp"}, NOW).to_doc()
        assert f"judge lg (policies a, b): {guard.judges[0].problem}" in built["warnings"]
    assert guard_summary(s, Observed(), view(1), NOW)[1] == []
    assert guard_summary(s, Observed(), None, NOW)[1] == []  # unknown: the models table says why


def test_a_remote_gateway_reports_each_judges_latest_failure_at_most_once_a_period() -> None:
    """A judge that is down fails every check: the gateway's stream carries its latest words, not each one."""
    judges = JudgeFailures(every_s=1.0)
    judges.add("lg", "connection refused")
    judges.add("lg", "no answer within the 2 s budget")
    judges.add("lg2", "answer not parsed")
    assert judges.due(10.0) == [("lg", "no answer within the 2 s budget"), ("lg2", "answer not parsed")]
    assert judges.due(10.1) == []
    judges.add("lg", "connection refused")
    assert judges.due(10.5) == []  # within the period: held, not lost
    assert judges.due(11.0) == [("lg", "connection refused")] and judges.due(20.0) == []
