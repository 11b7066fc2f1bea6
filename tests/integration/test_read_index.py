"""Reads confirmed by a majority (ReadIndex, llmgw/store/readindex.py) with real pysyncobj members
on loopback, in this process: the leader confirms, a standby is told who leads, a leader whose peers
are gone refuses the read within `store_read_s` although pysyncobj still counts it as the leader,
and what a confirmation costs (printed; docs/ha.md quotes tests/bench/reads.py instead).

The partition with a new leader, through real `llmgw control` processes, is in
tests/integration/test_read_partition.py."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.store import LeadershipUnconfirmed, NotLeader, RaftStore
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

# The leader keeps believing it leads for 30 s: only the read barrier stands between it and a stale answer.
SLOW_FALLBACK = dataclasses.replace(TIMEOUTS, raft_leader_fallback_s=30.0, store_read_s=0.5)


async def open_group(root: Path, size: int = 3) -> list[RaftStore]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(size)]
    stores = [RaftStore(self_addr=a, peers=addrs, state_dir=root / f"m{i}", timeouts=SLOW_FALLBACK,
                        cluster_secret="read-index-test-secret")
              for i, a in enumerate(addrs)]
    for s in stores:
        await s.start()
    for s in stores:
        await s.wait_ready()
    return stores


def leader_of(stores: list[RaftStore]) -> RaftStore:
    leaders = [s for s in stores if s.is_leader()]
    assert len(leaders) == 1, [s.status() for s in stores]
    return leaders[0]


async def timed_confirms(store: RaftStore, n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        await store.confirm_leader()
        took.append(time.perf_counter() - started)
    return took


async def test_the_leader_confirms_and_a_standby_names_the_leader(tmp_path: Path) -> None:
    stores = await open_group(tmp_path)
    try:
        leader = leader_of(stores)
        await leader.submit(commands.add_key(hash_key("sk-read-index"), "a", "admin", 0.0))
        took = await timed_confirms(leader, 200)
        p50, p99 = statistics.median(took), sorted(took)[int(len(took) * 0.99) - 1]
        print(f"\nconfirmed read on the leader of 3 (loopback): p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
        standby = next(s for s in stores if s is not leader)
        with pytest.raises(NotLeader) as refused:
            await standby.confirm_leader()
        assert refused.value.leader == leader.self_addr
    finally:
        for s in stores:
            s.close()


async def test_a_group_of_one_confirms_at_once(tmp_path: Path) -> None:
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path)
    await store.start()
    await store.wait_ready()
    try:
        took = await timed_confirms(store, 200)
        print(f"\nconfirmed read in a group of one: p50 {statistics.median(took) * 1e3:.2f} ms")
    finally:
        store.close()


async def test_a_leader_whose_peers_are_gone_refuses_reads_while_it_still_believes_it_leads(tmp_path: Path) -> None:
    stores = await open_group(tmp_path)
    try:
        leader = leader_of(stores)
        await leader.confirm_leader()
        for s in stores:
            if s is not leader:
                s.close()
        started = trio.current_time()
        with pytest.raises(LeadershipUnconfirmed, match="no majority of the group confirmed it"):
            await leader.confirm_leader()
        assert trio.current_time() - started < SLOW_FALLBACK.store_read_s + 1.0
        assert leader.is_leader(), "pysyncobj still counts it as the leader (fallback 30 s): the barrier refused"
    finally:
        for s in stores:
            s.close()
