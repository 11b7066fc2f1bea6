"""Releases for `llmgw ctl upgrade`: a release file uploaded to this member (kept by sha256 under its state dir),
served to the cluster's machines, and the upgrade (or rollback) of this member or of one node's agent.

Each control plane keeps the file itself (ctl uploads it to every one): leadership moves during a rolling upgrade,
and an agent fetches from whichever member leads then. Judged by sha256 only, never by version (llmgw/release.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from llmgw import release
from llmgw.release_fetch import receive
from llmgw.control.context import Context
from llmgw.errors import AdminError

log = logging.getLogger("llmgw.control.admin")


def _error(e: release.ReleaseError) -> AdminError:
    status = {"sha256_mismatch": 422, "release_too_large": 413, "not_a_zipapp": 409, "no_previous_release": 409,
              "release_not_found": 404}.get(e.code, 400)
    return AdminError(status, e.code, e.message)


def _store(ctx: Context) -> Path:
    if ctx.state_dir is None:
        raise AdminError(409, "cannot_upgrade", "this control plane has no state dir to keep releases in")
    return ctx.state_dir / release.STORE_DIR


def _sha(value: str) -> str:
    try:
        return release.checked_sha256(value, "the path's SHA256")
    except release.ReleaseError as e:
        raise _error(e) from None


async def upload(ctx: Context, sha256: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
    """`PUT /api/v1/releases/SHA256`: the body, streamed to disk and kept only if its sha256 is the path's
    (422 `sha256_mismatch` otherwise: a cut upload leaves nothing)."""
    sha = _sha(sha256)
    store = _store(ctx)
    target = store / f"{sha}.pyz"
    receiver = await trio.to_thread.run_sync(lambda: release.Receiver(store, target, sha, mode=0o700))
    try:
        path = await receive(receiver, chunks)
    except release.ReleaseError as e:
        log.warning("a release upload was refused: %s", e.message)
        raise _error(e) from None
    finally:
        receiver.abort()  # nothing when it was renamed into place
    log.info("release %s received (%d bytes)", sha[:12], receiver.size)
    return {"sha256": sha, "size": receiver.size, "member": ctx.self_id, "path": str(path)}


async def download(ctx: Context, sha256: str) -> Path:
    """`GET /api/v1/releases/SHA256` (a machine of the cluster fetching its upgrade): the file, by sha256."""
    path = _store(ctx) / f"{_sha(sha256)}.pyz"
    if not path.is_file():
        raise AdminError(404, "release_not_found", f"this control plane ({ctx.self_id}) holds no release "
                                                   f"{sha256[:12]}: upload it first (`llmgw ctl upgrade FILE` does)")
    return path


async def upgrade_self(ctx: Context, body: Any) -> dict[str, Any]:
    """`POST /api/v1/cluster/self/upgrade`: this member restarts in place into the release (uploaded to it first)
    or, with `rollback`, into the file it ran before; a leader hands leadership over first."""
    if ctx.restart is None:
        raise AdminError(409, "cannot_upgrade", "this control plane runs inside another process (llmgw up, a test): "
                                                "upgrade that process instead")
    now = release.running()
    try:
        sha, rollback = release.target_of(body, now)
        if not rollback and sha == now.sha256:
            return {"upgrading": None, "unchanged": True, "release_sha256": sha, "pid": os.getpid()}
        source = None if rollback else await download(ctx, sha)
        path, sha = await trio.to_thread.run_sync(release.prepare, _store(ctx).parent, now, source, sha, rollback)
    except release.ReleaseError as e:
        raise _error(e) from None
    log.info("upgrade asked: running %s (sha256 %s) next, in place", path, sha[:12])
    ctx.restart(f"asked by an operator (ctl upgrade{' --rollback' if rollback else ''}): into {path.name}", path)
    return {"upgrading": ctx.self_id, "pid": os.getpid(), "from": now.sha256, "to": sha, "file": str(path)}


async def upgrade_node(ctx: Context, name: str, body: Any) -> dict[str, Any]:
    """`POST /api/v1/nodes/NAME/upgrade`: ask a connected node's agent, over its stream, to fetch the release from
    this leader and restart into it (or into the file it ran before: `rollback`); its engines keep serving. With
    when its current stream connected, so a caller can wait for the next one."""
    hub = ctx.hub
    state = hub.node_state(name)
    if state == "unknown":
        raise AdminError(404, "node_not_found", f"no node named {name!r} is known to the leader")
    if state != "connected":
        raise AdminError(409, "node_not_connected", f"node {name} is {state}: only a connected agent can be upgraded")
    rollback = body.get("rollback", False) if isinstance(body, dict) else None
    if not isinstance(body, dict) or set(body) - {"sha256", "rollback"} or not isinstance(rollback, bool) or \
            rollback == ("sha256" in body):
        raise AdminError(400, "invalid_request", 'send either {"sha256": "<64 hex digits>"} or {"rollback": true}')
    message: dict[str, Any] = {"type": "upgrade_agent"}
    if body.get("rollback"):
        message["rollback"] = True
    else:
        sha = body.get("sha256")
        await download(ctx, sha if isinstance(sha, str) else "")  # held here, or 404 now rather than on the node
        message["sha256"] = sha
    since = hub.connected_at.get(name)
    hub.upgrade_refused.pop(name, None)
    if not hub.send(name, message):
        raise AdminError(503, "node_busy", f"node {name}'s stream did not take the message (backed up or closing); "
                                           f"retry")
    return {"upgrading": name, "connected_at": since, "to": message.get("sha256"),
            "rollback": bool(message.get("rollback"))}
