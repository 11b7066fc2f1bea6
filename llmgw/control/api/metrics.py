"""`GET /metrics` on the admin port: the control plane's Prometheus families (llmgw/metrics/control.py).

No key, like /health: Prometheus scrapers rarely hold one, and what it shows (names and counts) is what an
operator's dashboard shows; keep the admin port on the management network (docs/observability.md). Each
member answers itself, never forwarded: its Raft view is its own, and the fleet's families come from the leader.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from llmgw.control.api.route import Raw
from llmgw.control.context import Context
from llmgw.metrics.control import Scrape, registry_for
from llmgw.metrics.expose import CONTENT_TYPE, render


def reader(ctx: Context) -> Callable[[], Scrape]:
    """What a scrape reads, taken on the loop (values and copies); the returned call computes the cluster's
    look from them (`Context.look_inputs`: the members as this member's Raft links see them), in a worker
    thread (at 1,000 nodes it takes tens of ms: tests/bench/metrics.py)."""
    leading = ctx.store.is_leader()
    raft = {**ctx.store_status(), "is_leader": leading}
    connections = ctx.connections() if ctx.connections is not None else None
    if not leading:
        return lambda: Scrape(ctx.self_id, leading, raft, connections=connections)
    inputs = ctx.look_inputs(ctx.local_cluster())
    restarts = dict(ctx.hub.restarts_total)
    delivered = dict(ctx.webhook_deliveries()) if ctx.webhook_deliveries is not None else None

    def build() -> Scrape:
        look = inputs.compute()
        return Scrape(ctx.self_id, leading, raft, look.summary, restarts, look.conditions, delivered,
                      connections=connections)
    return build


def exposition(read: Callable[[], Scrape]) -> bytes:
    """The text of one scrape (in a worker thread: `read` and the families never touch the loop's objects)."""
    return render(registry_for(read))


async def scrape(ctx: Context) -> Raw:
    body = await trio.to_thread.run_sync(exposition, reader(ctx))
    return Raw(body, CONTENT_TYPE)
