"""The console's Overview, fact by fact: usage bars per GPU class (MIG classes too), free whole nodes per fabric,
parked and unplaceable models with their reasons (and links that lead to them), idle models longest first,
the control planes (leader, standbys, floating address), judges and guards on or off, and the no-webhook
warning only when no webhook is set. A constructed state through the admin app, as a browser asks it."""

from __future__ import annotations

import re
from dataclasses import replace

from console_world import ADMIN, NOW, World, rows, sign_in, text_of
from llmgw.console import overview
from llmgw.domain import commands, summary
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.summary import ModelRow
from llmgw.reconcile import ModelView
from llmgw.testing.builders import model, node, placed, store_with


def overview_world(*, webhooks: bool = False, guards: bool = True, n3_reserves: tuple[int, ...] = ()) -> World:
    settings = {"notify.webhooks": ["https://hooks.example/x"]} if webhooks else {}
    if not guards:
        settings["guard.enabled"] = False
    store = store_with([model("chat").sim(), model("old").sim().on_demand(idle_timeout_s=1800),
                        model("recent").sim().on_demand(), model("unseen").sim(), model("broken").sim(),
                        model("huge").vllm().gpus(8).classes("b200-192g")],
                       [placed("chat", "n1", [0]), placed("old", "n1"), placed("recent", "n3"),
                        placed("unseen", "n3")], settings)
    for _ in range(5):
        store.submit_nowait(commands.start_failed("broken", "broken-r1", "ImportError: no module named torch", 1.0))
    store.submit_nowait(commands.set_policy(GuardPolicy("strict", "guard-1"), 0.0))
    views = {"chat": ModelView("chat", 1, 1, 1, 0, "ready", ""),
             "old": ModelView("old", 1, 1, 1, 0, "ready", ""), "recent": ModelView("recent", 1, 1, 1, 0, "ready", ""),
             "unseen": ModelView("unseen", 1, 1, 1, 0, "ready", ""),
             "broken": ModelView("broken", 1, 0, 0, 0, "parked", "parked after 5 failed starts"),
             "huge": ModelView("huge", 1, 0, 0, 0, "unplaceable", "no node has 8 b200-192g GPUs")}
    nodes = [node("n1").gpus(2, "h100-80g").fabric("ib-a").engines("sim", "vllm").build(),
             replace(node("n3").gpus(2, "h100-80g").fabric("ib-a").engines("sim").build(), reserved_gpus=n3_reserves),
             node("n2").mig(0, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40)).fabric("ib-b").engines("sim").build()]
    world = World(store, nodes, views)
    world.now = NOW - 900
    world.hub.note_demand("old")
    world.now = NOW - 10
    world.hub.note_demand("recent")
    world.now = NOW
    return world


async def test_capacity_has_a_usage_bar_per_class_and_fabrics_count_whole_free_nodes() -> None:
    world = overview_world()
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/")).text
    capacity = {r[0]: r for r in rows(html, "capacity-table")}
    assert capacity["h100-80g"][1:6] == ["whole card", "1", "3", "0", "0"]  # ... unusable, reserved
    assert capacity["a100-80g-mig-3g.40gb"][1:4] == ["MIG instance", "0", "2"]
    assert "1 of 4 usable used" in capacity["h100-80g"][6] and "0 of 2 usable used" in capacity[
        "a100-80g-mig-3g.40gb"][6]
    assert 'role="meter" aria-valuenow="25"' in html  # the bar itself: 1 of 4 H100s
    fabrics = {r[0]: r for r in rows(html, "fabrics-table")}
    assert fabrics["ib-a"][1:] == ["2", "1", "1", "3"]  # n1 holds chat on one card: only n3 is whole and free
    assert fabrics["ib-b"][1] == "1"


async def test_capacity_counts_devices_kept_for_other_work_apart() -> None:
    world = overview_world(n3_reserves=(1,))
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/")).text
    capacity = {r[0]: r for r in rows(html, "capacity-table")}
    assert capacity["h100-80g"][1:6] == ["whole card", "1", "2", "0", "1"]  # used, free, unusable, reserved
    assert "1 of 3 usable used" in capacity["h100-80g"][6]


async def test_parked_and_unplaceable_models_show_with_their_reasons_and_link_to_them() -> None:
    world = overview_world()
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/")).text
        stuck = {r[0]: r for r in rows(html, "stuck-models")}
        assert stuck["broken"][1:] == ["parked", "parked after 5 failed starts", "ImportError: no module named torch"]
        assert stuck["huge"][1:3] == ["unplaceable", "no node has 8 b200-192g GPUs"]
        assert set(stuck) == {"broken", "huge"}
        by_state = rows(html, "models-by-state")[0]
        assert by_state[0] == "6" and by_state[4:6] == ["1", "1"]  # parked, unplaceable
        link = re.search(r'<a href="([^"]+)">huge</a>', html)
        assert link is not None
        shown = (await c.get(link.group(1).replace("&amp;", "&"))).text
    listed = re.findall(r'data-testid="model-link">([^<]+)<', shown)
    assert listed in ([], ["huge"]) and "no node has 8 b200-192g GPUs" in shown  # the link leads to the model


