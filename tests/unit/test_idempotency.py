"""Commands with an idempotency id apply at most once, and `apply_entry` (what the Raft log
applies) is total: a committed command that does not apply is a recorded no-op with its reason."""

from __future__ import annotations

import json
import pickle
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import commands as C
from llmgw.domain.keys import hash_key
from llmgw.domain.state import ClusterState, Outcome
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model, placed, state_with

HOOKS = ["https://hooks.example/a", "https://hooks.example/b"]


def entry(state: ClusterState, command: Any) -> tuple[ClusterState, Outcome]:
    return C.apply_entry(state, command)


def demo_state() -> ClusterState:
    return state_with([model("demo")], [placed("demo", "n1")])


# --- the same id twice: once ---------------------------------------------------------------------------------


def test_the_same_id_twice_applies_once_and_answers_the_same():
    s0 = ClusterState()
    cmd = C.with_cid(C.put_model(model("extra").build(), 1.0), "k:1")
    s1, first = entry(s0, cmd)
    assert first.ok and first.plain_result() == {"created": True} and s1.revision == 1
    s2, again = entry(s1, C.with_cid(C.put_model(model("extra").build(), 99.0), "k:1"))  # a retry: a later time
    assert s2 is s1, "a retry changes nothing, its revision included"
    assert again == first and C.result_of(again) == {"created": True}, "never 'replaced' on a retry"


def test_without_an_id_the_same_command_applies_again():
    s1, first = entry(ClusterState(), C.put_model(model("extra").build(), 1.0))
    s2, second = entry(s1, C.put_model(model("extra").build(), 1.0))
    assert (first.plain_result(), second.plain_result()) == ({"created": True}, {"created": False})
    assert s2.revision == 2 and s2.outcomes == (), "nothing is remembered for a command without an id"


def test_an_id_used_for_a_different_command_is_refused_and_keeps_the_first_outcome():
    s1, first = entry(ClusterState(), C.with_cid(C.put_setting("serving.stopped", True, 1.0), "k:1"))
    s2, other = entry(s1, C.with_cid(C.put_setting("serving.stopped", False, 2.0), "k:1"))
    assert not other.ok and other.code == "idempotency_key_reused"
    assert s2.settings == s1.settings and s2.revision == s1.revision + 1
    assert s2.refusals[-1].code == "idempotency_key_reused" and s2.refusals[-1].cid == "k:1"
    assert s2.outcome("k:1") == first
    with pytest.raises(C.CommandError) as info:
        C.replay(s2, C.with_cid(C.put_setting("serving.stopped", False, 3.0), "k:1"))
    assert info.value.code == "idempotency_key_reused"


def test_the_digest_ignores_time_and_id_only():
    a = C.put_setting("notify.webhooks", HOOKS, 1.0)
    assert C.digest(a) == C.digest(C.with_cid({**a, "at": 7.0}, "k:x"))
    assert C.digest(a) != C.digest(C.put_setting("notify.webhooks", HOOKS[:1], 1.0))


@pytest.mark.parametrize("cid", ["", 5, ["k"], "x" * (C.CID_MAX_CHARS + 1)])
def test_a_malformed_id_is_refused_before_the_log(cid):
    with pytest.raises(C.CommandError) as info:
        C.decode(C.encode({**C.put_setting("serving.stopped", True, 1.0), "cid": cid}))
    assert info.value.code == "bad_command"


# --- a committed command that no longer applies: a recorded no-op --------------------------------------------


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (C.remove_model("ghost", 5.0), "model_not_found"),
        (C.retry_model("ghost", 5.0), "model_not_found"),
        (C.add_placement("ghost", "n1", (), "h", 5.0), "model_not_found"),
        (C.add_placement("demo", "n1", (0,), "h", 5.0), "gpu_taken"),
    ],
)
def test_a_stale_command_becomes_a_recorded_no_op(command, code):
    s = state_with([model("demo")], [placed("demo", "n1", (0,))])
    with pytest.raises(C.CommandError):
        C.apply(s, command)  # direct callers still get the refusal raised
    s2, outcome = entry(s, command)
    assert (outcome.ok, outcome.code) == (False, code) and outcome.message
    assert s2.revision == s.revision + 1
    assert (s2.models, s2.placements, s2.settings, s2.keys, s2.health, s2.next_replica) == (
        s.models, s.placements, s.settings, s.keys, s.health, s.next_replica)
    refusal = s2.refusals[-1]
    assert (refusal.revision, refusal.op, refusal.code, refusal.at) == (s2.revision, command["op"], code, 5.0)
    assert s2.outcomes == (), "no id, nothing remembered but the refusal"


