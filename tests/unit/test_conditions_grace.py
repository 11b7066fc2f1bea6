"""Alarms that can be trusted (llmgw/domain/conditions.py): no condition starts for what is expected to heal
within its grace. A leader that just took office gives its agents `agent_report_grace_s` to report before a
model is down or unplaceable or a judge down; a cold start within its activation window is not down; a
model evicted by policy is absent (waiting for a request), not down. By example, from constructed rows and
from the reconciler's own views, and a property: the grace only ever withholds those three kinds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain import summary
from llmgw.domain.conditions import conditions, healing, report_grace_left, report_grace_words
from llmgw.domain.judges import Guard
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.reconcile import decide

from test_conditions import NOW, judge, keys, model_row, model_rows, node_rows, summary_with
from test_eviction import MIN, seen, two_gpu_fleet

GRACE = TIMEOUTS.agent_report_grace_s
HELD = {"model_down", "model_unplaceable"}  # what the agents' first reports may heal (and a judge with no replica)


def restart_summary() -> summary.Summary:
    """What a restarted leader sees before its agents report: a model whose node has not reconnected, one
    that fits on no node (no agent is connected), a judge with no ready replica, one parked model, a parked
    judge and a judge the policies name that nobody defined."""
    return summary_with(
        models=(
            model_row(name="chat", desired=1, ready=0, starting=1, state="starting",
                      reason="waiting for node n1 to reconnect"),
            model_row(name="big", desired=1, ready=0, starting=0, state="unplaceable", unplaceable=True,
                      reason="no agent is connected"),
            model_row(name="broken", desired=0, ready=0, starting=0, state="parked", parked=True,
                      failures_in_row=5, last_error="exit 1"),
        ),
        guard=Guard(True, 1, (judge("lg", "down"), judge("gone", "missing"), replace(judge("pj", "down"), parked=True))))


def test_a_new_leader_posts_nothing_its_agents_reports_may_heal_within_the_grace() -> None:
    doc = restart_summary()
    took_office = NOW
    during = conditions(doc, NOW + GRACE - 0.1, leading_since=took_office)
    # Parked is in the replicated state, a judge nobody defined is in the policies: no report heals them.
    assert keys(during) == {("model_parked", "broken"), ("judge_down", "gone"), ("judge_down", "pj")}
    after = conditions(doc, NOW + GRACE, leading_since=took_office)
    assert keys(after) == {("model_parked", "broken"), ("model_down", "chat"), ("model_unplaceable", "big"),
                           ("judge_down", "lg"), ("judge_down", "gone"), ("judge_down", "pj")}
    assert keys(conditions(doc, NOW)) == keys(after)  # no term start given: no grace (as before)


def test_the_grace_says_what_it_waits_for() -> None:
    assert report_grace_left(NOW, NOW + 3) == GRACE - 3
    words = report_grace_words(NOW, NOW + 3)
    assert words.startswith(f"waiting for agents to report (grace {GRACE:g} s, {GRACE - 3:.0f} s left)")
    assert report_grace_words(NOW, NOW + GRACE) == "" and report_grace_words(None, NOW) == ""
    assert report_grace_left(NOW, None) == 0.0


def activation(elapsed: float) -> dict[str, Any]:
    return {"phase": "loading", "elapsed_s": elapsed}


def test_an_always_on_cold_start_is_not_down_within_its_activation_window() -> None:
    starting = model_row(name="on", desired=1, ready=0, starting=1, state="starting", reason="replicas are starting",
                         activation=activation(30.0), window_s=120.0)
    assert healing(starting) == "cold start within its activation window (30 s of 120 s)"
    assert conditions(summary_with(models=(starting,)), NOW) == []
    late = replace(starting, activation=activation(121.0))
    assert keys(conditions(summary_with(models=(late,)), NOW)) == {("model_down", "on")}
    failed = replace(starting, failures_in_row=1, last_error="exit 1")  # a failed start is no cold start
    assert healing(failed) == "" and keys(conditions(summary_with(models=(failed,)), NOW)) == {("model_down", "on")}
    unknown = replace(starting, activation=None)  # its node has not said how far: no claim either way
    assert keys(conditions(summary_with(models=(unknown,)), NOW)) == {("model_down", "on")}


def test_a_judge_cold_starting_within_its_window_is_not_down() -> None:
    lg = model_row(name="lg", role="guard", desired=1, ready=0, starting=1, state="starting",
                   activation=activation(5.0), window_s=120.0)
    doc = summary_with(models=(lg,), guard=Guard(True, 1, (judge("lg", "down"),)))
    assert conditions(doc, NOW) == []
    stuck = summary_with(models=(replace(lg, activation=activation(200.0)),), guard=doc.guard)
    assert keys(conditions(stuck, NOW)) == {("model_down", "lg"), ("judge_down", "lg")}


def test_a_model_evicted_by_policy_is_absent_waiting_for_a_request_not_down() -> None:
    """The pass that evicts `older` to make room for `need`: its view says so, and no condition starts."""
    state = two_gpu_fleet()
    obs = seen({"old": NOW - 10 * MIN, "older": NOW - 42 * MIN, "need": NOW})
    plan = decide(state, obs, NOW)
    assert [e.model for e in plan.evictions] == ["older"]
    view = plan.views["older"]
    assert (view.state, view.desired) == ("absent", 0)
    assert view.reason == "evicted: idle 42 min, made room for need; a request starts it again"
    doc = summary.summarize(state, obs, plan.views, {}, NOW)
    [older] = [m for m in doc.models if m.name == "older"]
    assert healing(older).startswith("evicted by policy, waiting for a request: evicted: idle 42 min")
    assert "older" not in {c.subject for c in conditions(doc, NOW)}


@given(st.lists(model_rows, max_size=6), st.lists(node_rows, max_size=4), st.floats(0, 2 * GRACE))
def test_the_grace_only_withholds_what_reports_heal(models: list[Any], nodes: list[Any], since: float) -> None:
    """Within the grace, the conditions are those without it, less model_down, model_unplaceable and
    judge_down; after it, the same as without it."""
    doc = summary_with(models=tuple(models), nodes=tuple(nodes))
    plain = conditions(doc, NOW)
    graced = conditions(doc, NOW, leading_since=NOW - since)
    if since < GRACE:
        assert graced == [c for c in plain if c.kind not in HELD]
    else:
        assert graced == plain
