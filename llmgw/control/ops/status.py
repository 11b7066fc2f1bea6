"""The cluster's status (`GET /api/v1/status`, `ctl status`): the one look of `Context.look`, as JSON, a page of it
by default (`domain/summary_pages.py`), answered from the look and bytes kept while nothing it reads has changed
(`control/status_cache.py`)."""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.control.context import Context
from llmgw.domain.summary_pages import StatusQuery
from llmgw.errors import AdminError


async def status(ctx: Context, authorization: str | None, args: Mapping[str, str]) -> bytes:
    """The summary with the conditions true now, the members asked with the caller's `authorization`: the page
    `args` asks for (`full=1`: every row), as JSON bytes."""
    try:
        query = StatusQuery.parse(args)
    except ValueError as e:
        raise AdminError(400, "invalid_query", str(e)) from None
    inputs = ctx.look_inputs(await ctx.cluster(authorization))
    return await ctx.status_cache.body(inputs, query, ctx.timeouts.status_cache_s)
