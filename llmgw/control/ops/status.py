"""The cluster's status (`GET /api/v1/status`, `ctl status`): the one look of `Context.look`, as JSON."""

from __future__ import annotations

from typing import Any

from llmgw.control.context import Context


async def status(ctx: Context, authorization: str | None) -> dict[str, Any]:
    """The summary with the conditions true now, the members asked with the caller's `authorization`."""
    return ctx.look(await ctx.cluster(authorization)).summary.to_doc()
