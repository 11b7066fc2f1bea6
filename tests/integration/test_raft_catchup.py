"""A leader cut off under write load catches up within 5 s of the heal (issue 19, point 2).

Three members of the store's own Raft class (`_Replicated`: `CatchesUp`, `KeepsMatchingEntries`)
in this process, on loopback, each on the store's sealed transport with a switch that drops all
of its member's Raft traffic, both ways (the links stay up, as under a packet-dropping cut;
pysyncobj's connection timeout then recycles them). Writers keep going through whichever member
believes it leads, the cut one too: it appends writes of its own term that nobody else holds,
the divergence that stalled pysyncobj for minutes after the heal.

The figure (`settled in ... s`) is printed: pytest -s tests/integration/test_raft_catchup.py.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from pysyncobj import SyncObjConf

from llmgw.domain import commands, summary
from llmgw.domain.conditions import conditions
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from tests.support.processes import free_port
from llmgw.store.raft import _Replicated
from llmgw.store.wire import RefusalLog, SealedTransport

CUT_S = 10.0
SETTLE_BOUND_S = 5.0


class _Cuttable(SealedTransport):
    """The store's sealed transport; while `cut` is set, its member sends and receives nothing."""

    def __init__(self, *args: Any, cut: threading.Event, **kwargs: Any) -> None:
        self._cut = cut
        super().__init__(*args, **kwargs)

    def send(self, node: Any, message: Any) -> bool:
        if self._cut.is_set():
            return True  # lost on the way, as a dropped packet is
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if not self._cut.is_set():
            super()._onMessageReceived(node, message)


def member_conf(addr: str) -> SyncObjConf:
    """A member's pysyncobj settings as RaftStore's (timeouts from the table), without its journal."""
    return SyncObjConf(
        autoTick=False, dynamicMembershipChange=True, appendEntriesUseBatch=False, commandsWaitLeader=True,
        bindAddress=addr, connectionRetryTime=TIMEOUTS.raft_connect_retry_s,
        leaderFallbackTimeout=TIMEOUTS.raft_leader_fallback_s, appendEntriesPeriod=TIMEOUTS.raft_heartbeat_s,
        raftMinTimeout=TIMEOUTS.raft_election_min_s, raftMaxTimeout=TIMEOUTS.raft_election_max_s,
        # No compaction: a snapshot sent to the former leader would hide a stalled catch-up.
        logCompactionMinEntries=10**9, logCompactionMinTime=10**9)


class _Member:
    def __init__(self, addr: str, peers: list[str]) -> None:
        self.addr = addr
        self.cut = threading.Event()
        conf = member_conf(addr)
        transport = functools.partial(_Cuttable, refusals=RefusalLog(60.0), cut=self.cut)
        self.obj = _Replicated(addr, peers, conf, lambda: None, transport, TIMEOUTS.raft_heartbeat_s)  # as RaftStore
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._tick, name=f"raft-{addr}", daemon=True)
        self.thread.start()

    def _tick(self) -> None:
        try:
            while not self.stop.is_set():
                self.obj.doTick(TIMEOUTS.raft_tick_s)
        except BaseException as e:  # the test reads it
            self.failures.append(e)

    def status(self) -> dict[str, Any]:
        return dict(self.obj.getStatus())

    def leads(self) -> bool:
        return bool(self.obj._isLeader())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.obj.destroy()


