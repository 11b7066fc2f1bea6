"""The leader's check: every `notify_check_s`, while this member leads, the conditions of a running control
plane (`control_conditions`: the same summary `ctl status` reads) handed to the notifier; and the HTTP POST
the notifier delivers with (httpx).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import trio

from llmgw import __version__
from llmgw.control.admin import ControlDeps
from llmgw.control.admin_metrics import local_cluster
from llmgw.domain import summary
from llmgw.domain.conditions import Condition, conditions
from llmgw.domain.settings import effective
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.notify.hooks import webhooks_of
from llmgw.notify.notifier import Notifier, Post

log = logging.getLogger("llmgw.notify")


def http_post(client: httpx.AsyncClient) -> Post:
    """The notifier's POST over `client` (made with no timeout of its own: the notifier bounds each try)."""

    async def post(url: str, data: bytes) -> int:
        r = await client.post(url, content=data, headers={"content-type": "application/json",
                                                          "user-agent": f"llmgw/{__version__}"})
        return r.status_code

    return post


def control_conditions(deps: ControlDeps, now: float | None = None) -> list[Condition]:
    """The conditions of a running control plane now (`now`: its clock's, by default): from the summary
    `GET /api/v1/status` builds, with the members as this member's Raft links see them (no probe of the
    others), and its notifier's webhook health. Meaningful on the leader, which alone hears the agents."""
    now = deps.clock() if now is None else now
    plan = deps.reconciler.last_plan
    doc = summary.build(deps.store.snapshot(), deps.hub.observed(), plan.views if plan else None,
                        local_cluster(deps), now)
    return conditions(doc, now, timeouts=deps.reconciler.timeouts,
                      webhooks=deps.notifier.health() if deps.notifier is not None else ())


async def watch(notifier: Notifier, evaluate: Callable[[], list[Condition]], settings: Callable[[], Any],
                leads: Callable[[], bool], *, clock: Callable[[], float], timeouts: Timeouts = TIMEOUTS,
                task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Every `notify_check_s` while `leads()`: the webhooks from the settings, then the conditions to the
    notifier. Its own task: a check or a delivery never waits on a reconcile pass, nor one on them."""
    task_status.started()
    leading = False
    while True:
        if leads():
            leading = True
            try:
                notifier.configure(webhooks_of(effective(settings(), "notify.webhooks")))
                notifier.observe(evaluate(), clock())
            except Exception:  # a bug in one check must not end notifying; the next check retries
                log.exception("notify check failed; trying again in %g s", timeouts.notify_check_s)
        elif leading:
            leading = False
            notifier.step_down()
        await trio.sleep(timeouts.notify_check_s)
