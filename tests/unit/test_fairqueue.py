"""The fair queue (llmgw/gateway/fairqueue.py): classes served strictly in order, keys of a class by turns,
a bound per class, promotion after waiting `promote_s` in a class; by example and by property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.priority import CLASSES, RANK
from llmgw.gateway.fairqueue import Entry, FairQueue, Full

SYSTEM, INTERACTIVE, DEFAULT, BULK = (RANK[c] for c in CLASSES)
LONG = 1e9  # a promotion that never comes within a test


def drain(q: FairQueue[str], now: float = 0.0) -> list[str]:
    out = []
    while (entry := q.pop(now)) is not None:
        out.append(entry.item)
    return out


def test_a_key_with_one_request_is_served_within_two_grants_of_a_flooding_key() -> None:
    q: FairQueue[str] = FairQueue(LONG, (1000,) * 4)
    for i in range(100):
        q.push(f"a{i}", "A", DEFAULT, 0.0)
    q.push("b0", "B", DEFAULT, 0.0)
    assert drain(q)[:3] == ["a0", "b0", "a1"]


def test_keys_take_turns_and_each_key_is_first_come_first_served() -> None:
    q: FairQueue[str] = FairQueue(LONG, (1000,) * 4)
    for i in range(3):
        q.push(f"a{i}", "A", DEFAULT, 0.0)
    for i in range(2):
        q.push(f"b{i}", "B", DEFAULT, 0.0)
    q.push("c0", "C", DEFAULT, 0.0)
    assert drain(q) == ["a0", "b0", "c0", "a1", "b1", "a2"]


def test_classes_are_strict() -> None:
    q: FairQueue[str] = FairQueue(LONG, (1000,) * 4)
    q.push("bulk", "A", BULK, 0.0)
    q.push("default", "A", DEFAULT, 0.0)
    q.push("system", "B", SYSTEM, 0.0)
    q.push("interactive", "C", INTERACTIVE, 0.0)
    assert drain(q) == ["system", "interactive", "default", "bulk"]


def test_each_class_has_its_bound_and_a_removed_request_frees_its_place() -> None:
    q: FairQueue[str] = FairQueue(LONG, (1, 1, 2, 1))
    q.push("b1", "A", BULK, 0.0)
    with pytest.raises(Full) as full:
        q.push("b2", "B", BULK, 0.0)
    assert (full.value.rank, full.value.bound) == (BULK, 1) and "class bulk" in str(full.value)
    entry = q.push("d1", "A", DEFAULT, 0.0)  # another class still has room
    q.push("d2", "A", DEFAULT, 0.0)
    with pytest.raises(Full):
        q.push("d3", "A", DEFAULT, 0.0)
    q.remove(entry)
    q.push("d3", "A", DEFAULT, 0.0)
    assert (len(q), q.waiting(DEFAULT), q.waiting(BULK)) == (3, 2, 1)
    assert drain(q) == ["d2", "d3", "b1"]


def test_a_waiting_request_moves_up_one_class_per_promote_s() -> None:
    q: FairQueue[str] = FairQueue(10.0, (1000,) * 4)
    q.push("old bulk", "A", BULK, 0.0)
    q.push("default", "B", DEFAULT, 5.0)
    q.push("interactive", "C", INTERACTIVE, 9.0)
    # At 10 s the bulk request joins default (behind B's, which came first there): interactive still first.
    first = q.pop(10.0)
    assert first is not None and first.item == "interactive"
    assert q.waiting(DEFAULT) == 2 and q.waiting(BULK) == 0 and q.promotions == 1
    # B's default request waited 10 s at 15 s and moves to interactive; A's at 20 s (10 s after its move).
    second = q.pop(15.0)
    assert second is not None and second.item == "default" and second.rank == INTERACTIVE and second.asked == DEFAULT
    third = q.pop(20.0)
    assert third is not None and third.item == "old bulk" and (third.rank, third.asked) == (INTERACTIVE, BULK)
    assert q.pop(20.0) is None


def test_a_promoted_request_is_never_refused_and_a_bound_is_checked_only_on_arrival() -> None:
    q: FairQueue[str] = FairQueue(1.0, (1, 1, 1, 1))
    q.push("d", "A", DEFAULT, 0.0)
    q.push("b", "B", BULK, 0.0)
    q.push("s", "C", SYSTEM, 0.0)
    first = q.pop(1.0)  # b moved up to default, d to interactive: default holds one, within its bound
    assert first is not None and first.item == "s"
    assert (q.waiting(INTERACTIVE), q.waiting(DEFAULT)) == (1, 1)
    assert drain(q, 1.0) == ["d", "b"]


# --- properties -------------------------------------------------------------------------------------

Push = st.tuples(st.sampled_from("ABCD"), st.sampled_from(range(len(CLASSES))))


@settings(max_examples=200, deadline=None)
@given(st.lists(Push, min_size=1, max_size=60))
def test_without_promotion_classes_are_strict_and_a_key_waits_at_most_one_turn_of_each_other_key(
        pushes: list[tuple[str, int]]) -> None:
    q: FairQueue[int] = FairQueue(LONG, (1000,) * 4)
    for i, (key, rank) in enumerate(pushes):
        q.push(i, key, rank, 0.0)
    served = drain_entries(q)
    assert [e.item for e in served] != [] and len(served) == len(pushes)
    # Strict classes: the classes come out in order.
    ranks = [e.rank for e in served]
    assert ranks == sorted(ranks)
    for rank in range(len(CLASSES)):
        mine = [e for e in served if e.rank == rank]
        # Each key's own requests first come first served.
        for key in "ABCD":
            items = [e.item for e in mine if e.key == key]
            assert items == sorted(items)
        # Between two grants of one key, every other key with requests still waiting gets at most one.
        for key in {e.key for e in mine}:
            left = sum(e.key == key for e in mine)
            others: dict[str, int] = {}
            for e in mine:
                if e.key == key:
                    left -= 1
                    others = {}
                    if not left:
                        break
                else:
                    others[e.key] = others.get(e.key, 0) + 1
                    assert others[e.key] <= 1


def drain_entries(q: FairQueue[int], now: float = 0.0) -> list[Entry[int]]:
    out = []
    while (entry := q.pop(now)) is not None:
        out.append(entry)
    return out


Op = st.one_of(
    st.tuples(st.just("push"), Push, st.floats(0, 5)),
    st.tuples(st.just("pop"), st.just(("", 0)), st.floats(0, 5)),
    st.tuples(st.just("cancel"), st.just(("", 0)), st.floats(0, 5)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(Op, max_size=80), st.lists(st.integers(1, 6), min_size=4, max_size=4))
def test_counts_bounds_and_promotion_hold_under_any_sequence(ops: list[tuple[str, tuple[str, int], float]],
                                                             bounds: list[int]) -> None:
    """Whatever comes and goes: every pushed request is served or cancelled once, a push past its class's
    bound is refused (and only then), and nothing popped has waited `promote_s` or more in a class below
    the top while the class above held one that had not."""
    promote_s = 3.0
    q: FairQueue[int] = FairQueue(promote_s, bounds)
    now = 0.0
    waiting: dict[int, Entry[int]] = {}
    served: set[int] = set()
    for n, (op, (key, rank), step) in enumerate(ops):
        now += step
        if op == "push":
            full = q.waiting(rank) >= bounds[rank]
            try:
                waiting[n] = q.push(n, key, rank, now)
                assert not full
            except Full as e:
                assert full and e.rank == rank
        elif op == "pop":
            entry = q.pop(now)
            assert (entry is None) == (not waiting)
            if entry is not None:
                assert entry.item in waiting and entry.item not in served
                # Served from the highest class that holds anything, after promotion.
                assert all(e.rank >= entry.rank for e in waiting.values())
                assert entry.rank <= entry.asked and now - entry.since < promote_s or entry.rank == 0
                served.add(entry.item)
                del waiting[entry.item]
        elif waiting:
            item = min(waiting)
            q.remove(waiting.pop(item))
        assert len(q) == len(waiting) == sum(q.waiting(r) for r in range(len(CLASSES)))
    assert sorted(e.item for e in drain_entries(q, now)) == sorted(waiting)