@pytest.fixture
def group() -> Iterator[list[_Member]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    members = [_Member(a, [p for p in addrs if p != a]) for a in addrs]
    try:
        yield members
    finally:
        for m in members:
            m.close()


class _Writers:
    """One thread: a write every 2 ms to each member that believes it leads."""

    def __init__(self, members: list[_Member]) -> None:
        self.members = members
        self.sent = {m.addr: 0 for m in members}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="writers", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            for m in self.members:
                if m.leads():
                    n += 1
                    m.obj.apply(commands.encode(commands.remove_model(f"m{n}", 1.0)), callback=lambda *_: None)
                    self.sent[m.addr] += 1
            time.sleep(0.002)

    def __enter__(self) -> _Writers:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def _wait(what: str, check: Any, members: list[_Member], limit: float = 60.0) -> float:
    """Polls `check` until true; returns when (monotonic). Fails after `limit`, naming `what`."""
    deadline = time.monotonic() + limit
    while not check():
        for m in members:
            assert not m.failures, f"{m.addr}'s Raft thread failed: {m.failures!r}"
        assert time.monotonic() < deadline, f"{what}: not within {limit:g} s: {[m.status() for m in members]}"
        time.sleep(0.01)
    return time.monotonic()


def _lagging(members: list[_Member]) -> tuple[list[dict[str, Any]], set[str]]:
    """The control planes' table (`member_rows`) from each member's own numbers, as its
    `/cluster/self` gives them, and the members the `member_lagging` condition names."""
    views = []
    for m in members:
        st, leader = m.status(), m.obj._getLeader()
        views.append({"id": m.addr, "answer": {
            "role": "leader" if m.leads() else "standby", "ready": bool(m.obj.isReady()), "term": st["raft_term"],
            "leader": None if leader is None else str(leader.address), "commit_index": st["commit_idx"],
            "applied_index": st["last_applied"]}})
    rows = summary.member_rows(views, time.time())
    doc = summary.summarize(ClusterState(), Observed(), None, {})
    doc = replace(doc, cluster=summary.ClusterPart.from_table({"leader": None, "members": rows}, 0, False))
    return rows, {c.key[1] for c in conditions(doc) if c.kind == "member_lagging"}


def _leader(members: list[_Member]) -> _Member | None:
    leaders = [m for m in members if m.leads() and not m.cut.is_set()]
    return max(leaders, key=lambda m: m.status()["raft_term"]) if leaders else None


@pytest.mark.slow
def test_a_leader_cut_off_under_write_load_catches_up_within_5_s_of_the_heal(group: list[_Member]) -> None:
    _wait("a leader", lambda: _leader(group) is not None, group)
    with _Writers(group) as writers:
        old = _leader(group)
        assert old is not None
        _wait("writes committed", lambda: old.status()["commit_idx"] > 200, group)
        old.cut.set()
        cut_at, before_cut = time.monotonic(), writers.sent[old.addr]
        _wait("a new leader", lambda: (n := _leader(group)) is not None and n is not old, group)
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
        new = _leader(group)
        assert new is not None and new is not old
        # Writes it took while cut off are in its log only, of its old term: the divergence.
        own = writers.sent[old.addr] - before_cut
        assert own > 0
        old.cut.clear()
        healed = time.monotonic()
        target = new.status()["commit_idx"]
        _wait("the former leader following", lambda: old.obj._getLeader() is not None, group)
        rows, lagging = _lagging(group)
        row = next(r for r in rows if r["id"] == old.addr)
        seen = f"{row['state']} ({row['reason'] or 'in step'}) {time.monotonic() - healed:.2f} s after the heal"
        if old.status()["last_applied"] < target - summary.MEMBER_LAG_HEALTHY:  # still behind when asked
            assert row["state"] == "catching up" and row["lag"] > summary.MEMBER_LAG_HEALTHY, row
            assert f"{row['lag']} entries behind" in row["reason"] and old.addr in lagging, (row, lagging)
        # Under write load on a busy box another follower can be behind too, applying what it was sent: the
        # condition names exactly the members whose rows say so, each with its own lag past the threshold.
        behind = {r["id"] for r in rows if r["state"] == "catching up"}
        assert lagging == behind, (rows, lagging)
        assert all(r["lag"] > summary.MEMBER_LAG_HEALTHY for r in rows if r["id"] in behind - {old.addr}), rows
        caught = _wait("the former leader at the leader's commit index of the heal",
                       lambda: old.status()["last_applied"] >= target, group) - healed
    # Writes stopped: every member at the same commit index, applied, with the same state.
    settled = _wait("the group settled", lambda: len({(m.status()["commit_idx"], m.status()["last_applied"])
                                                      for m in group}) == 1, group) - healed
    states = [m.obj._state for m in group]
    rows, lagging = _lagging(group)
    assert lagging == set() and {r["state"] for r in rows} == {"healthy"}, rows  # member_lagging resolved
    print(f"\ncut {CUT_S:g} s under write load ({own} writes to the cut leader): "
          f"caught up to the leader's commit index of the heal ({target}) {caught:.2f} s after the heal; "
          f"settled in {settled:.2f} s; its row read {seen}")
    assert caught <= SETTLE_BOUND_S, f"caught up {caught:.2f} s after the heal (bound {SETTLE_BOUND_S:g} s)"
    assert states[0] == states[1] == states[2]
