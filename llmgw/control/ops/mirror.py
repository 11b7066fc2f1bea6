"""The model mirror (docs/mirror.md): its catalog (list, show, remove, pin), resumable uploads to the leader, the
blobs a standby pulls from the leader, and the budget and garbage collection.

The catalog is the replicated state's (`ClusterState.mirror`); each member keeps the blobs on its own disk
(`llmgw/mirror/blobs.py`, under `<state dir>/mirror`). Uploads go to the leader (the routes forward): its commit
submits `mirror.put` once the file is hashed and inspected. A removal that leaves a blob unnamed deletes it here;
every other member deletes it on its next pass of the mirror's sync (`llmgw/mirror/sync.py`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import trio

from llmgw.control.context import Context
from llmgw.control.ops import Commit, Created
from llmgw.domain import commands
from llmgw.domain.mirror import MirrorFile, referenced_blobs, used_by
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState
from llmgw.errors import AdminError
from llmgw.mirror.blobs import BlobStore, Inspect, MirrorError
from llmgw.mirror.inspect import FileFacts, inspect_file

log = logging.getLogger("llmgw.control.admin")

GIB = 1 << 30
_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")

def _inspect(path: Path, name: str) -> FileFacts:
    return inspect_file(path, name=name)


INSPECT: Inspect = _inspect  # what a commit runs: the mirror's validation (llmgw/mirror/inspect.py)


class OffsetError(AdminError):
    """A refusal that carries the offset an upload holds, so a client continues there."""

    def __init__(self, status: int, code: str, message: str, offset: int) -> None:
        super().__init__(status, code, message)
        self.offset = offset

    def doc(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "offset": self.offset}}


def _refusal(e: MirrorError) -> AdminError:
    if e.offset is not None:
        return OffsetError(e.status, e.code, e.message, e.offset)
    return AdminError(e.status, e.code, e.message)


def blob_store(ctx: Context) -> BlobStore:
    if ctx.state_dir is None:
        raise AdminError(409, "no_mirror", "this control plane has no state dir to keep the mirror's files in")
    return BlobStore(ctx.state_dir / "mirror", ctx.clock)


def budget_bytes(state: ClusterState) -> int:
    return int(float(effective(state.settings, "mirror.budget_gib")) * GIB)


def stored_bytes(state: ClusterState) -> int:
    """The catalog's bytes: each blob once, however many names share it."""
    return sum({f.sha256: f.size for f in state.mirror.values()}.values())


