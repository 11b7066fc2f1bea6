"""The control planes: the members' table (each asked for its own view), this member's own view, and
membership changes (one at a time, each committed through Raft)."""

from __future__ import annotations

import logging
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Created, Note
from llmgw.domain import commands
from llmgw.errors import AdminError

log = logging.getLogger("llmgw.control.admin")


async def table(ctx: Context, authorization: str | None) -> dict[str, Any]:
    """Every member as this one sees it, each asked with the caller's `authorization`."""
    return await ctx.cluster(authorization)


async def restart_self(ctx: Context) -> dict[str, Any]:
    """Restart this member in place: it stops as on SIGTERM (a leader hands over first) and runs again with
    the same flags and pid; 409 when it runs inside another process."""
    if ctx.restart is None:
        raise AdminError(409, "cannot_restart", "this control plane runs inside another process (llmgw up, a "
                                                "test): restart that process instead")
    import os

    ctx.restart("asked by an operator (ctl members restart)", None)
    return {"restarting": ctx.self_id, "pid": os.getpid()}


async def self_view(ctx: Context) -> dict[str, Any]:
    if ctx.members is None:
        raise AdminError(404, "not_found", "this control plane runs no Raft group")
    return ctx.members.self_doc()


async def add(ctx: Context, note: Note, doc: Any) -> dict[str, Any]:
    """Add a member by its Raft address (`{"raft_addr": "HOST:PORT"}`)."""
    addr = doc.get("raft_addr") if isinstance(doc, dict) else None
    note(commands.digest({"op": "members.add", "raft_addr": addr}))
    if ctx.members is None:
        raise AdminError(409, "membership_unavailable", "this control plane runs no Raft group to add to")
    result = await ctx.members.add(addr)
    log.info("member %s added to the group", result["added"])
    return Created(result)


async def remove(ctx: Context, note: Note, member: str) -> dict[str, Any]:
    note(commands.digest({"op": "members.remove", "raft_addr": member}))
    if ctx.members is None:
        raise AdminError(409, "membership_unavailable", "this control plane runs no Raft group to remove from")
    result = await ctx.members.remove(member)
    log.info("member %s removed from the group", member)
    return result
