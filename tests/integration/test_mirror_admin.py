"""The model mirror's store through the admin API of a real control plane (docs/mirror.md): an upload in pieces
with an interruption, the commit, the listing, a removal refused while a model uses the file, garbage collection
after the removal, a refused file, and the budget."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.control.service import ControlConfig, ControlHandle, Seed, serve
from tests.support.processes import free_port
from tests.support.tiny_gguf import minimal_gguf

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-mirror"
GGUF = minimal_gguf(elements=64 * 1024)  # 256 KiB of tensor data


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[ControlHandle]:
    cfg = ControlConfig(state_dir=tmp_path, raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=0, seed=Seed(admin_key=ADMIN))
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve, cfg)
        yield handle
        nursery.cancel_scope.cancel()


@pytest.fixture
async def api(control: ControlHandle) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=control.admin_url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        for _ in range(200):  # mirror.* commands need the group's store level 3 (announced at the first start)
            r = await c.post("/api/v1/mirror/x/pin", json={"pinned": True})
            if r.json()["error"]["code"] != "upgrade_pending":
                break
            await trio.sleep(0.05)
        yield c


def piece(start: int, data: bytes, total: int) -> dict[str, str]:
    return {"Content-Range": f"bytes {start}-{start + len(data) - 1}/{total}"}


async def upload(api: httpx.AsyncClient, name: str, data: bytes) -> httpx.Response:
    r = await api.post("/api/v1/mirror/uploads", json={"name": name, "size": len(data)})
    assert r.status_code == 200, r.text
    uid, offset = r.json()["id"], r.json()["offset"]
    r = await api.put(f"/api/v1/mirror/uploads/{uid}", content=data[offset:],
                      headers=piece(offset, data[offset:], len(data)))
    assert r.status_code == 200, r.text
    return await api.post(f"/api/v1/mirror/uploads/{uid}/commit")


async def test_an_interrupted_upload_continues_at_its_offset_and_commits(api: httpx.AsyncClient,
                                                                         tmp_path: Path) -> None:
    total = len(GGUF)
    sha = hashlib.sha256(GGUF).hexdigest()
    r = await api.post("/api/v1/mirror/uploads", json={"name": "tiny", "size": total, "sha256": sha})
    uid = r.json()["id"]
    assert r.json()["offset"] == 0
    first = GGUF[:100_000]
    assert (await api.put(f"/api/v1/mirror/uploads/{uid}", content=first,
                          headers=piece(0, first, total))).json()["offset"] == 100_000
    # the client lost its place: a piece at the wrong offset is refused with the offset held
    wrong = await api.put(f"/api/v1/mirror/uploads/{uid}", content=GGUF[50_000:60_000],
                          headers=piece(50_000, GGUF[50_000:60_000], total))
    assert wrong.status_code == 409
    assert wrong.json()["error"]["code"] == "upload_offset_mismatch" and wrong.json()["error"]["offset"] == 100_000
    # starting the same upload again finds it, with its offset
    again = await api.post("/api/v1/mirror/uploads", json={"name": "tiny", "size": total, "sha256": sha})
    assert again.json() == {"id": uid, "offset": 100_000, "size": total, "name": "tiny"}
    early = await api.post(f"/api/v1/mirror/uploads/{uid}/commit")
    assert early.status_code == 409 and early.json()["error"]["code"] == "upload_incomplete"
    rest = GGUF[100_000:]
    assert (await api.put(f"/api/v1/mirror/uploads/{uid}", content=rest,
                          headers=piece(100_000, rest, total))).json()["offset"] == total
    done = await api.post(f"/api/v1/mirror/uploads/{uid}/commit")
    assert done.status_code == 201, done.text
    file = done.json()["file"]
    assert (file["name"], file["sha256"], file["size"], file["kind"]) == ("tiny", sha, total, "gguf")
    assert file["metadata"]["architecture"] == "llama" and file["used_by"] == [] and file["collectable"]
    assert (tmp_path / "mirror" / "blobs" / sha).read_bytes() == GGUF
    listing = (await api.get("/api/v1/mirror")).json()
    assert [f["name"] for f in listing["files"]] == ["tiny"] and listing["uploads"] == []
    assert listing["files"][0]["members"]["holding"] == listing["members"] and listing["stored_bytes"] == total
    assert (await api.get("/api/v1/mirror/tiny")).json()["file"]["sha256"] == sha


async def test_a_file_in_use_is_not_removed_and_an_unused_blob_is_collected(api: httpx.AsyncClient,
                                                                           tmp_path: Path) -> None:
    assert (await upload(api, "tiny", GGUF)).status_code == 201
    assert (await upload(api, "tiny-too", GGUF)).status_code == 201  # two names, one blob
    sha = hashlib.sha256(GGUF).hexdigest()
    r = await api.post("/api/v1/models", json={"name": "m", "engine": "llama.cpp", "source": "mirror://tiny"})
    assert r.status_code == 201, r.text
    assert (await api.get("/api/v1/mirror/tiny")).json()["file"]["used_by"] == ["model m"]
    refused = await api.delete("/api/v1/mirror/tiny")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "mirror_file_in_use"
    assert "model m" in refused.json()["error"]["message"]
    assert (await api.delete("/api/v1/mirror/tiny-too")).json() == {"removed": "tiny-too", "collected": []}
    assert (await api.delete("/api/v1/models/m")).status_code == 200
    removed = (await api.delete("/api/v1/mirror/tiny")).json()
    assert removed["removed"] == "tiny" and removed["collected"] in ([sha], [])  # [] when the mirror's pass was first
    assert not (tmp_path / "mirror" / "blobs" / sha).exists()
    assert (await api.delete("/api/v1/mirror/tiny")).status_code == 404


async def test_pin(api: httpx.AsyncClient) -> None:
    assert (await upload(api, "tiny", GGUF)).status_code == 201
    r = await api.post("/api/v1/mirror/tiny/pin", json={"pinned": True})
    assert r.json() == {"name": "tiny", "pinned": True, "changed": True}
    file = (await api.get("/api/v1/mirror/tiny")).json()["file"]
    assert file["pinned"] and not file["collectable"]


async def test_a_refused_file_is_deleted_with_the_reason(api: httpx.AsyncClient, tmp_path: Path) -> None:
    r = await upload(api, "broken", GGUF[:-1000])  # its header promises more tensor data than it holds
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_file"
    assert "truncated" in r.json()["error"]["message"]
    assert list((tmp_path / "mirror" / "uploads").iterdir()) == []
    assert list((tmp_path / "mirror" / "blobs").iterdir()) == []
    assert (await api.get("/api/v1/mirror")).json()["files"] == []


async def test_an_upload_past_the_budget_is_refused_at_its_start(api: httpx.AsyncClient) -> None:
    assert (await api.put("/api/v1/settings/mirror.budget_gib", json=0.0004)).status_code == 200  # ~429 KB
    assert (await upload(api, "tiny", GGUF)).status_code == 201
    r = await api.post("/api/v1/mirror/uploads", json={"name": "second", "size": len(GGUF) + 10})
    assert r.status_code == 409 and r.json()["error"]["code"] == "mirror_budget_exceeded"
    assert "GiB" in r.json()["error"]["message"] and "mirror.budget_gib" in r.json()["error"]["message"]


# --- `llmgw ctl mirror`: the progress bar and the resume, against this control plane ------------------------------


class CutOnce(httpx.BaseTransport):
    """The real transport, but the `cut`-th PUT fails before it is sent (a link that drops)."""

    def __init__(self, cut: int) -> None:
        self.inner = httpx.HTTPTransport()
        self.cut = cut
        self.puts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.puts += 1
            if self.puts == self.cut:
                raise httpx.WriteError("the link dropped")
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


async def test_ctl_mirror_add_resumes_an_interrupted_upload_with_a_progress_bar(
        api: httpx.AsyncClient, control: ControlHandle, tmp_path: Path) -> None:
    import io

    from llmgw.cli.ctl import run_ctl

    data = minimal_gguf(elements=768 * 1024)  # 3 MiB: three pieces of 1 MiB
    file = tmp_path / "big.gguf"
    file.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    # an earlier run got 1000 bytes across, then stopped
    started = (await api.post("/api/v1/mirror/uploads", json={"name": "big", "size": len(data), "sha256": sha})).json()
    await api.put(f"/api/v1/mirror/uploads/{started['id']}", content=data[:1000], headers=piece(0, data[:1000],
                                                                                                len(data)))
    out, err = io.StringIO(), io.StringIO()
    transport = CutOnce(cut=2)
    env = {"LLMGW_URL": control.admin_url, "LLMGW_KEY": ADMIN}
    rc = await trio.to_thread.run_sync(lambda: run_ctl(["mirror", "add", str(file), "--piece-mib", "1"],
                                                       transport=transport, env=env, stdout=out, stderr=err))
    assert rc == 0, err.getvalue()
    assert "resuming the upload of big at 0.0 MiB" in err.getvalue()
    assert "uploading [########################] 100%  3.0/3.0 MiB" in err.getvalue()
    assert transport.puts >= 4  # three pieces and the one the link dropped
    assert out.getvalue().startswith("added big (gguf, 3.0 MiB, sha256 " + sha[:12])
    assert (tmp_path / "mirror" / "blobs" / sha).read_bytes() == data
    listed = io.StringIO()
    rc = await trio.to_thread.run_sync(lambda: run_ctl(["mirror", "list", "--json"], env=env, stdout=listed))
    assert rc == 0 and [f["name"] for f in json.loads(listed.getvalue())["files"]] == ["big"]


async def test_a_pull_resumes_where_it_stopped_and_a_corrupt_one_is_pulled_again(
        api: httpx.AsyncClient, control: ControlHandle, tmp_path: Path) -> None:
    """Another member's pass (`MirrorSync`), pulling from this control plane as its leader."""
    from llmgw.mirror.blobs import BlobStore
    from llmgw.mirror.sync import MirrorSync

    assert (await upload(api, "tiny", GGUF)).status_code == 201
    sha = hashlib.sha256(GGUF).hexdigest()
    assert control.context is not None  # the other member pulls as a control plane of this process would
    credential = control.context.local_credential("control", "m2")
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {credential}"}) as member:
        other = BlobStore(tmp_path / "other" / "mirror")
        sync = MirrorSync(control.store, other, member, leader_url=lambda: control.admin_url)
        (other.root / "pulls").mkdir(parents=True)
        (other.root / "pulls" / sha).write_bytes(GGUF[:70_000])  # a pull cut at 70,000 bytes
        await sync.pass_once()
        assert other.held() == {sha: len(GGUF)} and other.verify(sha) and not sync.errors
        (other.blobs / sha).unlink()
        (other.root / "pulls" / sha).write_bytes(b"\xff" * 70_000)  # a pull whose bytes went wrong
        await sync.pass_once()
        assert other.held() == {} and "hash to" in sync.errors[sha]  # deleted, said
        await sync.pass_once()
        assert other.held() == {sha: len(GGUF)} and not sync.errors
