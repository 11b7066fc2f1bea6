"""The console's Mirror page: the files with their facts, users, holders (members and node caches), the budget and
the uploads in progress, unknown shown as unknown; and the browser's upload through the console's own routes (the
session's rights, the CSRF token in a header): in pieces, resumed from the offset the leader holds after a lost
answer, then committed and listed, a refused file's reason in words, a viewer and a missing token refused; and a
file served from the page (the preview, then confirmed), or a clear refusal where the serve op is missing."""

from __future__ import annotations

import hashlib
import html as html_lib
import json
import re
from pathlib import Path

import httpx
import pytest

from console_world import ADMIN, VIEWER, World, csrf_of, hidden, sign_in
from llmgw.domain import commands
from llmgw.domain.observed import NodeInfo
from llmgw.mirror.blobs import BlobStore
from llmgw.testing.builders import model, store_with
from tests.support.tiny_gguf import write_tiny_llama

SHA = "ab" * 32


def text_of(html: str, testid: str) -> str:
    """The text of the element with this data-testid, up to its table's or paragraph's end (tags stripped)."""
    found = re.search(rf'data-testid="{testid}"[^>]*>(.*?)</(table|p|section)>', html, re.S)
    assert found, f"no {testid} in {html[:2000]}"
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", found.group(1)))


def cache_node(name: str, sha: str) -> NodeInfo:
    """A node whose mirror cache holds `sha` (as the agent reports it: a storage dir of entries of kind mirror)."""
    return NodeInfo(name, hostname=name, cpus=8, memory_total=1 << 34, gpus=(), engines=("llamacpp",),
                    storage=({"path": "/var/lib/llmgw/mirror", "fabric": "", "shared": False, "not_weights": [],
                              "models": [{"name": "tiny", "path": f"/var/lib/llmgw/mirror/{sha}", "kind": "mirror",
                                          "size": 5 << 20, "sha256": sha}]},))


def world_with_mirror(tmp_path: Path, nodes: list[NodeInfo] | None = None) -> World:
    store = store_with()
    store.submit_nowait(commands.put_file("tiny", SHA, 5 << 20, "gguf", {
        "kind": "gguf", "architecture": "llama", "quantization": "Q4_K_M", "parameter_count": 1_234_000_000},
        1.0))
    store.submit_nowait(commands.put_file("odd", "cd" * 32, 7, "safetensors", {}, 1.0))
    store.submit_nowait(commands.pin_file("odd", True, 1.0))
    store.submit_nowait(commands.put_model(model("chat").llamacpp("mirror://tiny").build(), 1.0))
    world = World(store, nodes if nodes is not None else [cache_node("gpu-1", SHA)])
    world.deps.state_dir = tmp_path
    blobs = BlobStore(tmp_path / "mirror")
    blobs.make_dirs()
    blobs.blob_path(SHA).write_bytes(b"x")  # held by this member (its size is the catalog's business)
    return world


async def test_the_page_shows_files_holders_budget_and_an_upload_in_progress(tmp_path: Path) -> None:
    world = world_with_mirror(tmp_path, [cache_node("gpu-1", SHA), cache_node("gpu-2", "ef" * 32)])
    store = BlobStore(tmp_path / "mirror")
    up = store.start("next", 4 << 20, None)
    (store.uploads / f"{up.id}").write_bytes(b"\0" * (1 << 20))  # a quarter received
    async with world.client() as c:
        await sign_in(c)
        r = await c.get("/mirror")
    assert r.status_code == 200, r.text
    html = r.text
    assert 'data-testid="nav-mirror"' in html and 'aria-current="page"' in html
    table = text_of(html, "mirror-table")
    assert "tiny" in table and "5.0 MiB" in table and "llama" in table and "1.2B" in table and "Q4_K_M" in table
    assert "model chat" in table  # what uses it
    assert f'title="{SHA}"' in html and SHA[:12] + "…" in html and f'value="{SHA}"' in html  # short, whole on hover
    rows = html.split("<tr>")
    tiny = next(r for r in rows if ">tiny<" in r)
    odd = next(r for r in rows if ">odd<" in r)
    assert "gpu-1" in tiny and "gpu-2" not in tiny  # the node caches holding this sha256
    assert "<td>yes</td>" in odd and "<td>no</td>" in tiny  # pinned
    assert '<span class="unknown">unknown</span>' in odd  # no architecture known: unknown, never 0 or empty
    assert "<td>nothing</td>" in odd
    assert "2 file(s)" in text_of(html, "mirror-budget")
    assert "5.0 MiB of 100.0 GiB" in text_of(html, "mirror-budget")  # the catalog's bytes against mirror.budget_gib
    uploads = text_of(html, "mirror-uploads")
    assert "next" in uploads and "1.0 MiB" in uploads and "4.0 MiB" in uploads and "25%" in uploads
    assert 'data-testid="mirror-upload"' in html and 'data-piece-bytes="8388608"' in html


