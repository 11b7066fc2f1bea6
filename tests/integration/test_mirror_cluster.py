"""The model mirror across three real control planes (tests/support/cluster.py, TLS between them): the standbys
pull every blob from the leader with their control certificates and verify it, an upload sent to a standby is
forwarded to the leader, `GET /api/v1/mirror` shows which
members hold each file, and a failover of the leader loses no file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.cluster import Cluster, Member
from tests.support.tiny_gguf import minimal_gguf

pytestmark = pytest.mark.slow

DATA = minimal_gguf(elements=512 * 1024)  # 2 MiB
SHA = hashlib.sha256(DATA).hexdigest()


async def upload(cluster: Cluster, m: Member) -> None:
    async with httpx.AsyncClient(base_url=m.url, headers=cluster.headers, timeout=30) as api:
        started = (await api.post("/api/v1/mirror/uploads", json={"name": "tiny", "size": len(DATA)})).json()
        r = await api.put(f"/api/v1/mirror/uploads/{started['id']}", content=DATA,
                          headers={"Content-Range": f"bytes 0-{len(DATA) - 1}/{len(DATA)}"})
        assert r.status_code == 200, r.text
        r = await api.post(f"/api/v1/mirror/uploads/{started['id']}/commit")
        assert r.status_code == 201, r.text


async def holding(cluster: Cluster, ask: Member) -> list[str] | None:
    r = await cluster.get(ask, "/api/v1/mirror")
    files = r.json().get("files") if r.status_code == 200 else None
    return files[0]["members"]["holding"] if files else None


def test_standbys_pull_every_blob_and_a_failover_loses_no_file(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)

    async def main() -> None:
        await cluster.start()
        leader = await cluster.wait_for("a leader", cluster.leader, 30.0)

        async def level_3() -> bool | None:
            r = await cluster.get(leader, "/api/v1/cluster/self")
            return r.json().get("group_store_level") == 3 or None

        await cluster.wait_for("store level 3", level_3, 30.0)
        standby = next(m for m in cluster.members if m is not leader)
        await upload(cluster, standby)  # forwarded to the leader, piece and commit alike
        everyone = sorted(m.raft_addr for m in cluster.members)

        async def all_hold() -> bool | None:
            return await holding(cluster, leader) == everyone or None

        await cluster.wait_for("every member holding the file", all_hold, 30.0)
        for m in cluster.members:
            assert (m.state_dir / "mirror" / "blobs" / SHA).read_bytes() == DATA
            assert not any((m.state_dir / "mirror" / "pulls").glob("*")) if m is not leader else True
        cluster.kill(leader)
        survivor = next(m for m in cluster.members if m is not leader)

        async def new_leader() -> Member | None:
            found = await cluster.leader()
            return found if found is not None and found is not leader else None

        await cluster.wait_for("a new leader", new_leader, 30.0)
        r = await cluster.get(survivor, "/api/v1/mirror/tiny")
        assert r.status_code == 200, r.text
        file = r.json()["file"]
        assert file["sha256"] == SHA
        assert sorted(file["members"]["holding"]) == sorted(m.raft_addr for m in cluster.members if m is not leader)

    try:
        trio.run(main)
    finally:
        cluster.close()
