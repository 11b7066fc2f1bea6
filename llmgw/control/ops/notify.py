"""The notifier's status (each webhook's deliveries, the conditions active now) and a test event to every
webhook. The leader's notifier alone posts: a standby forwards both. And where the notifier keeps the
conditions it posted: the replicated state (`ledger`)."""

from __future__ import annotations

from typing import Any

from llmgw.control.context import Context
from llmgw.domain import levels
from llmgw.domain.commands import CommandError
from llmgw.domain.settings import effective
from llmgw.errors import AdminError
from llmgw.notify.hooks import webhooks_of
from llmgw.notify.notifier import Ledger, NotRecorded
from llmgw.store import CommitUnknown, NotLeader, StoreUnavailable

HOW_TO_SET = ("set one: llmgw ctl settings notify.webhooks '[\"https://hooks.example/llmgw\"]' (or "
              "'[{\"url\": \"https://hooks.slack.com/services/...\", \"format\": \"slack\"}]')")


async def status(ctx: Context) -> dict[str, Any]:
    hooks = webhooks_of(effective(ctx.state().settings, "notify.webhooks"))
    doc: dict[str, Any] = {"configured": len(hooks), "hint": "" if hooks else f"no notify.webhooks: {HOW_TO_SET}"}
    if ctx.notifier is None:
        return {**doc, "running": False, "checked_at": None, "webhooks": [], "active": []}
    return {**doc, "running": True, **ctx.notifier.status()}


async def test(ctx: Context) -> dict[str, Any]:
    hooks = webhooks_of(effective(ctx.state().settings, "notify.webhooks"))
    if not hooks:
        raise AdminError(409, "no_webhooks", f"no webhook to test: notify.webhooks is empty; {HOW_TO_SET}")
    if ctx.notifier is None:
        raise AdminError(409, "notifier_not_running", "this control plane runs no notifier")
    ctx.notifier.configure(hooks)  # the setting as committed now, even before the next check
    results = await ctx.notifier.test()
    return {"delivered": sum(1 for r in results if r["outcome"] == "delivered"), "webhooks": results}


def ledger(ctx: Context) -> Ledger:
    """The notifier's record of the conditions it posted: `ClusterState.active_conditions`, updated by a
    `condition.update` committed through this member (the leader), once the group reads store level 3."""

    async def record(command: dict[str, Any]) -> Any:
        try:
            return await ctx.store.submit(command)
        except CommitUnknown as e:
            raise NotRecorded(f"commit not confirmed: {e}", maybe=True) from None
        except NotLeader as e:
            raise NotRecorded(f"no longer the leader (leader now: {e.leader or 'unknown'})") from None
        except (StoreUnavailable, CommandError) as e:
            raise NotRecorded(f"{type(e).__name__}: {e}") from None

    return Ledger(active=lambda: ctx.state().active_conditions, record=record,
                  ready=lambda: ctx.state().store_level >= levels.op_level("condition.update"))
