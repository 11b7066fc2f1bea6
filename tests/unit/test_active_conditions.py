"""The conditions posted as started, as the replicated state keeps them (domain/active_conditions.py, command
`condition.update`, store level 3): by example, and the property that whatever order and repetition the updates
come in (a retried commit, two leaders' views of one condition), each condition is posted started once and
resolved once per life."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain import commands, levels
from llmgw.domain.active_conditions import ActiveCondition, Updated, state_key, update
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.conditions import CRITICAL, WARNING, Condition
from llmgw.domain.state import ClusterState
from llmgw.testing import MemoryStore

DOWN_W = Condition("model_down", "m", WARNING, "1 starting")
DOWN_C = Condition("model_down", "m", CRITICAL, "failed")
LOST = Condition("node_lost", "n1", CRITICAL, "node n1 is gone")


def test_a_condition_starts_once_rises_once_and_resolves_once() -> None:
    active, done = update({}, [DOWN_W], [], 10.0)
    assert done.started == (ActiveCondition("model_down", "m", WARNING, "1 starting", 10.0),) and not done.raised
    active, done = update(active, [DOWN_W], [], 11.0)  # seen again (or a retried commit): nothing
    assert not done and active[state_key("model_down", "m")].since == 10.0
    active, done = update(active, [DOWN_C], [], 12.0)  # risen to critical: raised, its since kept
    assert done.raised == (ActiveCondition("model_down", "m", CRITICAL, "failed", 10.0),) and not done.started
    active, done = update(active, [DOWN_W, DOWN_C], [], 13.0)  # back to warning, critical again: posted once only
    assert not done
    active, done = update(active, [], [("model_down", "m"), ("node_lost", "n1")], 14.0)  # n1 was never active
    assert done.resolved == (ActiveCondition("model_down", "m", CRITICAL, "failed", 10.0),) and active == {}
    active, done = update(active, [], [("model_down", "m")], 15.0)
    assert not done


def test_the_command_keeps_them_in_the_state_and_says_what_to_post() -> None:
    store = MemoryStore()
    assert store.submit_nowait(commands.update_conditions([LOST], [], 5.0)) == {
        "started": [{"kind": "node_lost", "subject": "n1", "severity": "critical", "words": "node n1 is gone",
                     "since": 5.0}], "raised": [], "resolved": []}
    assert store.submit_nowait(commands.update_conditions([LOST], [], 6.0)) == {"started": [], "raised": [],
                                                                               "resolved": []}
    state = store.snapshot()
    assert state.active_conditions == {"node_lost:n1": ActiveCondition("node_lost", "n1", CRITICAL,
                                                                       "node n1 is gone", 5.0)}
    assert state_from_json(state_to_json(state)) == state
    done = Updated.from_doc(store.submit_nowait(commands.update_conditions([], [("node_lost", "n1")], 7.0)))
    assert [a.since for a in done.resolved] == [5.0] and store.snapshot().active_conditions == {}


def test_a_group_below_level_3_refuses_it_and_an_unused_field_is_not_written() -> None:
    old = ClusterState(store_level=2)
    with pytest.raises(commands.CommandError) as refused:
        commands.apply(old, commands.update_conditions([LOST], [], 1.0))
    assert refused.value.code == "upgrade_pending"
    assert levels.op_level("condition.update") == 3
    assert "active_conditions" not in state_to_json(ClusterState(store_level=3))["state"]


@pytest.mark.parametrize("start, resolve", [
    ([{"kind": "", "subject": "s", "severity": "critical", "words": "w"}], []),
    ([{"kind": "k", "subject": "s", "severity": "info", "words": "w"}], []),
    ([{"kind": "k", "subject": 3, "severity": "warning", "words": "w"}], []),
    ([], [{"kind": "a:b", "subject": "s"}]),
    ([], ["node_lost"]),
    ("x", []),
])
def test_a_malformed_update_is_refused_before_it_is_logged(start: Any, resolve: Any) -> None:
    with pytest.raises(commands.CommandError) as refused:
        commands.check(commands.make("condition.update", 1.0, start=start, resolve=resolve))
    assert refused.value.code == "bad_command"


KEYS = [("node_lost", "n1"), ("model_down", "m"), ("model_down", "m2")]
steps = st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from([WARNING, CRITICAL])), max_size=3),
    st.lists(st.sampled_from(KEYS), max_size=2),
    st.booleans()), max_size=30)


@given(steps)
def test_whatever_the_updates_each_life_of_a_condition_is_one_started_and_one_resolved(
        plan: list[tuple[list[tuple[tuple[str, str], str]], list[tuple[str, str]], bool]]) -> None:
    """Updates from any view (a stale one starts what is active, resolves what is not), some committed twice
    (a retry): per condition the posts read started, at most one raise, resolved, started, ..."""
    active: dict[str, ActiveCondition] = {}
    posts: dict[tuple[str, str], list[str]] = {k: [] for k in KEYS}
    for at, (start, resolve, twice) in enumerate(plan):
        conds = [Condition(k[0], k[1], sev, "w") for k, sev in start]
        for _ in range(2 if twice else 1):
            active, done = update(active, conds, resolve, float(at))
            for a in done.resolved:
                posts[a.key].append("resolved")
            for a in done.started:
                posts[a.key].append("started")
            for a in done.raised:
                posts[a.key].append("raised")
    for key, seq in posts.items():
        lives = " ".join(seq).split("resolved")
        for life in lives:
            words = life.split()
            assert words[:1] in ([], ["started"]) and words[1:] in ([], ["raised"]), (key, seq)
        assert (state_key(*key) in active) == (bool(seq) and seq[-1] != "resolved")
