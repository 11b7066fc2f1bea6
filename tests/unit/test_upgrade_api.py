"""The admin API's release routes (`ctl upgrade`): a release uploaded to a member is kept only whole, by its
sha256, past the 1 MiB body limit of every other route; served back to the cluster's machines by hash; and an
upgrade asked of a member, a node or a gateway is refused with a reason when it cannot be done."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.gateway_stream import GatewayHub
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.testing import MemoryStore
from llmgw.testing.builders import cpu_node

ADMIN = "sk-upgrade-admin"
VIEWER = "sk-upgrade-viewer"


def client(state_dir: Path | None, hub: AgentHub | None = None,
           restart: Any = None, gateways: GatewayHub | None = None) -> httpx.AsyncClient:
    store, hub = MemoryStore(), hub or AgentHub()
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
    store.submit_nowait(commands.add_key(hash_key(VIEWER), "viewer", "viewer", 0.0))
    reconciler = Reconciler(store, hub)
    if gateways is not None:
        reconciler.sinks.append(gateways)
    app: Any = make_app(Context(store=store, hub=hub, reconciler=reconciler, clock=lambda: 0.0,
                                state_dir=state_dir, restart=restart))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://control.test",
                             headers={"Authorization": f"Bearer {ADMIN}"})


def zipapp(size: int) -> bytes:
    """A zip archive of about `size` bytes (stored, not compressed: its size is what the limit sees)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        z.writestr("__main__.py", "print('release')\n")
        z.writestr("padding.bin", bytes(range(256)) * (size // 256))
    return buffer.getvalue()


async def test_an_upload_over_the_body_limit_is_kept_whole_by_its_hash_and_served_back(tmp_path: Path) -> None:
    data = zipapp(3 << 20)  # three times the 1 MiB every other route takes
    sha = hashlib.sha256(data).hexdigest()
    async with client(tmp_path) as c:
        put = await c.put(f"/api/v1/releases/{sha}", content=data,
                          headers={"Content-Type": "application/octet-stream"})
        assert put.status_code == 200, put.text
        assert put.json()["sha256"] == sha and put.json()["size"] == len(data)
        assert (tmp_path / "releases" / f"{sha}.pyz").read_bytes() == data
        assert (tmp_path / "releases" / f"{sha}.pyz").stat().st_mode & 0o077 == 0, "the owner's alone"
        got = await c.get(f"/api/v1/releases/{sha}")
        assert got.status_code == 200 and got.content == data
        assert got.headers["content-length"] == str(len(data))
        # Other routes keep their 1 MiB limit.
        big = await c.post("/api/v1/plan", content=b"[" + b"1," * (1 << 20) + b"1]",
                           headers={"Content-Type": "application/json"})
        assert big.status_code == 413, big.text


async def test_a_cut_upload_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    data = zipapp(2 << 20)
    sha = hashlib.sha256(data).hexdigest()
    async with client(tmp_path) as c:
        cut = await c.put(f"/api/v1/releases/{sha}", content=data[: len(data) // 2])
        assert cut.status_code == 422, cut.text
        assert cut.json()["error"]["code"] == "sha256_mismatch"
        assert list((tmp_path / "releases").iterdir()) == []
        missing = await c.get(f"/api/v1/releases/{sha}")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "release_not_found"
        bad = await c.put("/api/v1/releases/not-a-hash", content=data)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_sha256"
        text = b"not a zip"
        plain = await c.put(f"/api/v1/releases/{hashlib.sha256(text).hexdigest()}", content=text)
        assert plain.status_code == 409 and plain.json()["error"]["code"] == "not_a_zipapp"


async def test_releases_take_an_admin_key_or_a_machines_certificate(tmp_path: Path) -> None:
    data = zipapp(1000)
    sha = hashlib.sha256(data).hexdigest()
    async with client(tmp_path) as c:
        for headers in ({"Authorization": ""}, {"Authorization": f"Bearer {VIEWER}"}):
            put = await c.put(f"/api/v1/releases/{sha}", content=data, headers=headers)
            assert put.status_code in (401, 403), put.text
            got = await c.get(f"/api/v1/releases/{sha}", headers=headers)
            assert got.status_code in (401, 403), got.text
        assert not (tmp_path / "releases" / f"{sha}.pyz").exists()


async def test_an_upgrade_that_cannot_be_done_is_refused_with_its_reason(tmp_path: Path) -> None:
    async with client(tmp_path) as c:  # a member inside a test's process: nothing of its own to restart
        r = await c.post("/api/v1/cluster/self/upgrade", json={"sha256": "a" * 64})
        assert r.status_code == 409 and r.json()["error"]["code"] == "cannot_upgrade", r.text
    asked: list[tuple[str, Any]] = []
    async with client(tmp_path, restart=lambda reason, into: asked.append((reason, into))) as c:
        r = await c.post("/api/v1/cluster/self/upgrade", json={"sha256": "a" * 64})
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_a_zipapp", r.text
        assert "not a zipapp" in r.json()["error"]["message"]
        r = await c.post("/api/v1/cluster/self/upgrade", json={"version": "0.2.0"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    assert asked == []


async def test_a_node_upgrade_is_sent_over_its_stream_only_for_a_release_held_here(tmp_path: Path) -> None:
    hub = AgentHub()
    send, receive = trio.open_memory_channel[dict[str, Any]](8)
    link = hub.connect("n1", send)
    hub.report_inventory(link, cpu_node("n1"))
    data = zipapp(1000)
    sha = hashlib.sha256(data).hexdigest()
    async with client(tmp_path, hub) as c:
        unknown = await c.post("/api/v1/nodes/n9/upgrade", json={"sha256": sha})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "node_not_found"
        for body in ({"sha256": sha, "rollback": True}, {"rollback": 1}, {"rollback": False}, {}, [sha]):
            bad = await c.post("/api/v1/nodes/n1/upgrade", json=body)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request", body
        bad_sha = await c.post("/api/v1/nodes/n1/upgrade", json={"sha256": "x"})
        assert bad_sha.status_code == 400 and bad_sha.json()["error"]["code"] == "invalid_sha256"
        not_here = await c.post("/api/v1/nodes/n1/upgrade", json={"sha256": sha})
        assert not_here.status_code == 404 and not_here.json()["error"]["code"] == "release_not_found"
        assert (await c.put(f"/api/v1/releases/{sha}", content=data)).status_code == 200
        hub.upgrade_refused["n1"] = "an earlier refusal"
        asked = await c.post("/api/v1/nodes/n1/upgrade", json={"sha256": sha})
        assert asked.status_code == 200, asked.text
        assert asked.json()["upgrading"] == "n1" and asked.json()["to"] == sha
        back = await c.post("/api/v1/nodes/n1/upgrade", json={"rollback": True})
        assert back.status_code == 200 and back.json()["rollback"] is True
    assert receive.receive_nowait() == {"type": "upgrade_agent", "sha256": sha}
    assert receive.receive_nowait() == {"type": "upgrade_agent", "rollback": True}
    assert "n1" not in hub.upgrade_refused  # a new ask clears the last refusal


async def test_a_gateway_upgrade_is_sent_over_its_stream_only_when_it_can_be_done(tmp_path: Path) -> None:
    """Refused with the reason, and nothing sent to the gateway: unknown, not connected, not restartable, not run
    from a release file, a bad body, a release this leader does not hold. Then sent, the last refusal cleared."""
    gateways = GatewayHub(MemoryStore(), "m1")
    data = zipapp(1000)
    sha = hashlib.sha256(data).hexdigest()

    def follows(name: str, restartable: bool = True, release_sha256: str | None = "b" * 64,
                connected: bool = True) -> trio.MemoryReceiveChannel[str]:
        link = gateways.connect(name, "127.0.0.1")
        link.restartable, link.release_sha256, link.started_at, link.pid = restartable, release_sha256, 5.0, 42
        send, receive = trio.open_memory_channel[str](8)
        link.asks = send
        if not connected:
            gateways.disconnect(link)
        return receive

    stream = follows("gw-1")
    others = [follows("gw-gone", connected=False), follows("gw-fixed", restartable=False),
              follows("gw-package", release_sha256=None)]
    async with client(tmp_path, gateways=gateways) as c:
        for name, status, code in (("gw-9", 404, "gateway_not_found"), ("gw-gone", 409, "gateway_not_connected"),
                                   ("gw-fixed", 409, "cannot_restart"), ("gw-package", 409, "not_a_zipapp")):
            r = await c.post(f"/api/v1/gateways/{name}/upgrade", json={"sha256": sha})
            assert r.status_code == status and r.json()["error"]["code"] == code, (name, r.text)
        for body in ({"sha256": sha, "rollback": True}, {"rollback": 1}, {"rollback": False}, {}, [sha]):
            bad = await c.post("/api/v1/gateways/gw-1/upgrade", json=body)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request", body
        bad_sha = await c.post("/api/v1/gateways/gw-1/upgrade", json={"sha256": "x"})
        assert bad_sha.status_code == 400 and bad_sha.json()["error"]["code"] == "invalid_sha256"
        not_here = await c.post("/api/v1/gateways/gw-1/upgrade", json={"sha256": sha})
        assert not_here.status_code == 404 and not_here.json()["error"]["code"] == "release_not_found"
        viewer = await c.post("/api/v1/gateways/gw-1/upgrade", json={"rollback": True},
                              headers={"Authorization": f"Bearer {VIEWER}"})
        assert viewer.status_code == 403, viewer.text
        with pytest.raises(trio.WouldBlock):
            stream.receive_nowait()  # none of those reached it
        for other in others:
            with pytest.raises(trio.WouldBlock):
                other.receive_nowait()

        assert (await c.put(f"/api/v1/releases/{sha}", content=data)).status_code == 200
        gateways.links["gw-1"].upgrade_refused = "no_previous_release: an earlier refusal"
        listed = (await c.get("/api/v1/gateways")).json()["gateways"]
        assert [g["upgrade_refused"] for g in listed if g["name"] == "gw-1"] == ["no_previous_release: an earlier "
                                                                                 "refusal"]
        asked = await c.post("/api/v1/gateways/gw-1/upgrade", json={"sha256": sha})
        assert asked.status_code == 200, asked.text
        assert asked.json() | {"connected_at": None} == {
            "upgrading": "gw-1", "connected_at": None, "started_at": 5.0, "pid": 42, "from": "b" * 64, "to": sha,
            "rollback": False}
        back = await c.post("/api/v1/gateways/gw-1/upgrade", json={"rollback": True})
        assert back.status_code == 200 and back.json()["rollback"] is True and back.json()["to"] is None
        assert gateways.links["gw-1"].upgrade_refused is None  # a new ask clears the last refusal
    assert json.loads(stream.receive_nowait()) == {"type": "upgrade_gateway", "sha256": sha}
    assert json.loads(stream.receive_nowait()) == {"type": "upgrade_gateway", "rollback": True}
