"""The linearizability checker: classic histories it must accept and reject, unknown outcomes,
per-key partitions, agreement with a brute-force search, and histories made by a real dict."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from tests.support.linearizability import (
    KV_MODEL,
    UNKNOWN,
    CheckResult,
    KvInput,
    KvOutput,
    Model,
    Operation,
    Planned,
    Verdict,
    check,
    delete,
    get,
    never,
    put,
    random_plan,
    run_on_dict,
    single_partition,
)

Op = Operation[KvInput, KvOutput]
WHOLE = dataclasses.replace(KV_MODEL, partition=single_partition)  # the same register, never split


def op(client: int, inp: KvInput, call: float, ret: float | None, output: KvOutput = None) -> Op:
    return Operation(client, inp, call, output, ret)


def verdict(history: Sequence[Op]) -> Verdict:
    return check(KV_MODEL, history).verdict


# --- classic histories ---------------------------------------------------------------------------


def test_a_read_of_a_value_never_written_is_illegal() -> None:
    history = [op(0, put("x", "a"), 0, 1), op(1, get("x"), 0.5, 2, "b")]
    result = check(KV_MODEL, history)
    assert result.verdict is Verdict.ILLEGAL and not result.ok
    assert result.stuck == history[1]
    assert "get('x') -> 'b'" in str(result) and "does not fit" in str(result)


def test_a_stale_read_after_a_completed_write_is_illegal() -> None:
    # The write returned at 1; the read started at 2 and still saw nothing.
    history = [op(0, put("x", "a"), 0, 1), op(1, get("x"), 2, 3, None)]
    result = check(KV_MODEL, history)
    assert result.verdict is Verdict.ILLEGAL
    assert result.partition == "key 'x'"
    assert result.prefix == (history[0],) and result.stuck == history[1]
    text = str(result)
    assert "longest linearizable prefix found: 1 operation\n" in text
    assert "state after it: {'x': 'a'}" in text
    assert "cannot place next: client 1: get('x') -> None [2, 3]" in text


@pytest.mark.parametrize("seen", [None, "a"])
def test_a_read_concurrent_with_a_write_may_see_either_side(seen: str | None) -> None:
    history = [op(0, put("x", "a"), 0, 2), op(1, get("x"), 1, 3, seen)]
    assert verdict(history) is Verdict.OK


def test_operations_that_touch_in_time_count_as_concurrent() -> None:
    # The read is called at the very instant the write returns: either order is allowed.
    assert verdict([op(0, put("x", "a"), 0, 1), op(1, get("x"), 1, 2, None)]) is Verdict.OK
    assert verdict([op(0, put("x", "a"), 0, 1), op(1, get("x"), 1.001, 2, None)]) is Verdict.ILLEGAL


def test_the_new_old_inversion_is_not_linearizable() -> None:
    """The textbook register history: two reads overlap one long write; the first sees the new
    value, the second (called after the first returned) sees the old one. Each read alone could be
    explained, and a merely regular register allows it, but no single order explains both."""
    history = [
        op(0, put("x", "1"), 0, 10),
        op(1, get("x"), 1, 2, "1"),
        op(2, get("x"), 3, 4, None),
    ]
    result = check(KV_MODEL, history)
    assert result.verdict is Verdict.ILLEGAL
    assert result.stuck == history[2]
    # The same reads the other way round (old, then new) are linearizable.
    history[1], history[2] = op(1, get("x"), 1, 2, None), op(2, get("x"), 3, 4, "1")
    assert verdict(history) is Verdict.OK


def test_a_sequential_history_is_judged_by_the_dict_alone() -> None:
    history = [
        op(0, put("x", "a"), 0, 1), op(0, get("x"), 2, 3, "a"), op(1, delete("x"), 4, 5),
        op(1, get("x"), 6, 7, None), op(2, put("x", "b"), 8, 9), op(2, get("x"), 10, 11, "b"),
    ]
    assert verdict(history) is Verdict.OK
    # A read after the delete that still sees the old value.
    assert verdict([*history[:3], op(1, get("x"), 6, 7, "a")]) is Verdict.ILLEGAL


def test_the_explanation_gives_the_longest_prefix_not_the_first_dead_end() -> None:
    # The search first tries the write at once (dead end at the first read), then after one read
    # (dead end at the second); the longest prefix puts the write after two reads and breaks at R4.
    w1 = op(0, put("x", "a"), 0, 10)
    r1, r2, r3, r4 = (op(1, get("x"), 1, 2, None), op(1, get("x"), 3, 4, None),
                      op(1, get("x"), 5, 6, "a"), op(1, get("x"), 7, 8, None))
    result = check(KV_MODEL, [w1, r1, r2, r3, r4])
    assert result.verdict is Verdict.ILLEGAL
    assert result.prefix == (r1, r2, w1, r3) and result.stuck == r4


def test_a_long_prefix_is_shortened_in_the_text_but_kept_whole() -> None:
    writes = [op(0, put("x", f"v{n}"), 2 * n, 2 * n + 1) for n in range(20)]
    result = check(KV_MODEL, [*writes, op(1, get("x"), 100, 101, "v3")])
    assert result.prefix == tuple(writes)
    text = str(result)
    assert "... 8 earlier" in text and "  9. " in text and "  8. " not in text and " 20. " in text


# --- unknown outcomes ----------------------------------------------------------------------------


def test_a_write_of_unknown_outcome_may_explain_a_later_read() -> None:
    history = [op(0, put("x", "a"), 0, None), op(1, get("x"), 5, 6, "a")]
    assert verdict(history) is Verdict.OK


def test_a_write_of_unknown_outcome_may_never_have_happened() -> None:
    history = [op(0, put("x", "a"), 0, None), op(1, get("x"), 5, 6, None), op(1, get("x"), 7, 8, None)]
    assert verdict(history) is Verdict.OK


def test_a_write_of_unknown_outcome_cannot_be_read_and_then_unread() -> None:
    history = [op(0, put("x", "a"), 0, None), op(1, get("x"), 5, 6, "a"), op(2, get("x"), 7, 8, None)]
    result = check(KV_MODEL, history)
    assert result.verdict is Verdict.ILLEGAL
    assert result.stuck == history[2]
    assert "put('x', 'a') (outcome unknown) [0, never returned]" in str(result)


def test_a_write_of_unknown_outcome_cannot_take_effect_before_its_call() -> None:
    history = [op(1, get("x"), 0, 1, "a"), op(0, put("x", "a"), 2, None)]
    assert verdict(history) is Verdict.ILLEGAL


def test_a_read_of_unknown_outcome_constrains_nothing() -> None:
    history: list[Op] = [op(0, put("x", "a"), 0, 1), Operation(1, get("x"), 2, "zzz", None)]
    assert verdict(history) is Verdict.OK


def test_the_model_is_told_an_outcome_is_unknown() -> None:
    seen: list[object] = []

    def step(state: int, inp: str, out: object) -> tuple[bool, int]:
        seen.append(out)
        return True, state + 1

    model: Model[int, str, object] = Model(init=lambda: 0, step=step)
    history: list[Operation[str, object]] = [Operation(0, "w", 0, "ignored", None), Operation(1, "r", 1, "done", 2)]
    assert check(model, history).ok
    assert UNKNOWN in seen and "ignored" not in seen and "done" in seen


# --- partitions ----------------------------------------------------------------------------------


def test_keys_are_checked_independently_and_the_failing_one_is_named() -> None:
    good = [op(0, put("a", "1"), 0, 1), op(1, get("a"), 2, 3, "1")]
    bad = [op(2, put("b", "1"), 0, 1), op(3, get("b"), 2, 3, None)]
    result = check(KV_MODEL, [good[0], bad[0], good[1], bad[1]])
    assert result.verdict is Verdict.ILLEGAL and result.partition == "key 'b'"
    assert result.stuck == bad[1]
    ok = check(KV_MODEL, [*good, op(2, put("b", "2"), 0, 1), op(3, get("b"), 2, 3, "2")])
    assert ok.ok and "in 2 partitions" in str(ok)


def test_a_read_of_another_key_is_not_confused_with_this_one() -> None:
    history = [op(0, put("a", "1"), 0, 1), op(1, get("b"), 2, 3, None), op(1, get("a"), 4, 5, "1")]
    assert check(KV_MODEL, history).ok and check(WHOLE, history).ok
    wrong = [op(0, put("a", "1"), 0, 1), op(1, get("b"), 2, 3, "1")]
    assert not check(KV_MODEL, wrong).ok and not check(WHOLE, wrong).ok


# --- agreement with a brute-force search --------------------------------------------------------


def brute_force(history: Sequence[Op]) -> bool:
    """Every subset of the pending operations, every order of what is kept: is one of them legal?"""
    done = [o for o in history if not o.pending]
    pending = [o for o in history if o.pending]
    for r in range(len(pending) + 1):
        for kept in itertools.combinations(pending, r):
            for order in itertools.permutations([*done, *kept]):
                if _respects_real_time(order) and _accepted(order):
                    return True
    return False


def _respects_real_time(order: Sequence[Op]) -> bool:
    # b may not come before a when b returned strictly before a was called.
    return not any(
        b.return_time is not None and b.return_time < a.call_time
        for i, a in enumerate(order) for b in order[i + 1:]
    )


def _accepted(order: Sequence[Op]) -> bool:
    state = KV_MODEL.init()
    for o in order:
        ok, state = KV_MODEL.step(state, o.input, UNKNOWN if o.pending else o.output)
        if not ok:
            return False
    return True


_small_inputs = st.one_of(
    st.builds(put, st.sampled_from("ab"), st.sampled_from(["x", "y"])),
    st.builds(get, st.sampled_from("ab")),
    st.builds(delete, st.sampled_from("ab")),
)


@st.composite
def small_histories(draw: st.DrawFn) -> list[Op]:
    """Any outputs at all (mostly not linearizable), on a coarse clock so that times often tie."""
    history = []
    for client in range(draw(st.integers(1, 6))):
        inp = draw(_small_inputs)
        call = draw(st.integers(0, 6))
        ret = None if draw(st.integers(0, 4)) == 0 else call + draw(st.integers(0, 4))
        output = draw(st.sampled_from([None, "x", "y"])) if inp.op == "get" else None
        history.append(op(client, inp, call, ret, output))
    return history


@settings(max_examples=300, deadline=None)
@given(small_histories())
def test_the_checker_agrees_with_brute_force(history: list[Op]) -> None:
    expected = brute_force(history)
    assert check(KV_MODEL, history).ok is expected
    assert check(WHOLE, history).ok is expected  # locality: per key or all at once, the same answer


def test_the_brute_force_examples_are_of_both_kinds() -> None:
    """The property above is only worth something if its strategy makes both verdicts."""
    assert brute_force(find(small_histories(), brute_force))
    assert not brute_force(find(small_histories(), lambda h: not brute_force(h)))


# --- histories from a real dict ------------------------------------------------------------------

_plans = st.lists(
    st.builds(
        Planned,
        client_id=st.integers(0, 3),
        input=st.one_of(
            st.builds(put, st.sampled_from(["a", "b", "c"]), st.sampled_from([f"v{n}" for n in range(6)])),
            st.builds(get, st.sampled_from(["a", "b", "c"])),
            st.builds(delete, st.sampled_from(["a", "b", "c"])),
        ),
        gap=st.floats(0, 2),
        duration=st.floats(0, 3),
        at=st.floats(0, 1),
        outcome=st.sampled_from(["ok", "ok", "ok", "unknown", "lost"]),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_plans)
def test_what_a_real_dict_did_is_always_accepted(plan: list[Planned]) -> None:
    history = run_on_dict(plan)
    result = check(KV_MODEL, history)
    assert result.ok, str(result)


@settings(max_examples=200, deadline=None)
@given(_plans, st.data())
def test_a_read_of_a_value_nobody_wrote_is_always_rejected(plan: list[Planned], data: st.DataObject) -> None:
    history = run_on_dict(plan)
    reads = [n for n, o in enumerate(history) if o.input.op == "get" and not o.pending]
    if not reads:
        plan = [*plan, Planned(0, get("a"))]
        history = run_on_dict(plan)
        reads = [len(history) - 1]
    n = data.draw(st.sampled_from(reads))
    history[n] = dataclasses.replace(history[n], output="never-written")
    result = check(KV_MODEL, history)
    assert result.verdict is Verdict.ILLEGAL
    assert result.partition == f"key {history[n].input.key!r}"
    assert history[n] not in result.prefix


def test_a_large_history_from_a_dict_is_accepted() -> None:
    """2,000 operations, 20 keys, 8 clients, some outcomes unknown (tests/bench/linearizability.py
    times this shape; here only the verdict counts)."""
    history = run_on_dict(random_plan(random.Random(6), 2000, keys=20, clients=8, unknown=0.05))
    assert check(KV_MODEL, history).ok


# --- memoization and the timeout -----------------------------------------------------------------


class CountingClock:
    """A clock that moves one second each time it is read: a timeout counts work, not wall time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def _many_concurrent_writes_then_an_impossible_read(n: int) -> list[Op]:
    writes = [op(c, put("x", f"v{c}"), 0, 10) for c in range(n)]
    return [*writes, op(n, get("x"), 20, 21, "never-written")]