def test_a_stale_command_with_an_id_records_its_refusal_as_the_ids_outcome():
    cmd = C.with_cid(C.remove_model("ghost", 1.0), "k:gone")
    s1, refused = entry(demo_state(), cmd)
    s2, again = entry(s1, cmd)
    assert s2 is s1 and again == refused and refused.code == "model_not_found"
    with pytest.raises(C.CommandError) as info:
        C.result_of(again)
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize("blob", [b"\x80\x03pickle", b"[]", b'{"v": 2}', b'{"v": 1, "op": "model.explode", "at": 1}',
                                  b'{"v": 1, "op": "model.remove", "at": 1, "name": []}'])
def test_a_damaged_entry_becomes_a_recorded_no_op(blob):
    s = demo_state()
    s2, outcome = entry(s, blob)
    assert outcome.code == "bad_command" and s2.revision == s.revision + 1 and s2.models == s.models
    assert s2.refusals[-1].code == "bad_command"


def test_refusals_are_bounded_to_the_newest():
    s = ClusterState()
    for i in range(C.KEEP_REFUSALS + 5):
        s, _ = entry(s, C.remove_model(f"ghost{i}", float(i)))
    assert len(s.refusals) == C.KEEP_REFUSALS
    assert s.refusals[0].message == "no model named 'ghost5'" and s.refusals[-1].revision == s.revision


def test_the_refusal_text_kept_is_bounded():
    s, outcome = entry(ClusterState(), C.remove_model("g" * 5000, 1.0))
    assert len(outcome.message) == C.MESSAGE_MAX_CHARS == len(s.refusals[-1].message)


# --- eviction: deterministic, by whole chunks, only from the log ---------------------------------------------


def fill(n: int) -> ClusterState:
    s = ClusterState()
    for i in range(n):
        s, _ = entry(s, C.with_cid(C.put_setting("serving.stopped", i % 2 == 0, float(i)), f"k:{i}"))
    return s


def test_at_least_ten_thousand_ids_are_kept_and_the_oldest_go_first():
    capacity = C.OUTCOME_CHUNK * C.OUTCOME_CHUNKS
    s = fill(capacity + 1)
    kept = sum(len(chunk) for chunk in s.outcomes)
    assert 10_000 <= kept <= capacity
    assert kept == capacity - C.OUTCOME_CHUNK + 1, "the oldest chunk went whole"
    assert s.outcome("k:0") is None and s.outcome(f"k:{C.OUTCOME_CHUNK - 1}") is None
    assert s.outcome(f"k:{C.OUTCOME_CHUNK}") is not None and s.outcome(f"k:{capacity}") is not None
    assert all(type(c) is MappingProxyType for c in s.outcomes)
    # An id too old to be remembered is applied again: the window is documented.
    s2, again = entry(s, C.with_cid(C.put_setting("serving.stopped", True, 0.0), "k:0"))
    assert again.ok and s2.revision == s.revision + 1


def test_eviction_depends_only_on_the_log():
    n = C.OUTCOME_CHUNK * C.OUTCOME_CHUNKS + 3
    a, b = fill(n), fill(n)
    assert a == b and pickle.dumps(a) == pickle.dumps(b)
    assert [list(c) for c in a.outcomes] == [list(c) for c in b.outcomes]
    # ... and survives the snapshot round trip (the pickled form today).
    assert pickle.loads(pickle.dumps(a)) == a


def test_outcomes_and_refusals_are_read_only_plain_data():
    s, _ = entry(ClusterState(), C.with_cid(C.put_setting("notify.webhooks", HOOKS, 1.0), "k:1"))
    s, _ = entry(s, C.with_cid(C.remove_model("ghost", 2.0), "k:2"))
    recorded = s.outcome("k:1")
    assert recorded is not None
    assert recorded.result == {"key": "notify.webhooks", "value": tuple(HOOKS)}
    with pytest.raises(TypeError):
        recorded.result["key"] = "x"  # type: ignore[index]
    assert json.dumps(recorded.plain_result()) == json.dumps({"key": "notify.webhooks", "value": HOOKS})
    loaded = pickle.loads(pickle.dumps(s))
    assert loaded == s and loaded.outcome("k:2") == s.outcome("k:2")
    # A state built from plain containers (a snapshot reader) is made read-only.
    rebuilt = ClusterState(outcomes=[dict(c) for c in s.outcomes], refusals=list(s.refusals))  # type: ignore[arg-type]
    assert rebuilt.outcomes == s.outcomes and type(rebuilt.outcomes[0]) is MappingProxyType
    assert type(rebuilt.refusals) is tuple


