"""A leader that stops hands its leadership over first (`store/handover.py`, `RaftStore.hand_over`): asked,
its most caught-up follower is elected while it still runs, so a planned stop costs one election round
trip, not an election timeout of silence.

In one process (three members of the store's Raft class, as tests/integration/test_raft_rejoin_vote.py):
a healthy leader asked to hand over is followed by another member, which never happens unasked; and
through real `llmgw control` processes: SIGTERM to the leader, whose log says to whom it handed over,
and the others have their new leader before its process has exited."""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Iterator

import pytest
import trio

from llmgw.domain.timeouts import TIMEOUTS
from tests.support.processes import free_port
from tests.integration.test_raft_rejoin_vote import _Member, _put, _wait
from tests.support.cluster import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def members() -> Iterator[dict[str, _Member]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    group = {a: _Member(a, [p for p in addrs if p != a]) for a in addrs}
    yield group
    for m in group.values():
        m.close()


def _leader(members: dict[str, _Member]) -> _Member | None:
    leaders = [m for m in members.values() if m.leads()]
    return leaders[0] if len(leaders) == 1 else None


def test_a_leader_asked_hands_over_and_one_unasked_keeps_leading(members: dict[str, _Member]) -> None:
    _wait("a leader", lambda: _leader(members))
    old = _leader(members)
    assert old is not None
    _put(old, "before")
    term = old.obj._getTerm()
    quiet_until = time.monotonic() + 3 * TIMEOUTS.raft_election_max_s  # unasked: it leads on
    while time.monotonic() < quiet_until:
        assert old.leads() and old.obj._getTerm() == term
        time.sleep(0.05)
    old.obj.ask_handover()
    _wait("another member leading", lambda: (new := _leader(members)) is not None and new is not old)
    new = _leader(members)
    assert new is not None and new.obj._getTerm() == term + 1  # one election, the target's
    old.obj.cancel_handover()
    _put(new, "after")
    _wait("every member holding both writes", lambda: all(m.holds("before") and m.holds("after")
                                                           for m in members.values()))


def test_sigterm_to_the_leader_hands_over_before_it_exits(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)
    try:
        trio.run(cluster.start)
        leader = trio.run(cluster.wait_for, "a leader", cluster.leader, 30.0)
        assert leader is not None
        leader.proc.terminate()  # a planned stop: SIGTERM, as systemd and `llmgw service stop` send

        async def new_leader_while_it_runs() -> str | None:
            for m in cluster.members:
                if m is leader:
                    continue
                rows = await cluster.table(m)
                if rows:
                    leaders = [a for a, row in rows.items() if row.get("role") == "leader" and a != leader.raft_addr]
                    if leaders:
                        return leaders[0]
            return None

        new = trio.run(cluster.wait_for, "a new leader", new_leader_while_it_runs, 30.0)
        leader.proc.wait(30)
        log = leader.log_tail(20000)
        assert f"leadership handed over to {new}" in log, log
    finally:
        cluster.close()