def test_memoization_keeps_a_factorial_search_small() -> None:
    # Without the memo this search visits every order of 10 writes (10! = 3.6 million prefixes and
    # more) before it can say illegal; with it, each (set of writes, last value) once.
    clock = CountingClock()
    result = check(KV_MODEL, _many_concurrent_writes_then_an_impossible_read(10), timeout=200, clock=clock)
    assert result.verdict is Verdict.ILLEGAL
    assert clock.now < 200  # the clock is read once per 1,024 steps: fewer than ~200k steps


def test_a_read_that_fit_is_never_tried_in_a_second_place() -> None:
    # 14 reads and a write, all concurrent, then a read nobody can explain. Every subset of the reads
    # is a distinct memo entry (2^14 of them); a read changes no state, so once it fits, placing it
    # later instead cannot help, and the search does not try.
    reads = [op(c, get("x"), 0, 10, None) for c in range(1, 15)]
    history = [op(0, put("x", "a"), 0, 10), *reads, op(99, get("x"), 20, 21, "never-written")]
    clock = CountingClock()
    assert check(KV_MODEL, history, timeout=10, clock=clock).verdict is Verdict.ILLEGAL
    assert clock.now < 10
    # The same model told nothing about reads has to walk the subsets (and runs out of time here).
    slow = check(dataclasses.replace(KV_MODEL, read_only=never), history, timeout=10, clock=CountingClock())
    assert slow.verdict is Verdict.UNKNOWN


