"""ReadIndex (llmgw/store/readindex.py): a read is confirmed only after a majority of the group,
counting the leader, answered a probe sent after the read arrived, in the leader's term, and
after the leader applied the commit index of that round. Pure: views and times in, verdicts out."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.store.readindex import Confirmed, Probe, RaftView, Read, ReadIndex, Refused, Verdict, majority_seq

PEERS = frozenset({"b", "c"})
LEADING = RaftView(leading=True, term=3, commit_index=10, settled=True, last_applied=10, voters=PEERS)


class Reader:
    """One read and what it was told."""

    def __init__(self, index: ReadIndex) -> None:
        self.verdicts: list[Verdict] = []
        self.read: Read = index.ask(self.verdicts.append)


def deliver(index: ReadIndex, view: RaftView, now: float = 0.0) -> Probe | None:
    verdicts, probe = index.look(view, now)
    for done, verdict in verdicts:
        done(verdict)
    return probe


def test_a_read_waits_for_a_majority_answer_to_a_probe_sent_after_it() -> None:
    index = ReadIndex(resend_s=0.05)
    early = Reader(index)
    probe = deliver(index, LEADING)
    assert probe == Probe(term=3, seq=1)
    late = Reader(index)  # arrives after probe 1 went out: probe 1's answers prove nothing for it
    assert deliver(index, LEADING) == Probe(term=3, seq=2)
    index.acked("b", 3, 1)
    deliver(index, LEADING)
    assert early.verdicts == [Confirmed()] and late.verdicts == []
    index.acked("b", 3, 2)
    deliver(index, LEADING)
    assert late.verdicts == [Confirmed()]


def test_the_leader_alone_is_no_majority_of_three() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    deliver(index, LEADING)
    for now in (0.01, 0.5, 5.0):
        deliver(index, LEADING, now)
    assert reader.verdicts == []


def test_an_answer_from_another_term_counts_for_nothing() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    deliver(index, LEADING)
    index.acked("b", 2, 1)
    index.acked("c", 4, 1)
    deliver(index, LEADING)
    assert reader.verdicts == []


def test_a_new_term_starts_the_waiting_reads_again() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    deliver(index, LEADING)
    index.acked("b", 3, 1)
    newer = replace(LEADING, term=5)
    assert deliver(index, newer) == Probe(term=5, seq=2)  # answers of term 3 are forgotten
    assert reader.verdicts == []
    index.acked("c", 5, 2)
    deliver(index, newer)
    assert reader.verdicts == [Confirmed()]


def test_no_round_before_the_commit_index_covers_the_leaders_term() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    assert deliver(index, replace(LEADING, settled=False)) is None
    index.acked("b", 3, 1)
    deliver(index, replace(LEADING, settled=False))
    assert reader.verdicts == []
    assert deliver(index, LEADING) == Probe(term=3, seq=1)


def test_a_confirmed_round_waits_until_its_read_index_is_applied() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    deliver(index, replace(LEADING, commit_index=12, last_applied=11))
    index.acked("c", 3, 1)
    deliver(index, replace(LEADING, commit_index=12, last_applied=11))
    assert reader.verdicts == []
    deliver(index, replace(LEADING, commit_index=13, last_applied=12))
    assert reader.verdicts == [Confirmed()]


def test_a_member_that_stops_leading_refuses_every_waiting_read() -> None:
    index = ReadIndex(resend_s=0.05)
    started, waiting = Reader(index), None
    deliver(index, LEADING)
    waiting = Reader(index)
    deliver(index, replace(LEADING, leading=False, leader="b"))
    refused = Refused("this member no longer leads", "b")
    assert started.verdicts == [refused] and waiting.verdicts == [refused]
    assert index.waiting() == 0


def test_an_unanswered_round_is_probed_again() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    assert deliver(index, LEADING, 0.0) == Probe(3, 1)
    assert deliver(index, LEADING, 0.01) is None
    assert deliver(index, LEADING, 0.06) == Probe(3, 2)  # probe 1 may have died with its connection
    index.acked("b", 3, 2)
    deliver(index, LEADING, 0.07)
    assert reader.verdicts == [Confirmed()]


def test_a_group_of_one_confirms_at_its_first_look() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    deliver(index, replace(LEADING, voters=frozenset()))
    assert reader.verdicts == [Confirmed()]


def test_a_withdrawn_read_is_forgotten() -> None:
    index = ReadIndex(resend_s=0.05)
    reader = Reader(index)
    deliver(index, LEADING)
    index.withdraw(reader.read)
    index.acked("b", 3, 1)
    deliver(index, LEADING)
    assert reader.verdicts == [] and index.waiting() == 0


def test_majority_seq_by_example() -> None:
    assert majority_seq({}, frozenset(), 7) == 7  # alone: itself
    assert majority_seq({"b": 4}, {"b", "c"}, 7) == 4
    assert majority_seq({"b": 4, "c": 6}, {"b", "c"}, 7) == 6
    assert majority_seq({"b": 4}, {"b"}, 7) == 4  # two members: both
    assert majority_seq({"b": 9, "c": 9}, {"b", "c", "d", "e"}, 9) == 9
    assert majority_seq({"b": 9, "c": 2}, {"b", "c", "d", "e"}, 9) == 2
    assert majority_seq({"x": 9}, {"b", "c"}, 9) == 0  # not a voter: a read-only node counts for nothing


# -- the property: never a verdict without a majority's answer to a probe newer than the read ----

events = st.lists(st.one_of(
    st.tuples(st.just("read")),
    st.tuples(st.just("look")),
    st.tuples(st.just("ack"), st.sampled_from(["b", "c", "d", "e", "x"]), st.integers(0, 3)),  # the k-th newest probe
    st.tuples(st.just("stale"), st.sampled_from(["b", "c", "d", "e"]), st.integers(2, 4), st.integers(0, 12)),
    st.tuples(st.just("term"), st.integers(2, 4)),
    st.tuples(st.just("apply"), st.integers(0, 3)),
    st.tuples(st.just("settle"), st.booleans()),
), max_size=60)


@settings(max_examples=400, deadline=None)
@given(events, st.sampled_from([frozenset(), frozenset({"b", "c"}), frozenset({"b", "c", "d", "e"})]))
def test_never_confirms_without_a_majority_answering_a_probe_sent_after_the_read(
        script: list[tuple[object, ...]], voters: frozenset[str]) -> None:
    """Whatever the order of reads, looks, answers (any member, term, number), term changes and applies:
    a read confirmed was asked before a probe of the term it is confirmed in, that probe or a newer
    one of that term was answered by a majority (counting the leader), and the leader had applied
    what was committed when that probe was sent."""
    index = ReadIndex(resend_s=0.05)
    view = replace(LEADING, term=2, voters=voters, commit_index=5, last_applied=5)
    now = 0.0
    probes: list[tuple[int, int, int]] = []  # (term, seq, commit index when sent)
    answered: dict[tuple[str, int], int] = {}  # (member, term) -> newest seq it answered
    asked: list[tuple[list[Verdict], int]] = []  # each read's verdicts, and how many probes had gone out before it

    for event in script:
        now += 0.02
        kind = event[0]
        if kind == "read":
            verdicts: list[Verdict] = []
            index.ask(verdicts.append)
            asked.append((verdicts, len(probes)))
        elif kind == "ack" and probes:  # a member answers a probe that was sent
            _, node, k = event
            assert isinstance(node, str) and isinstance(k, int)
            term, seq, _ = probes[-1 - k % len(probes)]
            index.acked(node, term, seq)
            answered[(node, term)] = max(answered.get((node, term), 0), seq)
        elif kind == "stale":  # an answer from another term (an older leader's probe, delayed)
            _, node, term, seq = event
            assert isinstance(node, str) and isinstance(term, int) and isinstance(seq, int)
            if term != view.term:
                index.acked(node, term, seq)
        elif kind == "term":
            assert isinstance(event[1], int)
            view = replace(view, term=max(view.term, event[1]), settled=False)
        elif kind == "apply":
            assert isinstance(event[1], int)
            view = replace(view, commit_index=view.commit_index + event[1])
            view = replace(view, last_applied=min(view.commit_index, view.last_applied + 1))
        elif kind == "settle":
            view = replace(view, settled=bool(event[1]))
        before = {id(v): len(v) for v, _ in asked}
        decided, probe = index.look(view, now)
        for done, verdict in decided:
            done(verdict)
        if probe is not None:
            probes.append((probe.term, probe.seq, view.commit_index))
        for verdicts, probes_before in asked:
            if len(verdicts) > before[id(verdicts)] and verdicts[-1] == Confirmed():
                later = [(s, c) for t, s, c in probes[probes_before:] if t == view.term]
                backing = [
                    (s, c) for s, c in later
                    if 1 + sum(answered.get((v, view.term), 0) >= s for v in voters) > (len(voters) + 1) / 2
                ]
                assert backing, (probes_before, probes, answered, view)
                # applied what was committed when the first probe after the read went out
                assert view.last_applied >= min(c for _, c in later)
    for verdicts, _ in asked:
        assert len(verdicts) <= 1  # one verdict per read
