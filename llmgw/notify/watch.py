"""The leader's check: every `notify_check_s`, while this member leads, the conditions of a running control
plane (`control_conditions`: the same summary `ctl status` reads) handed to the notifier; and the HTTP POST
the notifier delivers with (httpx).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from llmgw import __version__
from llmgw.control.context import Context
from llmgw.domain.conditions import Condition
from llmgw.domain.settings import effective
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.notify.hooks import webhooks_of
from llmgw.notify.notifier import Ledger, Notifier, Post

log = logging.getLogger("llmgw.notify")


def http_post(client: httpx.AsyncClient) -> Post:
    """The notifier's POST over `client` (made with no timeout of its own: the notifier bounds each try)."""

    async def post(url: str, data: bytes) -> int:
        r = await client.post(url, content=data, headers={"content-type": "application/json",
                                                          "user-agent": f"llmgw/{__version__}"})
        return r.status_code

    return post


def control_conditions(ctx: Context, now: float | None = None) -> list[Condition]:
    """The conditions of a running control plane now (`now`: its clock's, by default): the context's one
    look, as `GET /api/v1/status` reads it, with the members as this member's Raft links see them (no probe
    of the others). Meaningful on the leader, which alone hears the agents."""
    return list(ctx.look(ctx.local_cluster(), now).conditions)


async def control_conditions_beside(ctx: Context) -> list[Condition]:
    """`control_conditions` now, built in a worker thread when the fleet is large (`Context.look_beside`): the
    leader's check, every `notify_check_s`, never stops its loop for a summary of 1,000 nodes."""
    return list((await ctx.look_beside(ctx.local_cluster())).conditions)


async def watch(notifier: Notifier, evaluate: Callable[[], list[Condition] | Awaitable[list[Condition]]],
                settings: Callable[[], Any],
                leads: Callable[[], bool], *, clock: Callable[[], float], timeouts: Timeouts = TIMEOUTS,
                ledger: Ledger | None = None, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Every `notify_check_s` while `leads()`: the webhooks from the settings, then the conditions to the
    notifier, checked against those the replicated state holds as posted (`ledger`; in the notifier's own
    memory without one, or while the group cannot record them). Its own task: a check or a delivery never
    waits on a reconcile pass, nor one on them (a check waits for its commit: `store_commit_s` at most).
    `evaluate` gives the conditions, or an awaitable of them (`control_conditions_beside`)."""
    task_status.started()
    leading = False
    while True:
        if leads():
            leading = True
            try:
                notifier.configure(webhooks_of(effective(settings(), "notify.webhooks")))
                found = evaluate()
                now = clock()
                if not isinstance(found, list):
                    found = await found
                if ledger is not None and ledger.ready():
                    await notifier.check(found, now, ledger)
                else:
                    notifier.observe(found, now)
            except Exception:  # a bug in one check must not end notifying; the next check retries
                log.exception("notify check failed; trying again in %g s", timeouts.notify_check_s)
        elif leading:
            leading = False
            notifier.step_down()
        await trio.sleep(timeouts.notify_check_s)
