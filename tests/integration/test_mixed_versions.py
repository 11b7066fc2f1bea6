"""Mixed versions in one Raft group (issue 21, point 6; docs/operations.md, "Upgrade"): a group of three
upgraded one member at a time from this release to a newer one (tests/support/releases.py: one store
level up, with one new command type) never writes what an old member cannot apply, and an old release
started on a log the newer one wrote refuses to start, saying which release it needs.

Real `llmgw control` processes on loopback, each running the llmgw of its tree (PYTHONPATH)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.domain import levels
from tests.support.cluster import Cluster, Member
from tests.support.releases import Release, newer_release, this_release

pytestmark = pytest.mark.slow

PATIENCE_S = 60.0
SETTING = "placement.warn_interval_s"


def test_a_group_upgraded_member_by_member_writes_nothing_an_older_member_cannot_apply(tmp_path: Path) -> None:
    old, new = this_release(), newer_release(tmp_path / "newer")
    cluster = Cluster(tmp_path / "group", 3)
    try:
        trio.run(_upgrade, cluster, old, new)
    finally:
        cluster.close()


async def _self(cluster: Cluster, m: Member) -> dict[str, Any] | None:
    try:
        r = await cluster.get(m, "/api/v1/cluster/self")
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


async def _restart(cluster: Cluster, m: Member, release: Release, compact_after: int | None = None) -> None:
    """A planned restart of `m` on `release` (a leader hands over first), until it serves as that version."""
    m.stop()
    m.code = None if release.root == this_release().root else release.root
    cluster.start_member(m, extra=["--journal-compact-after", str(compact_after)] if compact_after else [])

    async def upgraded() -> bool:
        doc = await _self(cluster, m)
        return doc is not None and doc["version"] == release.version and doc["ready"]

    await cluster.wait_for(f"{m.name} serving as llmgw {release.version}", upgraded, PATIENCE_S)
    await cluster.wait_settled(PATIENCE_S)


async def _group_levels(cluster: Cluster) -> set[int]:
    docs = [await _self(cluster, m) for m in cluster.members]
    return {d["group_store_level"] for d in docs if d is not None}


async def _put_setting(cluster: Cluster, m: Member, value: int) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.put(f"{m.url}/api/v1/settings/{SETTING}", json=value, headers=cluster.headers)


async def _setting_everywhere(cluster: Cluster, value: int) -> bool:
    """The setting reads `value`, and every member holds the same state at the same revision (so every
    member applied what the leader did)."""
    rows = await cluster.settled()
    if rows is None or len({r["state_hash"] for r in rows.values()}) != 1:
        return False
    r = await cluster.get(cluster.members[0], f"/api/v1/settings/{SETTING}")
    return r.status_code == 200 and r.json().get("value") == value


async def _upgrade(cluster: Cluster, old: Release, new: Release) -> None:
    await cluster.start()
    assert new.level == old.level + 1 and levels.LEVEL == old.level
    for m in cluster.members:
        doc = await _self(cluster, m)
        assert doc is not None and (doc["version"], doc["store_level"], doc["group_store_level"]) == \
            (old.version, old.level, old.level)
    # Two members upgraded, whichever leads (a leader hands over first); one, `old_one`, stays old.
    old_one = cluster.members[0]
    for m in cluster.members[1:]:
        await _restart(cluster, m, new)
    assert await _group_levels(cluster) == {old.level}
    # A leader of the new release, for what follows (an old one is restarted, as it was, to hand over).
    for _ in range(5):
        leader = await cluster.wait_for("one leader every member agrees on", lambda: _agreed_leader(cluster),
                                        PATIENCE_S)
        if leader is not old_one:
            break
        await _restart(cluster, old_one, old)
    assert leader is not old_one, "the old member kept leading through five hand-overs"
    rows = await cluster.wait_settled(PATIENCE_S)
    assert {r["version"] for r in rows.values()} == {old.version, new.version}
    table = (await cluster.get(leader, "/api/v1/cluster/members")).json()
    assert any("versions" in w and "upgrade" in w for w in table["warnings"]), table["warnings"]

    # Its settings write is a command of the new level: refused, saying who is older, and nothing written.
    # (Through the old member too: a standby forwards writes to the leader, which builds the command.)
    for via in (leader, old_one):
        refused = await _put_setting(cluster, via, 602)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "upgrade_pending"
        assert old_one.raft_addr in error["message"] and f"({old.version})" in error["message"]
        assert f"llmgw {new.version}" in error["message"]
    # What every member reads is written as before: a viewer key and a setting through the new leader's
    # older command, applied by the old member too (one state everywhere).
    async with httpx.AsyncClient(timeout=10) as client:
        made = await client.post(f"{leader.url}/api/v1/keys", json={"name": "mixed", "role": "viewer"},
                                 headers=cluster.headers)
    assert made.status_code == 201, made.text
    await cluster.wait_for("the key applied by every member, the setting at its default",
                           lambda: _setting_everywhere(cluster, 600), PATIENCE_S)

    # The last one upgraded: the leader raises the group's level, and the new command type is written.
    await _restart(cluster, old_one, new)
    await cluster.wait_for("the group at the new store level",
                           lambda: _levels_are(cluster, {new.level}), PATIENCE_S)
    assert (await _put_setting(cluster, old_one, 603)).status_code == 200
    await cluster.wait_for("the new command applied by every member", lambda: _setting_everywhere(cluster, 603),
                           PATIENCE_S)

    # Rolled back to the old release, a member refuses to start on what the group wrote since: one line, the
    # release it needs, and its journal left as it was (the new release applies it at its start).
    back = cluster.members[1]
    refusal = await _refused_start(cluster, back)
    # The first thing of the new level in its log: the move of the group to it (before any command of it).
    assert f"the log moves the group to store level {new.level}" in refusal, refusal
    assert f"run llmgw {new.version} or newer" in refusal, refusal
    await _restart(cluster, back, new, compact_after=10)
    await cluster.wait_for("the member back on the new release, with the new command applied",
                           lambda: _setting_everywhere(cluster, 603), PATIENCE_S)

    # The same from a snapshot: the member's log compacted into one (of the group's level), the old
    # release refuses it at its start, saying so.
    snapshot = back.raft_dir / "snapshot.json"
    for value in range(604, 620):
        if snapshot.exists():
            break
        assert (await _put_setting(cluster, cluster.members[2], value)).status_code == 200
        await cluster.wait_settled(PATIENCE_S)
    await cluster.wait_for("a snapshot on the member", snapshot.exists, PATIENCE_S)
    refusal = await _refused_start(cluster, back)
    assert f"the snapshot was written by a newer llmgw (store level {new.level})" in refusal, refusal
    assert f"run llmgw {new.version} or newer" in refusal, refusal


async def _refused_start(cluster: Cluster, m: Member) -> str:
    """Stop `m`, start it on this (the old) release: it must exit non-zero, with one line saying why."""
    m.stop()
    m.code = None
    cluster.start_member(m)
    proc = m.proc
    assert proc is not None
    try:
        status = await trio.to_thread.run_sync(lambda: proc.wait(PATIENCE_S))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the old release started on what the newer one wrote:\n{m.log_tail()}") from None
    assert status != 0
    tail = m.log.read_text().split(f"=== start {m.starts}:")[-1]
    refusals = [line for line in tail.splitlines() if "cannot start" in line]
    assert len(refusals) == 1, tail
    return refusals[0]


async def _agreed_leader(cluster: Cluster) -> Member | None:
    """The member every running member names as its leader, itself included; None while they differ."""
    named = set()
    for m in cluster.members:
        if m.running:
            doc = await _self(cluster, m)
            named.add(doc.get("leader") if doc is not None else None)
    leader = cluster.by_addr(named.pop()) if len(named) == 1 else None
    return leader if leader is not None and leader.running else None


async def _levels_are(cluster: Cluster, expected: set[int]) -> bool:
    return await _group_levels(cluster) == expected
