"""A member that rejoins empty replays the leader's whole log, membership changes included, and still
catches up when one of those changes once removed the member that leads now.

pysyncobj applies a membership change as it appends it: replaying "remove X" (X removed and added again
long ago, and leading now) dropped the rejoining member's link to X and refused X's connections as a
stranger's, so it never caught up (the fault campaign: a member-change round whose rejoined member was sent
the log from index 2). While it catches up, such a member keeps the link (`SealedTransport.dropNode`).

Three members of the store's own Raft class in this process (tests/integration/test_raft_rejoin_vote.py),
no snapshots (so the log is replayed from its start)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.processes import free_port
from tests.integration.test_raft_rejoin_vote import _Member, _put, _wait, until_synced

pytestmark = pytest.mark.slow

PATIENCE_S = 30.0


@pytest.fixture
def group() -> Iterator[dict[str, _Member]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    members = {a: _Member(a, [p for p in addrs if p != a]) for a in addrs}
    yield members
    for m in members.values():
        m.close()


def _leader(members: dict[str, _Member]) -> _Member | None:
    leaders = [m for m in members.values() if m.leads()]
    return leaders[0] if len(leaders) == 1 else None


def _change(leader: _Member, adding: bool, addr: str) -> None:
    done = threading.Event()
    outcome: list[Any] = []

    def callback(result: Any, error: Any) -> None:
        outcome.append(error)
        done.set()

    (leader.obj.addNodeToCluster if adding else leader.obj.removeNodeFromCluster)(addr, callback=callback)
    assert done.wait(PATIENCE_S), f"{'add' if adding else 'remove'} {addr}: no answer"


def _rejoin(members: dict[str, _Member], leader: _Member, who: _Member, writes: int = 0) -> _Member:
    """`who` removed, started again empty (`--rejoin`: it abstains until caught up), and added again; `writes`
    committed while it is out (so the change that removed it and the one that adds it are far apart in the log:
    never in one append)."""
    _change(leader, False, who.addr)
    for i in range(writes):
        _put(leader, f"while-out-{who.addr}-{i}")
    who.close()
    peers = [a for a in members if a != who.addr]
    again = _Member(who.addr, peers, abstain=until_synced)
    members[who.addr] = again
    _change(leader, True, who.addr)
    return again


def test_a_rejoined_member_catches_up_through_a_change_that_removed_the_leader(
        group: dict[str, _Member]) -> None:
    _wait("a leader", lambda: _leader(group))
    first = _leader(group)
    assert first is not None
    _put(first, "before")
    # X removed and added again: the log now holds "remove X", "add X".
    x = _rejoin(group, first, next(m for m in group.values() if m is not first), writes=400)
    _wait("X caught up", lambda: x.obj.isReady() and x.holds("before"), PATIENCE_S)
    # X leads: the others are cut off in turn until it is elected.
    deadline = time.monotonic() + PATIENCE_S
    while _leader(group) is not x:
        assert time.monotonic() < deadline, "X never led"
        current = _leader(group)
        if current is not None and current is not x:
            current.cut.set()
            _wait("another leader", lambda: (now := _leader(group)) is not None and now is not current, PATIENCE_S)
            current.cut.clear()
        time.sleep(0.05)
    # Now a third member rejoins empty and is sent the log from its start, "remove X" included.
    z = _rejoin(group, x, next(m for m in group.values() if m is not x))
    _put(x, "after")
    _wait("the rejoined member caught up with the leader that a replayed change once removed",
          lambda: z.obj.isReady() and z.holds("before") and z.holds("after"), PATIENCE_S)