async def test_a_disconnected_node_and_a_silent_member_are_unknown(tmp_path: Path) -> None:
    from llmgw.console.mirror_page import render

    doc = {"files": [{"name": "tiny", "sha256": SHA, "size": 10, "kind": "gguf", "metadata": {}, "pinned": False,
                      "used_by": [], "members": {"holding": ["a"], "missing": []}}],
           "budget_bytes": None, "stored_bytes": 10, "uploads": [], "members": ["a"]}
    html = render(doc, [{"node": "gone", "storage": None}], members_known=["a", "b"])
    assert "unknown: gone" in html and "unknown: b" in html
    assert 'data-testid="mirror-budget">1 file(s); stored of the budget (mirror.budget_gib): <span class="unknown">' \
        in html
    assert "unknown" in render(None, [], problem="no state dir")


async def upload(c: httpx.AsyncClient, csrf: str, name: str, data: bytes, piece: int) -> httpx.Response:
    """What console.js does: start, the pieces with Content-Range, the commit; the commit's answer."""
    h = {"x-csrf-token": csrf}
    start = await c.post("/mirror/uploads", content=json.dumps({"name": name, "size": len(data)}), headers=h)
    assert start.status_code == 200, start.text
    uid, offset = start.json()["id"], start.json()["offset"]
    while offset < len(data):
        end = min(offset + piece, len(data))
        r = await c.put(f"/mirror/uploads/{uid}", content=data[offset:end],
                        headers={**h, "content-range": f"bytes {offset}-{end - 1}/{len(data)}"})
        assert r.status_code == 200, r.text
        offset = r.json()["offset"]
    return await c.post(f"/mirror/uploads/{uid}/commit", headers=h)


