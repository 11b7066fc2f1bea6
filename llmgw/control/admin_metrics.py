"""`GET /metrics` on the admin port: the control plane's Prometheus families (llmgw/metrics/control.py).

No key, like /health: Prometheus scrapers rarely hold one, and what it shows (names and counts) is what an
operator's dashboard shows; keep the admin port on the management network (docs/observability.md). Each
member answers itself, never forwarded: its Raft view is its own, and the fleet's families come from the leader.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio
from quart import Response
from quart_trio import QuartTrio

from llmgw import __version__
from llmgw.domain import summary
from llmgw.domain.conditions import conditions
from llmgw.metrics.control import Scrape, registry_for
from llmgw.metrics.expose import CONTENT_TYPE, render

if TYPE_CHECKING:
    from llmgw.control.admin import ControlDeps

LINK_UP = 2  # pysyncobj's word for a connected partner


def local_cluster(deps: ControlDeps) -> dict[str, Any]:
    """The summary's `cluster` part as this member's Raft links see the group (no HTTP probe of the others:
    a scrape carries no admin key to ask them with). A partner whose link is down reads as missing."""
    st = deps.store_status()
    leading = deps.store.is_leader()
    leader = st.get("leader") or (deps.self_id if leading else None)
    me = {"role": "leader" if leading else "standby", "leader": leader, "ready": st.get("ready", True),
          "term": st.get("term"), "commit_index": st.get("commit_index"), "applied_index": st.get("last_applied"),
          "revision": deps.store.snapshot().revision}
    views: list[dict[str, Any]] = [{"id": deps.self_id, "answer": me}]
    partners: Mapping[str, Any] = st["partners"] if isinstance(st.get("partners"), Mapping) else {}
    match: Mapping[str, Any] = st["match_index"] if isinstance(st.get("match_index"), Mapping) else {}
    for member, link in sorted(partners.items()):
        if link != LINK_UP:
            views.append({"id": member, "error": f"its Raft link to {deps.self_id} is down"})
        else:
            views.append({"id": member, "answer": {"role": "leader" if member == leader else "standby",
                                                   "leader": leader, "ready": True,
                                                   "applied_index": match.get(member)}})
    return {"leader": leader, "self": deps.self_id, "version": __version__,
            "members": summary.member_rows(views, deps.clock())}


def scrape(deps: ControlDeps, views: Callable[[], dict[str, Any] | None]) -> Callable[[], Scrape]:
    """What a scrape reads, taken on the loop (values and copies); the returned call builds the summary from
    them, in a worker thread (at 1,000 nodes it takes tens of ms: tests/bench/metrics.py)."""
    leading = deps.store.is_leader()
    raft = {**deps.store_status(), "is_leader": leading}
    if not leading:
        return lambda: Scrape(deps.self_id, leading, raft)
    state, observed, plan, cluster, now = (deps.store.snapshot(), deps.hub.observed(), views(), local_cluster(deps),
                                           deps.clock())
    restarts = dict(deps.hub.restarts_total)
    delivered = dict(deps.webhook_deliveries()) if deps.webhook_deliveries is not None else None
    hooks = deps.notifier.health() if deps.notifier is not None else ()

    def build() -> Scrape:
        doc = summary.build(state, observed, plan, cluster, now)
        found = conditions(doc, now, timeouts=deps.reconciler.timeouts, webhooks=hooks)  # as GET /api/v1/status
        return Scrape(deps.self_id, leading, raft, doc, restarts, found, delivered)
    return build


def exposition(read: Callable[[], Scrape]) -> bytes:
    """The text of one scrape (in a worker thread: `read` and the families never touch the loop's objects)."""
    return render(registry_for(read))


def register(app: QuartTrio, deps: ControlDeps, views: Callable[[], dict[str, Any] | None]) -> None:

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await trio.to_thread.run_sync(exposition, scrape(deps, views))
        return Response(body, content_type=CONTENT_TYPE)