# --- the memory store: the same semantics as the Raft store --------------------------------------------------


def test_memory_store_applies_an_id_once_and_logs_it_once():
    store = MemoryStore()
    cmd = C.with_cid(C.put_model(model("extra").build(), 1.0), "k:1")
    assert store.submit_nowait(cmd) == {"created": True}
    revision = store.snapshot().revision
    assert store.submit_nowait(cmd) == {"created": True}
    assert store.snapshot().revision == revision and len(store.log) == 1


def test_memory_store_refuses_before_the_log_what_would_be_refused_now():
    store = MemoryStore(demo_state())
    before = store.snapshot()
    with pytest.raises(C.CommandError):
        store.submit_nowait(C.with_cid(C.remove_model("ghost", 1.0), "k:1"))
    assert store.snapshot() is before and store.log == []


# --- properties -----------------------------------------------------------------------------------------------

NAMES = ["a", "b"]
commands_ = st.one_of(
    st.builds(lambda n: C.put_model(model(n).build(), 1.0), st.sampled_from(NAMES)),
    st.builds(lambda n: C.remove_model(n, 1.0), st.sampled_from(NAMES)),
    st.builds(lambda n: C.retry_model(n, 1.0), st.sampled_from(NAMES)),
    st.builds(lambda v: C.put_setting("notify.webhooks", v, 1.0), st.lists(st.sampled_from(HOOKS), max_size=2)),
    st.builds(lambda v: C.put_setting("health.park_after_failures", v, 1.0), st.integers(1, 3)),
    st.builds(lambda k: C.add_key(hash_key(k), k, "client", 1.0), st.sampled_from(["k1", "k2"])),
    st.builds(lambda n, g: C.add_placement(n, "n1", (g,), "h", 1.0), st.sampled_from(NAMES), st.integers(0, 2)),
    st.builds(lambda n, i: C.remove_placement(f"{n}-r{i}", 1.0), st.sampled_from(NAMES), st.integers(1, 6)),
    st.builds(lambda n: C.start_failed(n, f"{n}-r1", "boom", 1.0), st.sampled_from(NAMES)),
    st.builds(lambda n: C.became_ready(n, 1.0), st.sampled_from(NAMES)),
)


def run(log: list[dict[str, Any]]) -> tuple[ClusterState, list[Outcome]]:
    s, outcomes = ClusterState(), []
    for command in log:
        s, outcome = entry(s, command)
        outcomes.append(outcome)
    return s, outcomes


@settings(max_examples=150, deadline=None)
@given(st.lists(commands_, max_size=20), st.data())
def test_retries_anywhere_later_in_the_log_change_nothing(history, data):
    """Each command has an id; any of them may be committed again later (a client's retry,
    interleaved with other writes): the final state and every answer are as if sent once."""
    log = [C.with_cid(c, f"k:{i}") for i, c in enumerate(history)]
    once, answers = run(log)
    retried = list(log)
    for i, command in enumerate(log):
        for _ in range(data.draw(st.integers(0, 2), label=f"retries of {i}")):
            where = data.draw(st.integers(0, len(retried)), label="where")
            retried.insert(max(where, retried.index(command) + 1), {**command, "at": 2.0})
    twice, replies = run(retried)
    assert twice == once
    answer_of = {c["cid"]: answer for c, answer in zip(log, answers, strict=True)}
    assert all(reply == answer_of[c["cid"]] for c, reply in zip(retried, replies, strict=True))


@settings(max_examples=100, deadline=None)
@given(st.lists(commands_, max_size=20))
def test_applying_a_log_twice_with_ids_is_applying_it_once(history):
    log = [C.with_cid(c, f"k:{i}") for i, c in enumerate(history)]
    once, _ = run(log)
    assert run(log + log)[0] == once


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {"v": st.just(1) | JSONISH, "op": st.sampled_from(sorted(C._OPS)) | JSONISH, "at": st.floats() | JSONISH},
        optional={"cid": st.text(max_size=3) | JSONISH, "name": JSONISH, "model": JSONISH, "key": JSONISH,
                  "value": JSONISH, "key_hash": JSONISH, "role": JSONISH, "node": JSONISH, "gpus": JSONISH,
                  "replica_id": JSONISH, "error": JSONISH},
    )
)
def test_apply_entry_never_raises(command):
    s = demo_state()
    s2, outcome = entry(s, command)
    assert s2.revision in (s.revision, s.revision + 1)
    if not outcome.ok:
        assert outcome.code and s2.refusals[-1].code == outcome.code
    blob = json.dumps(command).encode()
    entry(s, blob)
    entry(s, blob[: len(blob) // 2])