async def test_upload_in_pieces_resumes_from_the_offset_held_commits_and_lists(tmp_path: Path) -> None:
    world = world_with_mirror(tmp_path)
    data = write_tiny_llama(tmp_path / "t.gguf").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    piece = 1 << 16
    async with world.client() as c:
        await sign_in(c)
        csrf = csrf_of((await c.get("/mirror")).text)
        h = {"x-csrf-token": csrf}
        start = await c.post("/mirror/uploads", content=json.dumps({"name": "llama-up", "size": len(data)}),
                             headers=h)
        uid = start.json()["id"]
        first = await c.put(f"/mirror/uploads/{uid}", content=data[:piece],
                            headers={**h, "content-range": f"bytes 0-{piece - 1}/{len(data)}"})
        assert first.status_code == 200 and first.json()["offset"] == piece
        # The answer was lost: the script sends the same piece again; the leader says where it stands.
        again = await c.put(f"/mirror/uploads/{uid}", content=data[:piece],
                            headers={**h, "content-range": f"bytes 0-{piece - 1}/{len(data)}"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "upload_offset_mismatch"
        assert again.json()["error"]["offset"] == piece
        shown = await c.get("/mirror")
        assert "llama-up" in text_of(shown.text, "mirror-uploads")  # in progress, on the page
        done = await upload(c, csrf, "llama-up", data, piece)  # started again: goes on from `piece`
        assert done.status_code == 201, done.text
        assert done.json()["file"]["sha256"] == sha and done.json()["file"]["kind"] == "gguf"
        page = await c.get("/mirror?added=llama-up")
        api = await c.get("/api/v1/mirror", headers={"authorization": f"Bearer {ADMIN}"})
    assert "llama-up" in text_of(page.text, "mirror-table") and 'data-testid="mirror-added"' in page.text
    assert "llama-up" not in text_of(page.text, "mirror-uploads")
    assert any(f["name"] == "llama-up" for f in api.json()["files"])
    assert (tmp_path / "mirror" / "blobs" / sha).read_bytes() == data


async def test_a_piece_over_the_apps_1_mib_limit_passes_and_a_bad_file_is_refused_with_why(tmp_path: Path) -> None:
    world = world_with_mirror(tmp_path)
    junk = b"not a model file at all " * 100_000  # 2.4 MB: one piece, over the admin app's 1 MiB
    async with world.client() as c:
        await sign_in(c)
        csrf = csrf_of((await c.get("/mirror")).text)
        r = await upload(c, csrf, "junk", junk, len(junk))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_file", r.text
    assert r.json()["error"]["message"]
    assert "junk" not in {f for f in world.store.snapshot().mirror}


async def test_a_viewer_and_a_missing_csrf_token_are_refused(tmp_path: Path) -> None:
    world = world_with_mirror(tmp_path)
    body = json.dumps({"name": "x", "size": 10})
    async with world.client() as c:
        await sign_in(c, VIEWER)
        viewer_page = await c.get("/mirror")
        csrf = csrf_of(viewer_page.text)
        as_viewer = await c.post("/mirror/uploads", content=body, headers={"x-csrf-token": csrf})
    assert as_viewer.status_code == 403 and 'data-testid="mirror-upload"' not in viewer_page.text
    async with world.client() as c:
        await sign_in(c, ADMIN)
        no_token = await c.post("/mirror/uploads", content=body)
        put = await c.put("/mirror/uploads/" + "0" * 32, content=b"x", headers={"content-range": "bytes 0-0/10"})
    assert no_token.status_code == 403 and put.status_code == 403
    assert not list((tmp_path / "mirror" / "uploads").glob("*.json"))


async def test_serve_a_file_shows_the_preview_then_defines_the_model_once_confirmed(tmp_path: Path) -> None:
    world = world_with_mirror(tmp_path)
    data = write_tiny_llama(tmp_path / "t.gguf").read_bytes()
    async with world.client() as c:
        await sign_in(c)
        page = await c.get("/mirror")
        csrf = csrf_of(page.text)
        assert (await upload(c, csrf, "llama-up", data, 1 << 20)).status_code == 201
        listed = await c.get("/mirror")
        assert 'data-testid="mirror-serve"' in listed.text
        preview = await c.post("/mirror/serve", data={"csrf": csrf, "file": "llama-up", "name": "from-mirror"})
        assert preview.status_code == 200, preview.text
        assert 'data-testid="plan-verdict"' in preview.text and "mirror://llama-up" in preview.text
        assert "from-mirror" not in world.store.snapshot().models  # the preview commits nothing
        fields = hidden(preview.text, "confirm-form")
        done = await c.post("/mirror/serve", data=fields)
        again = await c.post("/mirror/serve", data=fields)  # sent twice (a reload): applied once
    assert 'data-outcome="done"' in done.text, done.text
    assert 'data-outcome="done"' in again.text
    assert world.store.snapshot().models["from-mirror"].source == "mirror://llama-up"


async def test_serve_is_refused_in_words_when_the_file_is_unknown(tmp_path: Path) -> None:
    world = world_with_mirror(tmp_path)
    async with world.client() as c:
        await sign_in(c)
        csrf = csrf_of((await c.get("/mirror")).text)
        r = await c.post("/mirror/serve", data={"csrf": csrf, "file": "no-such-file"})
    assert 'data-outcome="refused"' in r.text
    assert "no mirror file named" in r.text or "no serve-from-mirror operation" in r.text
