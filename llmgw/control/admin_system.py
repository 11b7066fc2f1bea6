"""The admin API's cluster-wide switch: `POST /api/v1/system/stop` and `/start` set
`serving.stopped` live (`llmgw stop` / `llmgw start`); no model definition changes.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from quart import Response

from llmgw.domain import commands
from llmgw.domain.settings import effective

if TYPE_CHECKING:
    from llmgw.control.admin import ControlDeps

log = logging.getLogger("llmgw.control.admin")

Route = Callable[..., Callable[[Callable[..., Awaitable[Response]]], Any]]
Commit = Callable[[dict[str, Any]], Awaitable[Any]]


def _ok(doc: Any) -> Response:
    return Response(json.dumps(doc), status=200, content_type="application/json")


def register(route: Route, deps: ControlDeps, commit: Commit) -> None:
    """Add the stop/start routes through the admin app's `route` (admin key, forwarding to the
    leader, idempotent writes, error shape); `commit` is its idempotent commit."""

    @route("/api/v1/system/stop", ["POST"])
    async def stop() -> Response:
        return _ok(await switch(deps, commit, True))

    @route("/api/v1/system/start", ["POST"])
    async def start() -> Response:
        return _ok(await switch(deps, commit, False))


async def switch(deps: ControlDeps, commit: Commit, stopped: bool) -> dict[str, Any]:
    """Commit `serving.stopped`; say what was, and what the reconciler now frees or places."""
    was = bool(effective(deps.store.snapshot().settings, "serving.stopped"))
    await commit(commands.put_setting("serving.stopped", stopped, deps.clock()))
    state = deps.store.snapshot()
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
