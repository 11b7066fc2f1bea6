"""Webhooks across a leader's death, with five real `llmgw control` processes (tests/support/cluster.py) and a
webhook receiver on loopback: the leader that posted a condition's "started" is SIGKILLed while the condition
still holds. test_notify_failover.py checks the same in one process, where the leader stops by being cancelled
(its tasks end in order); here it dies at once, as a machine does.

A member is SIGKILLed: the leader posts its `member_missing` started (recorded in the replicated state,
`condition.update`, before the post). Then the leader is SIGKILLed: the new leader (three of five still run)
posts the dead leader's own `member_missing`, never the first member's start again; when that member comes
back, it posts the resolved once, with the first leader's start as its since. A leader whose two followers
are stopped (SIGSTOP) posts nothing: it cannot commit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.testing.webhooks import WebhookReceiver
from tests.support.cluster import Cluster, Member

pytestmark = pytest.mark.slow

# The notifier checks often and posts a group condition half a second after an election (the defaults: 1 s, 10 s).
FAST = "notify_check_s=0.1,notify_resolve_hold_s=0.3,notify_election_settle_s=0.5"


def posted(receiver: WebhookReceiver, subject: str) -> list[tuple[str, str, float]]:
    """Each `member_missing` event about `subject`: started or resolved, by which leader, since when."""
    return [(e["event"], e["cluster"]["leader"], e["since"]) for e in receiver.events()
            if e["condition"]["kind"] == "member_missing" and e["condition"]["subject"] == subject]


async def until_posted(receiver: WebhookReceiver, subject: str, count: int) -> list[tuple[str, str, float]]:
    while len(got := posted(receiver, subject)) < count:
        await receiver.wait_for(len(receiver.received) + 1)
    return got


async def put_setting(cluster: Cluster, m: Member, key: str, value: Any) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.put(f"{m.url}/api/v1/settings/{key}", json=value, headers=cluster.headers)
    assert r.status_code == 200, r.text


@asynccontextmanager
async def watched(root: Path, size: int, timeouts: str) -> AsyncIterator[tuple[Cluster, WebhookReceiver, Member]]:
    """`size` members started with `LLMGW_TIMEOUTS=timeouts`, the webhook set to a receiver on loopback: the
    group, the receiver and the leader; every member stopped at the end."""
    cluster = Cluster(root, size=size)
    for m in cluster.members:
        m.env["LLMGW_TIMEOUTS"] = timeouts
    receiver = WebhookReceiver()
    try:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(receiver.serve)
            await cluster.start()
            leader: Member = await cluster.wait_for("a leader", cluster.leader, 60)
            await put_setting(cluster, leader, "notify.webhooks", [url + "/pager"])
            yield cluster, receiver, leader
            nursery.cancel_scope.cancel()
    finally:
        cluster.close()


async def test_a_leader_killed_while_a_condition_holds_leaves_its_successor_to_resolve_it_once(
        tmp_path: Path) -> None:
    with trio.fail_after(180):
        async with watched(tmp_path, 5, FAST) as (cluster, receiver, first):
            gone = next(m for m in cluster.members if m is not first)
            cluster.kill(gone)
            [(event, by, since)] = await until_posted(receiver, gone.raft_addr, 1)
            assert (event, by) == ("started", first.raft_addr), cluster.log_tails()

            cluster.kill(first)  # while `gone` is still missing
            second: Member = await cluster.wait_for("a new leader", lambda: _another_leader(cluster, first), 60)
            # It takes over: the dead leader is its own condition to post ...
            [(event, by, _)] = await until_posted(receiver, first.raft_addr, 1)
            assert (event, by) == ("started", second.raft_addr)
            # ... and the one its predecessor posted is not posted again.
            assert posted(receiver, gone.raft_addr) == [("started", first.raft_addr, since)]

            cluster.start_member(gone)  # back: resolved, once, since the first leader's start
            await until_posted(receiver, gone.raft_addr, 2)
            await cluster.wait_for("the member healthy again", lambda: _healthy(cluster, second, gone), 60)
            await trio.sleep(0.3 + 20 * 0.1)  # the resolve hold and checks after it: nothing more comes
            assert posted(receiver, gone.raft_addr) == [("started", first.raft_addr, since),
                                                        ("resolved", second.raft_addr, since)]


async def test_a_leader_whose_majority_is_stopped_posts_nothing(tmp_path: Path) -> None:
    """SIGSTOP of both others (machines hung, not gone): the leader still believes it leads (here for 30 s:
    `raft_leader_fallback_s`), finds both missing, and cannot commit their `member_missing`: it posts nothing
    and says why in its log."""
    with trio.fail_after(120):
        async with watched(tmp_path, 3, FAST + ",raft_leader_fallback_s=30,store_commit_s=1") as (
                cluster, receiver, leader):
            for m in cluster.members:
                if m is not leader:
                    cluster.pause(m)  # resumed (SIGCONT) before it is stopped at the end
            said = "conditions not posted: their update was not committed"
            await cluster.wait_for("the leader posting, or failing to record what it finds",
                                   lambda: receiver.attempts or said in leader.log_tail(20_000), 60)
            assert receiver.attempts == [], receiver.events()  # posting from its memory: both member_missing
            assert said in leader.log_tail(20_000)


async def _another_leader(cluster: Cluster, old: Member) -> Member | None:
    found = await cluster.leader()
    return found if found is not None and found is not old else None


async def _healthy(cluster: Cluster, asked: Member, m: Member) -> bool:
    rows = await cluster.table(asked)
    return rows is not None and rows.get(m.raft_addr, {}).get("state") == "healthy"