def test_the_more_link_of_a_long_stuck_list_leads_to_a_listing_of_them() -> None:
    stuck = tuple(ModelRow(f"m{i:02}", "sim", "chat", "always", 1, 0, 0, 0, 0, "unplaceable", "no node fits", False,
                           True, False, 0, "", 0, False) for i in range(25))
    html = overview._models(replace(summary.summarize(ClusterState(), Observed(), None, {}), models=stuck))
    assert "… and 5 more" in html
    from llmgw.console.models import STATES
    hrefs = re.findall(r'href="/models\?state=([a-z]+)"', html)
    assert hrefs and all(state in STATES for state in hrefs), hrefs  # a filter the Models page knows


async def test_idle_models_longest_first_with_unknown_last() -> None:
    world = overview_world()
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/")).text
    idle = rows(html, "idle-table")
    assert [r[0] for r in idle] == ["old", "recent", "chat", "unseen"]
    assert idle[0][4] == "15 min" and idle[0][5] == "30 min" and idle[1][4] == "10 s"
    assert idle[3][4] == "unknown" and idle[3][5] == "—"  # never asked for: unknown, not idle for 0 s


def test_members_show_the_leader_the_standbys_and_the_floating_address() -> None:
    world = overview_world()
    members = [{"id": f"cp{i}:7000", "role": "leader" if i == 1 else "standby", "state": "healthy", "reason": "",
                "admin_url": f"http://cp{i}:8081", "version": "1.0", "lag": 0} for i in (1, 2, 3)]
    members[2] |= {"state": "missing", "reason": "it did not answer"}
    cluster = {"leader": "cp1:7000", "members": members,
               "floating_address": {"configured": True, "address": "10.0.0.9/24", "on_leader": False,
                                    "state": "not on the leader", "reason": "the leader has not claimed it yet"}}
    html = overview.render(summary.summarize(world.store.snapshot(), world.hub.observed(), None, cluster, NOW),
                           world.deps)
    assert 'data-testid="leader">cp1:7000</strong>' in html
    assert 'data-testid="standbys">cp2:7000, cp3:7000</span>' in html
    assert text_of(html, "floating-address") == ("floating address: 10.0.0.9/24 — not on the leader: the leader has "
                                                  "not claimed it yet")
    table = {r[0]: r for r in rows(html, "members-table")}
    assert table["cp3:7000"][2:4] == ["missing", "it did not answer"] and table["cp1:7000"][1] == "leader"
    alone = overview.render(summary.summarize(world.store.snapshot(), world.hub.observed(), None, {}, NOW),
                            world.deps)
    assert re.search(r'data-testid="leader"><span class="unknown">unknown', alone)  # unknown, not "none"
    assert "not configured" in text_of(alone, "floating-address")


async def test_judges_and_guards_on_or_off_and_the_webhook_warning_only_without_one() -> None:
    async with overview_world().client() as c:
        await sign_in(c)
        on = (await c.get("/")).text
    async with overview_world(webhooks=True, guards=False).client() as c:
        await sign_in(c)
        off = (await c.get("/")).text
    judges = {r[0]: r for r in rows(on, "judges-table")}
    assert judges["guard-1"][1] == "missing" and "no model named guard-1" in judges["guard-1"][2]
    assert text_of(on, "guards-state").startswith("on") and text_of(off, "guards-state").startswith("off")
    assert 'data-testid="no-webhook"' in on and 'data-testid="no-webhook"' not in off
    async with overview_world().client(ADMIN) as api:  # the same facts as the summary ctl status reads
        status = (await api.get("/api/v1/status")).json()
    assert status["guard"]["judges"][0]["status"] == "missing"


def test_the_gateways_that_follow_the_leader_are_listed_llmgw_ups_own_among_them() -> None:
    world = overview_world()
    cluster = {"leader": "cp1:7000", "members": [], "gateways": [
        {"name": "gw-1", "address": "10.0.0.9", "connected": False, "in_process": False},
        {"name": "local (in-process)", "address": "http://127.0.0.1:8080", "connected": True, "in_process": True}]}
    html = overview.render(summary.summarize(world.store.snapshot(), world.hub.observed(), None, cluster, NOW),
                           world.deps)
    table = {r[0]: r for r in rows(html, "gateways-table")}
    assert table["local (in-process)"][1:] == ["http://127.0.0.1:8080", "yes", "in the control plane's process"]
    assert table["gw-1"][2:] == ["no", "on its own"]
    none = overview.render(summary.summarize(world.store.snapshot(), world.hub.observed(), None,
                                             {**cluster, "gateways": []}, NOW), world.deps)
    assert "no gateway follows the leader" in none