def test_writes_of_unknown_outcome_that_nobody_read_are_left_out() -> None:
    # 14 timed-out writes nobody read: with or without each, the same reads hold, so the key's
    # sub-history drops them instead of searching every subset of them.
    lost = [op(c, put("x", f"lost{c}"), 0, None) for c in range(14)]
    history = [*lost, op(20, put("x", "a"), 0, 1), op(21, get("x"), 5, 6, "b")]
    assert [o.input.value for o in KV_MODEL.partition(history)["key 'x'"]] == ["a", None]
    clock = CountingClock()
    assert check(KV_MODEL, history, timeout=10, clock=clock).verdict is Verdict.ILLEGAL
    assert clock.now < 10
    # One that was read stays: it explains the read.
    seen = [*lost, op(21, get("x"), 5, 6, "lost3")]
    assert lost[3] in KV_MODEL.partition(seen)["key 'x'"] and check(KV_MODEL, seen).ok


def test_a_search_past_its_timeout_is_unknown_not_ok() -> None:
    clock = CountingClock()
    result = check(KV_MODEL, _many_concurrent_writes_then_an_impossible_read(10), timeout=3, clock=clock)
    assert result.verdict is Verdict.UNKNOWN and not result.ok
    assert result.partition == "key 'x'" and "gave up after 3 s" in str(result)


# --- inputs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: op(0, get("x"), 2, 1), "not before call_time"),
        (lambda: op(0, get("x"), 0, float("inf")), "must be finite"),
        (lambda: op(0, get("x"), float("nan"), 1), "call_time must be finite"),
        (lambda: KvInput("put", "x"), "put takes a value"),
        (lambda: KvInput("get", "x", "v"), "get takes no value"),
    ],
)
def test_malformed_operations_are_refused(make: Callable[[], object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make()


def test_an_empty_history_is_linearizable() -> None:
    result: CheckResult[KvInput, KvOutput] = check(KV_MODEL, [])
    assert result.ok and result.stuck is None
