"""`GET /api/v1/status` at fleet scale: by default the aggregates and a page of each list that grows with the fleet,
under 1 MB at 1,000 nodes; `?full=1` the whole document as before; pages that add up to the full lists; and the
look and its bytes built once per revision of what they read (counted, never timed)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
import trio

from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.status_cache import LOOK_BESIDE_NODES, STALE
from llmgw.domain import commands
from llmgw.domain.summary import CertRow
from llmgw.domain.summary_pages import DEFAULT_ROWS, StatusQuery, document
from llmgw.simfleet.nodes import node_names
from tests.support import status_world
from tests.support.status_world import NOW, Clock

ADMIN = "sk-status-pages-admin-0123456789"
T = TypeVar("T")


def world(nodes: int, models: int = 50) -> tuple[Context, Clock]:
    return status_world.world(nodes, models, ADMIN)


async def asking(ctx: Context, check: Callable[[httpx.AsyncClient], Any]) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(ctx)), base_url="http://cp.test",
                                 headers={"Authorization": f"Bearer {ADMIN}"}) as api:
        await check(api)


async def test_the_default_document_at_1000_nodes_is_the_aggregates_and_a_page_under_1_mb() -> None:
    ctx, _ = world(1000)

    async def check(api: httpx.AsyncClient) -> None:
        r = await api.get("/api/v1/status")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert len(r.content) < 200_000, len(r.content)  # 3.3 MB with every row; the goal is 1 MB
        doc = r.json()
        full = (await api.get("/api/v1/status?full=1")).json()
        assert len(json.dumps(full)) > 3_000_000
        # The same keys in the same order, the pages said last; every aggregate as in the full document.
        assert list(doc) == [*full, "pages"]
        for key in ("node_counts", "capacity", "fabrics", "weights", "totals", "warnings", "notify", "guard",
                    "conditions"):
            assert doc[key] == full[key], key
        assert doc["node_counts"] == {"known": 1000, "connected": 1000, "not_connected": 0}
        assert doc["capacity"][0]["total"] == 8000 and doc["totals"]["models"] == 50
        assert doc["nodes"] == full["nodes"][:DEFAULT_ROWS["nodes"]]
        assert doc["models"] == full["models"] and doc["idle"] == full["idle"][:DEFAULT_ROWS["idle"]]
        assert doc["pages"] == {"nodes": {"offset": 0, "limit": DEFAULT_ROWS["nodes"], "total": 1000},
                                "models": {"offset": 0, "limit": DEFAULT_ROWS["models"], "total": 50, "short": False},
                                "idle": {"offset": 0, "limit": DEFAULT_ROWS["idle"], "total": 50},
                                "certificates": {"offset": 0, "limit": DEFAULT_ROWS["certificates"], "total": 0}}

    await asking(ctx, check)


async def test_full_is_the_document_of_before_byte_for_byte() -> None:
    ctx, _ = world(30, 12)

    async def check(api: httpx.AsyncClient) -> None:
        body = (await api.get("/api/v1/status?full=true")).content
        # What the route answered before pages: the look's whole summary, as the admin API writes JSON.
        assert body == json.dumps(ctx.look(await ctx.cluster(None)).summary.to_doc()).encode()
        assert "pages" not in json.loads(body) and len(json.loads(body)["nodes"]) == 30

    await asking(ctx, check)


async def test_pages_add_up_to_the_full_lists_and_the_agents_follow_the_nodes() -> None:
    ctx, _ = world(45, 30)

    async def check(api: httpx.AsyncClient) -> None:
        full = (await api.get("/api/v1/status?full=1")).json()
        nodes = []
        for offset in range(0, 50, 20):
            doc = (await api.get(f"/api/v1/status?nodes=20&nodes_offset={offset}&models=7&models_offset=21")).json()
            assert doc["pages"]["nodes"] == {"offset": offset, "limit": 20, "total": 45}
            nodes += doc["nodes"]
            assert doc["models"] == full["models"][21:28]
        assert nodes == full["nodes"]
        none = (await api.get("/api/v1/status?nodes=0&models=0&idle=0")).json()
        assert none["nodes"] == none["models"] == none["idle"] == [] and none["totals"] == full["totals"]
        # Short: the models not satisfied (here every one: the reconciler has not judged them).
        short = (await api.get("/api/v1/status?short=1&models=5")).json()
        assert short["models"] == [m for m in full["models"] if m["satisfied"] is not True][:5]
        assert short["pages"]["models"] == {"offset": 0, "limit": 5, "total": 30, "short": True}

    await asking(ctx, check)


async def test_the_agents_listed_are_those_of_the_nodes_listed() -> None:
    ctx, _ = world(12, 0)
    agents = [{"node": n, "connected": True, "last_contact": NOW, "last_contact_age_s": 0.0}
              for n in node_names(12)]
    table = {"leader": "local", "self": "local", "members": [], "agents": agents, "gateways": []}
    page = await ctx.status_cache.body(ctx.look_inputs(table), StatusQuery.parse({"nodes": "3", "nodes_offset": "4"}),
                                 ctx.timeouts.status_cache_s)
    doc = json.loads(page)
    assert [a["node"] for a in doc["cluster"]["agents"]] == [n["node"] for n in doc["nodes"]] == node_names(12)[4:7]
    full = json.loads(await ctx.status_cache.body(ctx.look_inputs(table), StatusQuery(full=True), 1.0))
    assert full["cluster"]["agents"] == agents


def test_the_machines_certificates_are_a_page_too() -> None:
    ctx, _ = world(3, 1)
    one = dataclasses.replace(ctx.look(ctx.local_cluster()).summary, certificates=tuple(
        CertRow("agent", f"sim-{i:04d}", NOW + 86400 * 30 + i, 86400 * 30.0 + i) for i in range(1000)))
    doc = document(one, StatusQuery())
    assert doc["certificates"] == one.to_doc()["certificates"][:DEFAULT_ROWS["certificates"]]
    assert doc["pages"]["certificates"] == {"offset": 0, "limit": DEFAULT_ROWS["certificates"], "total": 1000}
    assert document(one, StatusQuery.parse({"certificates": "5", "certificates_offset": "995"}))["certificates"] == \
        one.to_doc()["certificates"][995:]


@pytest.mark.parametrize("query, words", [
    ("nodes=-1", "nodes must be a whole number from 0"),
    ("models=ten", "models must be a whole number"),
    ("node=5", "unknown query parameter 'node'"),
    ("full=maybe", "full is 1 or 0"),
    ("full=1&nodes=5", "leave out the other parameters"),
])
async def test_a_query_it_cannot_read_is_refused_not_ignored(query: str, words: str) -> None:
    ctx, _ = world(2, 1)

    async def check(api: httpx.AsyncClient) -> None:
        r = await api.get(f"/api/v1/status?{query}")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_query"
        assert words in r.json()["error"]["message"], r.json()

    await asking(ctx, check)


def idle_s(doc: dict[str, Any]) -> float:
    [row] = [r for r in doc["idle"] if r["model"] == "model-003"]
    return float(row["idle_s"])


async def test_a_second_request_at_the_same_revision_builds_nothing() -> None:
    ctx, clock = world(200, 20)
    cache = ctx.status_cache

    async def check(api: httpx.AsyncClient) -> None:
        first = (await api.get("/api/v1/status")).content
        assert (cache.builds, cache.writes) == (1, 1)
        assert (await api.get("/api/v1/status")).content == first
        assert (cache.builds, cache.writes) == (1, 1)  # the same look, the same bytes
        await api.get("/api/v1/status?full=1")
        await api.get("/api/v1/status?full=1")
        assert (cache.builds, cache.writes) == (1, 2)  # another page of the same look: serialized once
        clock.now += ctx.timeouts.status_cache_s / 2
        await api.get("/api/v1/status")
        assert cache.builds == 1
        # A write: a new revision, a new look.
        ctx.store.submit_nowait(commands.put_setting("notify.webhooks", ["http://127.0.0.1:9/hook"], NOW))
        doc = (await api.get("/api/v1/status")).json()
        assert cache.builds == 2 and doc["notify"]["webhooks"] == 1
        # What the agents report: a node gone.
        ctx.hub.disconnect(ctx.hub.links["sim-0007"])
        doc = (await api.get("/api/v1/status")).json()
        assert cache.builds == 3 and doc["node_counts"]["not_connected"] == 1
        await api.get("/api/v1/status")
        assert cache.builds == 3
        # The clock alone: the aged look answers at once (no request waits for a build only because time passed)
        # while the next one is built beside; the answer after it has its figures (the lost node's age) moved on.
        ctx.hub.note_demand("model-003")  # asked now: its idle time is a figure read off the clock
        aged = (await api.get("/api/v1/status?full=1")).json()
        assert cache.builds == 4 and idle_s(aged) == 0
        clock.now += ctx.timeouts.status_cache_s
        refreshed = cache.refreshed
        assert (await api.get("/api/v1/status?full=1")).json() == aged and cache.builds == 4
        await refreshed.wait()
        assert cache.builds == 5
        assert idle_s((await api.get("/api/v1/status?full=1")).json()) == ctx.timeouts.status_cache_s
        # Aged past STALE times status_cache_s (nobody asked for a while): built before the answer.
        clock.now += STALE * ctx.timeouts.status_cache_s
        assert idle_s((await api.get("/api/v1/status?full=1")).json()) == (STALE + 1) * ctx.timeouts.status_cache_s
        assert cache.builds == 6

    await asking(ctx, check)


async def turns_during(work: Callable[[], Awaitable[T]]) -> tuple[int, T]:
    """What `work` returns, and how many turns another task of the loop took while it ran (0: it held the loop)."""
    turns = 0

    async def count() -> None:
        nonlocal turns
        while True:
            await trio.lowlevel.checkpoint()
            turns += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(count)
        while not turns:  # the counter runs
            await trio.lowlevel.checkpoint()
        turns = 0
        done = await work()
        seen = turns
        nursery.cancel_scope.cancel()
    return seen, done


async def test_a_large_fleets_look_is_built_beside_the_loop_and_a_small_ones_on_it() -> None:
    """The notifier's check and the console's overview (`Context.look_beside`): at LOOK_BESIDE_NODES nodes or more
    the look is built in a worker thread, so the loop goes on serving (a task here counts its turns meanwhile);
    below, on the loop (no turn). Either way the same look as `Context.look`."""
    for nodes, beside in ((LOOK_BESIDE_NODES * 2, True), (LOOK_BESIDE_NODES // 2, False)):
        ctx, _ = world(nodes, 20)
        seen, look = await turns_during(lambda: ctx.look_beside(ctx.local_cluster()))
        assert (seen > 0) == beside, (nodes, seen)
        assert look.summary == ctx.look(ctx.local_cluster()).summary


async def test_a_large_fleets_page_is_written_beside_the_loop() -> None:
    """A page not yet written of a kept look (`?full=1` at 1,000 nodes: 3.6 MB of JSON) is serialized in a worker
    thread once the fleet has LOOK_BESIDE_NODES nodes or more: the loop turns meanwhile; below, on the loop."""
    for nodes, beside in ((LOOK_BESIDE_NODES * 2, True), (LOOK_BESIDE_NODES // 2, False)):
        ctx, _ = world(nodes, 20)
        table = ctx.local_cluster()
        await ctx.status_cache.body(ctx.look_inputs(table), StatusQuery(), 1.0)  # the look, and its default page
        builds = ctx.status_cache.builds
        seen, full = await turns_during(lambda: ctx.status_cache.body(ctx.look_inputs(table), StatusQuery(full=True),
                                                                      1.0))
        assert ctx.status_cache.builds == builds  # the same look: only its page was written
        assert (seen > 0) == beside, (nodes, seen)
        assert json.loads(full) == ctx.look(table).summary.to_doc()
