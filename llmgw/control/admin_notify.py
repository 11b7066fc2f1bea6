"""The notifier's routes: `GET /api/v1/notify/status` (each webhook's deliveries, the conditions active now)
and `POST /api/v1/notify/test` (a test event to every webhook, each outcome). A standby forwards both to the
leader, whose notifier alone posts.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from quart import Response

from llmgw.domain.settings import effective
from llmgw.errors import AdminError
from llmgw.notify.hooks import webhooks_of

if TYPE_CHECKING:
    from llmgw.control.admin import ControlDeps

Route = Callable[..., Callable[[Callable[..., Awaitable[Response]]], Any]]
HOW_TO_SET = ("set one: llmgw ctl settings notify.webhooks '[\"https://hooks.example/llmgw\"]' (or "
              "'[{\"url\": \"https://hooks.slack.com/services/...\", \"format\": \"slack\"}]')")


def _ok(doc: Any) -> Response:
    return Response(json.dumps(doc), status=200, content_type="application/json")


def register(route: Route, deps: ControlDeps) -> None:
    """Add the routes through the admin app's `route` (admin key, forwarding to the leader, error shape)."""

    @route("/api/v1/notify/status", ["GET"])
    async def notify_status() -> Response:
        hooks = webhooks_of(effective(deps.store.snapshot().settings, "notify.webhooks"))
        doc: dict[str, Any] = {"configured": len(hooks), "hint": "" if hooks else f"no notify.webhooks: {HOW_TO_SET}"}
        if deps.notifier is None:
            return _ok({**doc, "running": False, "checked_at": None, "webhooks": [], "active": []})
        return _ok({**doc, "running": True, **deps.notifier.status()})

    @route("/api/v1/notify/test", ["POST"])
    async def notify_test() -> Response:
        hooks = webhooks_of(effective(deps.store.snapshot().settings, "notify.webhooks"))
        if not hooks:
            raise AdminError(409, "no_webhooks", f"no webhook to test: notify.webhooks is empty; {HOW_TO_SET}")
        if deps.notifier is None:
            raise AdminError(409, "notifier_not_running", "this control plane runs no notifier")
        deps.notifier.configure(hooks)  # the setting as committed now, even before the next check
        results = await deps.notifier.test()
        return _ok({"delivered": sum(1 for r in results if r["outcome"] == "delivered"), "webhooks": results})
