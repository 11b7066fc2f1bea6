"""A leader cut off from its peers serves no stale read (issue 19, point 1), with real `llmgw control`
processes: three members on the loopback of a network namespace this test makes.

The leader's Raft traffic is dropped both ways while the test still reaches its admin API; the other
two elect a new leader, which acknowledges a write that replaces a value; the old leader, which still
believes it leads (`raft_leader_fallback_s` is set to 30 s), answers every read 503 `leader_unreachable`
or `not_leader` (the ReadIndex round of llmgw/store/readindex.py), never the replaced value. After the
heal, the group settles and the old leader forwards reads to the new one, which answers the new value.

How only the Raft traffic is cut: pysyncobj has the member with the larger address ("host:port", as a
string) dial the smaller one, so all the Raft traffic of the member with the smallest address runs
through its own listening port. The test makes that member lead (SIGSTOP of whoever leads until it
does) and adds two routing rules to the namespace, `sport PORT` and `dport PORT` -> blackhole: every
packet to or from that port is discarded, on open connections too (a rule change invalidates the
routes that sockets cached). Its admin port and the others' links are untouched.

The namespace is the test thread's own (`unshare(CLONE_NEWNET)` in a thread: the members, started
from that thread, inherit it); it vanishes with its last process. Nothing touches the host's network.
Needs CAP_SYS_ADMIN (root in CI); skipped, with the reason, where namespaces are not permitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.cluster import Cluster, ClusterError, Member
from tests.support.netns import in_own_netns_or_skip, ip

pytestmark = pytest.mark.slow

SETTING = "/api/v1/settings/placement.warn_interval_s"
BEFORE, AFTER = 601, 602  # the value the cut leader holds; the one the new leader acknowledges
READS = 5


def cut_rules(port: int) -> list[list[str]]:
    """The rules that drop every TCP packet to or from `port` (ahead of the local table, moved to 100)."""
    return [["pref", "10", "ipproto", "tcp", "dport", str(port), "blackhole"],
            ["pref", "11", "ipproto", "tcp", "sport", str(port), "blackhole"]]


def cut(port: int) -> None:
    ip("rule", "add", "pref", "100", "lookup", "local")
    ip("rule", "del", "pref", "0")
    for rule in cut_rules(port):
        ip("rule", "add", *rule)


def heal(port: int) -> None:
    for rule in cut_rules(port):
        ip("rule", "del", *rule)


async def self_doc(cluster: Cluster, m: Member) -> dict[str, Any] | None:
    try:
        r = await cluster.get(m, "/api/v1/cluster/self")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    doc: dict[str, Any] = r.json()
    return doc


async def leads(cluster: Cluster, m: Member) -> bool:
    doc = await self_doc(cluster, m)
    return doc is not None and doc["role"] == "leader"


async def leader_among(cluster: Cluster, members: list[Member]) -> Member | None:
    """The one of `members` that says it leads, else None."""
    for m in members:
        if await leads(cluster, m):
            return m
    return None


async def agreed_leader(cluster: Cluster) -> Member | None:
    """The member that every member names as the leader (itself included), else None."""
    docs = [await self_doc(cluster, m) for m in cluster.members]
    named = {doc["leader"] if doc is not None else None for doc in docs}
    leader = cluster.by_addr(named.pop()) if len(named) == 1 else None
    return leader if leader is not None and await leads(cluster, leader) else None


async def make_lead(cluster: Cluster, target: Member, tries: int = 30) -> None:
    """Pause whoever leads until the others elect, then resume it, until `target` leads."""
    for _ in range(tries):
        await cluster.wait_settled(60)
        leader = await cluster.wait_for("a leader every member names", lambda: agreed_leader(cluster), 30)
        if leader is target:
            return
        cluster.pause(leader)
        others = [m for m in cluster.members if m is not leader]
        await cluster.wait_for("a new leader while the old one is paused", lambda: leader_among(cluster, others), 30)
        cluster.resume(leader)
    raise ClusterError(f"{target.name} did not come to lead in {tries} elections\n{cluster.log_tails()}")


async def put(cluster: Cluster, m: Member, value: int) -> httpx.Response:
    async with httpx.AsyncClient(timeout=15) as client:
        return await client.put(m.url + SETTING, json=value, headers=cluster.headers)


def test_a_partitioned_leader_answers_503_never_the_replaced_value(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The cut leader believes it leads for the whole test: only the read's round stands between it and
    # a stale answer (with the default 2 s it would step down soon after the new leader's write).
    monkeypatch.setenv("LLMGW_TIMEOUTS", "raft_leader_fallback_s=30")

    async def main() -> None:
        cluster = Cluster(tmp_path)  # its ports are picked here, inside the namespace
        try:
            await cluster.start()
            target = min(cluster.members, key=lambda m: m.raft_addr)  # every peer dials it: one port carries all
            await make_lead(cluster, target)
            assert (await put(cluster, target, BEFORE)).status_code == 200
            r = await cluster.get(target, SETTING)
            assert r.status_code == 200 and r.json()["value"] == BEFORE, r.text
            await cluster.wait_settled(30)

            port = int(target.raft_addr.rpartition(":")[2])
            cut(port)
            others = [m for m in cluster.members if m is not target]
            leader = await cluster.wait_for("a new leader among the two the cut left together",
                                            lambda: leader_among(cluster, others), 30)
            r = await put(cluster, leader, AFTER)
            assert r.status_code == 200, r.text  # acknowledged: committed on the new leader and the third member

            old, new = await self_doc(cluster, target), await self_doc(cluster, leader)
            assert old is not None and new is not None
            assert old["role"] == "leader" and old["term"] < new["term"], (old, new)  # it still believes it leads
            for _ in range(READS):
                for path in (SETTING, "/api/v1/settings"):
                    r = await cluster.get(target, path)
                    assert r.status_code == 503, f"the cut leader answered {path}: {r.status_code} {r.text}"
                    error = r.json()["error"]
                    assert error["code"] in ("leader_unreachable", "not_leader"), error
                    assert "the read was not answered" in error["message"] or "stopped leading" in error["message"]

            heal(port)
            await cluster.wait_settled(60)
            r = await cluster.get(target, SETTING)  # forwarded to the new leader, or answered once confirmed
            assert r.status_code == 200 and r.json()["value"] == AFTER, r.text
        finally:
            cluster.close()

    in_own_netns_or_skip(lambda: trio.run(main))
