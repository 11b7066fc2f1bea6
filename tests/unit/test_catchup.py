"""A follower that diverged catches up, whatever the order of its answers (issue 19, point 2).

Two real pysyncobj members (the leader of term 2, the former leader of term 1 holding a suffix
of its own) are wired by a fake transport that delivers each round as TCP does under
pipelining: the leader sends its whole tail, then the follower reads all of it, then the leader
reads all the answers. pysyncobj alone never converges; `CatchesUp` does in three rounds.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj import SyncObj, SyncObjConf

from tests.support.processes import free_port
from llmgw.store.appends import KeepsMatchingEntries
from llmgw.store.catchup import CatchesUp, Floors, conflict_hint


class _Outbox:
    """A transport that keeps what its member sends, for the test to deliver."""

    ready = True

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, node: object, message: dict[str, Any]) -> bool:
        self.sent.append(pickle.loads(pickle.dumps(message)))  # a copy, as the wire makes one
        return True

    def take(self) -> list[dict[str, Any]]:
        sent, self.sent = self.sent, []
        return sent

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _Pair:
    """A leader of term 2 and a follower whose log holds `committed` entries of term 1 (its commit
    index) and `own` more of term 1 that only it holds; the leader holds the committed ones and
    `ahead` of term 2 (committed by a third member). Each entry's command is `size` bytes, and the
    leader sends at most `batch` bytes in a message: its tail goes in several."""

    def __init__(self, cls: type[SyncObj], *, committed: int, own: int, ahead: int, size: int = 40,
                 batch: int = 200) -> None:
        a, b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        conf = SyncObjConf(autoTick=False, appendEntriesBatchSizeBytes=batch)
        self.to_follower, self.to_leader = _Outbox(), _Outbox()
        self.leader = cls(a, [b], conf, transport=self.to_follower)
        self.follower = cls(b, [a], conf, transport=self.to_leader)
        self.its_leader = next(iter(self.follower.otherNodes))  # the leader, as the follower names it
        self.its_follower = next(iter(self.leader.otherNodes))
        command = bytes(size)
        for member in (self.leader, self.follower):
            for idx in range(2, 2 + committed):
                member._SyncObj__raftLog.add(command, idx, 1)
            member._SyncObj__setCurrentTerm(1, None)
        end = 1 + committed
        self.follower._SyncObj__raftCommitIndex = end
        for idx in range(end + 1, end + 1 + own):
            self.follower._SyncObj__raftLog.add(command, idx, 1)
        self.leader._SyncObj__setCurrentTerm(2, None)
        self.leader._SyncObj__onNodeConnected(self.its_follower)
        self.leader._SyncObj__onBecomeLeader()  # its no-op of term 2, then appends sent
        for idx in range(end + 2, end + 2 + ahead):
            self.leader._SyncObj__raftLog.add(command, idx, 2)
        self.leader._SyncObj__raftCommitIndex = self.leader._SyncObj__raftLog[-1][1]
        # While the follower was cut off, the leader's optimistic next index for it ran on to its end.
        self.leader._SyncObj__raftNextIndex[self.its_follower] = self.leader._SyncObj__raftLog[-1][1] + 1
        self.to_follower.take()

    def round(self) -> int:
        """The leader sends its appends; the follower reads them all, then the leader all the
        answers. Returns how many messages the leader sent."""
        self.leader._SyncObj__sendAppendEntries()
        appends = self.to_follower.take()
        for message in appends:
            self.follower._SyncObj__onMessageReceived(self.its_leader, message)
        for answer in self.to_leader.take():
            self.leader._SyncObj__onMessageReceived(self.its_follower, answer)
        return len(appends)

    def caught_up(self) -> bool:
        def entries(member: SyncObj) -> list[tuple[int, int]]:
            return [(idx, term) for _, idx, term in member._SyncObj__raftLog]

        return (entries(self.follower) == entries(self.leader)
                and self.follower._SyncObj__raftCommitIndex == self.leader._SyncObj__raftCommitIndex)

    def rounds_to_catch_up(self, limit: int) -> int | None:
        for n in range(1, limit + 1):
            self.round()
            if self.caught_up():
                return n
        return None

    def next_index(self) -> int:
        return int(self.leader._SyncObj__raftNextIndex[self.its_follower])

    def close(self) -> None:
        self.leader.destroy()
        self.follower.destroy()


@pytest.fixture
def pair() -> Iterator[Any]:
    made: list[_Pair] = []

    def make(cls: type[SyncObj], **kwargs: int) -> _Pair:
        made.append(_Pair(cls, **kwargs))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize("cls", [SyncObj, KeepsMatchingEntries])
def test_pysyncobj_alone_never_catches_up_a_former_leader(pair: Any, cls: type[SyncObj]) -> None:
    # The stall measured in issue 19: every round the follower answers the first append with a
    # conflict and the later ones with "send from my end + 1"; the last answer wins.
    p = pair(cls, committed=10, own=5, ahead=30)
    assert p.rounds_to_catch_up(50) is None
    follower_end = 1 + 10 + 5
    p.round()
    assert p.next_index() == follower_end + 1  # back where it started: past the conflicting suffix


def test_a_former_leader_catches_up_in_three_rounds(pair: Any) -> None:
    p = pair(CatchesUp, committed=10, own=5, ahead=30)
    p.round()  # the leader's previous entry lies past the follower's end
    assert p.next_index() == 17  # its end (16) + 1
    p.round()  # answers: a conflict (send from its commit index + 1), then "from my end + 1"
    assert p.next_index() == 12  # the floor holds: its commit index (11) + 1
    assert p.round() > 1  # the tail from there, pipelined
    assert p.caught_up()


def test_the_leader_keeps_the_lowest_failed_answer_until_a_success_passes_it(pair: Any) -> None:
    # The answers that stall pysyncobj, replayed against the leader's handler.
    p = pair(CatchesUp, committed=10, own=5, ahead=30)
    node = p.its_follower
    for asked in (12, 17, 17):  # a conflict, then "reset to my end" for the later appends
        p.leader._SyncObj__onMessageReceived(node, {"type": "next_node_idx", "next_node_idx": asked,
                                                     "reset": True, "success": False})
    assert p.next_index() == 12
    p.leader._SyncObj__onMessageReceived(node, {"type": "next_node_idx", "next_node_idx": 20,
                                                 "reset": False, "success": True})
    assert p.next_index() == 20 and p.leader._SyncObj__raftMatchIndex[node] == 19
    p.leader._SyncObj__onMessageReceived(node, {"type": "next_node_idx", "next_node_idx": 30,
                                                 "reset": True, "success": False})
    assert p.next_index() == 30  # past the floor: a later failure asks for its own


def test_a_follower_only_behind_is_sent_what_it_lacks(pair: Any) -> None:
    p = pair(CatchesUp, committed=10, own=0, ahead=30)
    p.round()
    assert p.next_index() == 12  # its end + 1: nothing it holds is sent again
    p.round()
    assert p.caught_up()


def test_a_follower_behind_the_leaders_snapshot_is_sent_it() -> None:
    # next index at or below the leader's first entry: pysyncobj sends its snapshot (not faked here).
    assert conflict_hint(40, 9) == 10 and conflict_hint(5, 9) == 5


@settings(max_examples=40, deadline=None)
@given(committed=st.integers(0, 20), own=st.integers(0, 30), ahead=st.integers(0, 60),
       size=st.integers(1, 120), room=st.integers(1, 400))
def test_any_divergence_converges_within_three_rounds(committed: int, own: int, ahead: int, size: int,
                                                       room: int) -> None:
    # Entries under the batch size: a larger one goes in chunks, a path this store never takes
    # (batching.MAX_BYTES keeps each entry under appendEntriesBatchSizeBytes).
    p = _Pair(CatchesUp, committed=committed, own=own, ahead=ahead, size=size, batch=size + room)
    try:
        rounds = p.rounds_to_catch_up(3)
        assert rounds is not None, (p.next_index(), p.follower._SyncObj__raftLog[-1])
    finally:
        p.close()


# --- Floors, pure ------------------------------------------------------------------------------


def _failed(asked: int) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": asked, "reset": True, "success": False}


def _succeeded(asked: int) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": asked, "reset": False, "success": True}


@given(st.lists(st.integers(1, 1000), min_size=1))
def test_failed_answers_ask_for_the_lowest_until_a_success(asked: list[int]) -> None:
    floors = Floors()
    read = [floors.answer(3, "b", _failed(n))["next_node_idx"] for n in asked]
    assert read == [min(asked[:i + 1]) for i in range(len(asked))]
    assert floors.answer(3, "c", _failed(2000))["next_node_idx"] == 2000  # per follower
    assert floors.answer(4, "b", _failed(2000))["next_node_idx"] == 2000  # per term
    floors.answer(4, "b", _succeeded(2001))
    assert floors.answer(4, "b", _failed(3000))["next_node_idx"] == 3000


def test_a_success_short_of_the_floor_keeps_it_and_other_answers_pass() -> None:
    floors = Floors()
    floors.answer(1, "b", _failed(10))
    assert floors.answer(1, "b", _succeeded(10)) == _succeeded(10)  # holds 9, not 10 yet
    assert floors.answer(1, "b", _failed(50))["next_node_idx"] == 10
    chunk = {"type": "next_node_idx", "next_node_idx": 70, "reset": False, "success": False}
    assert floors.answer(1, "b", chunk) is chunk
    floors.answer(1, "b", _succeeded(11))
    assert floors.answer(1, "b", _failed(50))["next_node_idx"] == 50
