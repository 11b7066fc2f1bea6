"""The cluster-wide switch (`llmgw stop` / `llmgw start`): `serving.stopped` set live; no model
definition changes."""

from __future__ import annotations

import logging
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit
from llmgw.domain import commands
from llmgw.domain.settings import effective

log = logging.getLogger("llmgw.control.admin")


async def stop(ctx: Context, commit: Commit) -> dict[str, Any]:
    return await switch(ctx, commit, True)


async def start(ctx: Context, commit: Commit) -> dict[str, Any]:
    return await switch(ctx, commit, False)


async def switch(ctx: Context, commit: Commit, stopped: bool) -> dict[str, Any]:
    """Commit `serving.stopped`; say what was, and what the reconciler now frees or places."""
    was = bool(effective(ctx.state().settings, "serving.stopped"))
    await commit(commands.put_setting("serving.stopped", stopped, ctx.clock()))
    state = ctx.state()
    if stopped != was:
        log.warning("serving %s (serving.stopped = %s)", "stopped" if stopped else "started", str(stopped).lower())
    placed = list(state.placements.values())
    return {
        "stopped": stopped,
        "changed": stopped != was,
        "models": len(state.models),
        # What is still placed now: being stopped (after `stop`), or left from before (after `start`).
        "replicas_placed": len(placed),
        "gpus_placed": sum(len(p.gpus) for p in placed),
    }