def _file_doc(state: ClusterState, f: MirrorFile, holders: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    users = used_by(state, f.name)
    holding = sorted(m for m, held in holders.items() if f.sha256 in held)
    return {**f.to_doc(), "used_by": users, "collectable": not users and not f.pinned,
            "members": {"holding": holding, "missing": sorted(m for m in holders if m not in holding)}}


async def held(ctx: Context) -> dict[str, Any]:
    """`GET /api/v1/mirror/held`, answered by the member asked: the blobs on its disk (sha256 -> size), the pulls in
    progress (sha256 -> bytes so far) and the last failure of each pull that failed."""
    blobs = await trio.to_thread.run_sync(blob_store(ctx).held) if ctx.state_dir is not None else {}
    sync = ctx.mirror_sync
    return {"member": ctx.self_id, "blobs": blobs, "pulling": dict(sync.pulling) if sync is not None else {},
            "errors": dict(sync.errors) if sync is not None else {}}


async def holdings(ctx: Context, authorization: str | None) -> dict[str, dict[str, int]]:
    """Which blobs each member holds, by member: this one's from its disk, each other member of the group asked
    (`GET /api/v1/mirror/held`, with the caller's key, within `member_probe_s`); one that does not answer is left
    out (it shows in `ctl members`)."""
    out: dict[str, dict[str, int]] = {ctx.self_id: (await held(ctx))["blobs"]}
    members = ctx.members
    if members is None:
        return out
    state = ctx.state()
    others = [m for m in members.addresses(members.group.status()) if m != ctx.self_id]

    async def ask(member: str) -> None:
        announced = state.members.get(member)
        if announced is None:
            return
        headers = {"Authorization": authorization} if authorization else {}
        try:
            async with members.client() as client:
                r = await client.get(announced.admin_url + "/api/v1/mirror/held", headers=headers,
                                     timeout=ctx.timeouts.member_probe_s)
            doc = r.json()
        except (httpx.HTTPError, ValueError):
            return
        if r.status_code == 200 and isinstance(doc, dict) and isinstance(doc.get("blobs"), dict):
            out[member] = {k: v for k, v in doc["blobs"].items() if isinstance(v, int)}

    async with trio.open_nursery() as nursery:
        for member in others:
            nursery.start_soon(ask, member)
    return out


async def list_files(ctx: Context, authorization: str | None = None) -> dict[str, Any]:
    state = ctx.state()
    holders = await holdings(ctx, authorization)
    files = [_file_doc(state, f, holders) for _, f in sorted(state.mirror.items())]
    uploads = await trio.to_thread.run_sync(blob_store(ctx).in_progress) if ctx.state_dir is not None else []
    return {"files": files, "budget_bytes": budget_bytes(state), "stored_bytes": stored_bytes(state),
            "uploads": [u.to_doc() for u in uploads], "members": sorted(holders)}


def _find(state: ClusterState, name: str) -> MirrorFile:
    found = state.mirror.get(name)
    if found is None:
        raise AdminError(404, "mirror_file_not_found", f"no mirror file named {name!r} (`llmgw ctl mirror list`)")
    return found


async def show(ctx: Context, name: str, authorization: str | None = None) -> dict[str, Any]:
    state = ctx.state()
    return {"file": _file_doc(state, _find(state, name), await holdings(ctx, authorization))}


async def collect(ctx: Context) -> list[str]:
    """Delete this member's blobs that no name of the catalog refers to any more."""
    if ctx.state_dir is None:
        return []
    async with ctx.mirror_lock:
        gone = await trio.to_thread.run_sync(blob_store(ctx).collect, referenced_blobs(ctx.state()))
    for sha in gone:
        log.info("mirror: blob %s deleted (no name refers to it)", sha[:12])
    return gone


async def remove(ctx: Context, commit: Commit, name: str) -> dict[str, Any]:
    """Remove a name (409 `mirror_file_in_use`, naming the users, while anything uses it); a blob no name refers to
    any more is deleted."""
    result = await commit(commands.remove_file(name, ctx.clock()))
    if not result.get("removed"):
        raise AdminError(404, "mirror_file_not_found", f"no mirror file named {name!r} (already removed?)")
    log.info("mirror file %s removed", name)
    return {"removed": name, "collected": await collect(ctx)}


async def pin(ctx: Context, commit: Commit, name: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or set(body) != {"pinned"} or not isinstance(body["pinned"], bool):
        raise AdminError(400, "invalid_request", 'send {"pinned": true} or {"pinned": false}')
    _find(ctx.state(), name)
    result = await commit(commands.pin_file(name, body["pinned"], ctx.clock()))
    return {"name": name, "pinned": result["pinned"], "changed": result["changed"]}


# -- uploads ---------------------------------------------------------------------------------------


async def start_upload(ctx: Context, body: Any) -> dict[str, Any]:
    """`POST /api/v1/mirror/uploads` {name, size, sha256?}: the upload's id and offset (0, or where an upload of
    the same file stopped). Refused at its start when the file would pass the budget (`mirror_budget_exceeded`)."""
    if not isinstance(body, dict) or set(body) - {"name", "size", "sha256"} or not {"name", "size"} <= set(body):
        raise AdminError(400, "invalid_request", 'send {"name": NAME, "size": BYTES} and, optionally, "sha256"')
    name, size, sha = body["name"], body["size"], body.get("sha256")
    state = ctx.state()
    old = state.mirror.get(name) if isinstance(name, str) else None
    if old is not None and old.sha256 != sha:
        raise AdminError(409, "mirror_name_taken", f"the mirror already holds a file named {name} (sha256 "
                         f"{old.sha256[:12]}): remove it first (`llmgw ctl mirror remove {name}`), or pick another "
                         "name")
    store = blob_store(ctx)
    try:
        uploads = await trio.to_thread.run_sync(store.in_progress)
        stored = stored_bytes(state)
        pending = sum(u.size for u in uploads if not (u.name == name and u.size == size and u.sha256 == sha))
        budget = budget_bytes(state)
        adds = 0 if sha is not None and any(f.sha256 == sha for f in state.mirror.values()) else size  # one blob
        if isinstance(adds, int) and not isinstance(adds, bool) and stored + pending + adds > budget:
            raise AdminError(409, "mirror_budget_exceeded", f"{name} ({_gib(size)}) would pass the mirror's budget: "
                             f"{_gib(stored)} stored and {_gib(pending)} being uploaded of {_gib(budget)} "
                             "(mirror.budget_gib); remove files (`llmgw ctl mirror remove`) or raise the budget")
        up = await trio.to_thread.run_sync(store.start, name, size, sha)
    except MirrorError as e:
        raise _refusal(e) from None
    return {"id": up.id, "offset": up.offset, "size": up.size, "name": up.name}


def content_range(headers: Mapping[str, str]) -> tuple[int, int, int]:
    """`Content-Range: bytes START-END/TOTAL` (END inclusive), or 400."""
    raw = headers.get("content-range", "")
    m = _RANGE.fullmatch(raw.strip())
    if m is None or int(m.group(1)) > int(m.group(2)) or int(m.group(2)) >= int(m.group(3)):
        raise AdminError(400, "invalid_request", "send each piece with 'Content-Range: bytes START-END/TOTAL' (END "
                                                 f"inclusive, below TOTAL), not {raw[:80]!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


async def put_piece(ctx: Context, uid: str, headers: Mapping[str, str], chunks: AsyncIterator[bytes]) -> dict[str, Any]:
    """`PUT /api/v1/mirror/uploads/ID`: append a piece at the offset its Content-Range says; the new offset. Another
    offset than the one held: 409 `upload_offset_mismatch` with `offset`."""
    start, end, total = content_range(headers)
    try:
        up = await blob_store(ctx).write(uid, start, total, chunks, end)
    except MirrorError as e:
        raise _refusal(e) from None
    return {"id": up.id, "offset": up.offset, "size": up.size}


async def upload_status(ctx: Context, uid: str) -> dict[str, Any]:
    try:
        up = await trio.to_thread.run_sync(blob_store(ctx).get, uid)
    except MirrorError as e:
        raise _refusal(e) from None
    return up.to_doc()


async def commit_upload(ctx: Context, commit: Commit, uid: str) -> dict[str, Any]:
    """`POST /api/v1/mirror/uploads/ID/commit`: hash, inspect and keep the file, and add its name to the catalog.
    A refused file is deleted (400 `invalid_file` with the reason)."""
    store = blob_store(ctx)
    async with ctx.mirror_lock:  # no collection deletes the blob before its name is in the catalog
        try:
            up, sha, facts, _ = await trio.to_thread.run_sync(store.finish, uid, INSPECT)
        except MirrorError as e:
            raise _refusal(e) from None
        result = await commit(commands.put_file(up.name, sha, up.size, facts.kind, facts.to_doc(), ctx.clock()))
    log.info("mirror file %s added (%s, %d bytes, sha256 %s)", up.name, facts.kind, up.size, sha[:12])
    state = ctx.state()
    doc = {"file": _file_doc(state, _find(state, up.name), {ctx.self_id: (await held(ctx))["blobs"]}),
           "added": result["added"]}
    return Created(doc) if result["added"] else doc


async def drop_upload(ctx: Context, uid: str) -> dict[str, Any]:
    store = blob_store(ctx)
    try:
        await trio.to_thread.run_sync(store.get, uid)
    except MirrorError as e:
        raise _refusal(e) from None
    await trio.to_thread.run_sync(store.discard, uid)
    return {"dropped": uid}




def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
