"""The console's Do menu: each action shows what it will do, asks to confirm, then goes through the admin API's
own code so its effect shows in the store and the admin API (what `ctl` reads); a confirmation sent twice
applies once; a viewer, a missing CSRF token and a confirmation without its form id are refused in words."""

from __future__ import annotations

from typing import Any

import httpx

from console_world import ADMIN, VIEWER, World, csrf_of, hidden, rows, sign_in, text_of
from llmgw.domain import commands
from llmgw.domain.guard import GuardPolicy
from llmgw.testing.builders import model, node, store_with

SERVE = {"name": "big", "engine": "vllm", "source": "hf://org/big", "gpus": "4", "classes": "h100-80g",
         "memory_gib": "40"}


async def confirm(c: httpx.AsyncClient, path: str, fields: dict[str, str], form: str = "confirm-form") -> tuple[
        str, httpx.Response]:
    """The first POST (the confirmation page), then the confirmation as a browser sends it back."""
    menu = await c.get("/do")
    first = await c.post(path, data={**fields, "csrf": csrf_of(menu.text)})
    assert first.status_code == 200, first.text
    return first.text, await c.post(path, data=hidden(first.text, form))


async def test_serve_shows_the_plan_first_then_commits_once_and_shows_in_the_api() -> None:
    world = World(nodes=[node("gpu-1").gpus(8, "h100-80g").engines("vllm").build(),
                         node("gpu-2").gpus(2, "a100-80g").engines("vllm").build()])
    async with world.client() as c:
        await sign_in(c)
        before = world.store.snapshot().revision
        plan = (await c.post("/do/serve", data={**SERVE, "csrf": csrf_of((await c.get("/do")).text)})).text
        assert world.store.snapshot().revision == before  # the plan changed nothing
        done = await c.post("/do/serve", data=hidden(plan, "confirm-form"))
        assert 'data-testid="plan-verdict" data-fits="true"' in plan
        assert "Fits now: node gpu-1, devices 0, 1, 2, 3" in text_of(plan, "plan-verdict")
        assert [r[1] for r in rows(plan, "plan-refusals")] == ["class"]  # gpu-2's a100s, as ctl plan says
        assert "Memory for one replica: 40.0 GiB" in text_of(plan, "plan-memory")
        assert 'data-outcome="done"' in done.text and "model big defined" in text_of(done.text, "action-result")
        big = world.store.snapshot().models["big"]
        assert (big.engine, big.profile.gpus, big.profile.tp, big.profile.classes) == ("vllm", 4, 4, ("h100-80g",))
        after = world.store.snapshot().revision
        again = await c.post("/do/serve", data=hidden(plan, "confirm-form"))  # the same confirmation, resent
        assert 'data-outcome="done"' in again.text and world.store.snapshot().revision == after
        replan = (await c.post("/do/serve", data={**SERVE, "csrf": csrf_of((await c.get("/do")).text)})).text
        assert "already defined with this same definition: serving it changes nothing" in text_of(replan,
                                                                                                 "plan-existing")
    async with world.client(ADMIN) as api:
        shown = (await api.get("/api/v1/models/big")).json()["model"]
    assert shown["source"] == "hf://org/big" and shown["estimate"]["bytes"] == 40 * 2**30


async def test_serve_says_where_it_fits_nowhere_and_refuses_a_bad_form_in_words() -> None:
    world = World(nodes=[node("gpu-2").gpus(2, "a100-80g").engines("vllm").build()])
    async with world.client() as c:
        await sign_in(c)
        csrf = csrf_of((await c.get("/do")).text)
        plan = (await c.post("/do/serve", data={**SERVE, "csrf": csrf})).text
        assert 'data-fits="false"' in plan and "Fits nowhere now" in plan
        bad = (await c.post("/do/serve", data={"name": "x", "engine": "vllm", "gpus": "two", "csrf": csrf})).text
        assert 'data-outcome="refused"' in bad
        assert "source is required; gpus must be a whole number, not 'two'" in text_of(bad, "action-result")
        assert 'value="x"' in bad  # the form comes back filled in
        invalid = (await c.post("/do/serve", data={"name": "x", "engine": "nope", "source": "s", "csrf": csrf})).text
        assert "the definition is not valid: engine" in text_of(invalid, "action-result")
        as_json = (await c.post("/do/serve", data={"definition": '{"name": "j", "engine": "sim", "source": '
                                                                  '"sim://j"}', "csrf": csrf})).text
        assert 'data-testid="confirm-form"' in as_json
    assert set(world.store.snapshot().models) == set()


async def test_retry_clears_a_parked_model() -> None:
    store = store_with([model("broken").sim()])
    for _ in range(5):
        store.submit_nowait(commands.start_failed("broken", "broken-r1", "ImportError: torch", 1.0))
    world = World(store=store)
    async with world.client() as c:
        await sign_in(c)
        menu = (await c.get("/do")).text
        assert rows(menu, "parked-table")[0][:3] == ["broken", "5", "ImportError: torch"]
        page, done = await confirm(c, "/do/retry", {"name": "broken"})
        assert "broken is parked after 5 failed start(s): ImportError: torch" in page
    assert 'data-outcome="done"' in done.text
    assert not world.store.snapshot().model_health("broken").parked
    async with world.client(ADMIN) as api:
        assert (await api.get("/api/v1/models/broken")).json()["model"]["status"]["parked"] is False


async def test_retry_of_an_unknown_model_is_refused_with_the_apis_words() -> None:
    world = World()
    async with world.client() as c:
        await sign_in(c)
        _, done = await confirm(c, "/do/retry", {"name": "ghost"})
    assert 'data-outcome="refused"' in done.text and "model_not_found" in text_of(done.text, "action-result")


async def test_enable_the_judge_serves_the_missing_one_as_the_api_does() -> None:
    store = store_with([model("chat").sim()])
    store.submit_nowait(commands.set_policy(GuardPolicy("strict", "guard-1"), 0.0))
    store.submit_nowait(commands.put_setting("models.weights_dirs", ["/models"], 0.0))  # where a judge may lie
    world = World(store=store)
    async with world.client() as c:
        await sign_in(c)
        assert "no model named guard-1" in text_of((await c.get("/do")).text, "judge-state")
        _, refused = await confirm(c, "/do/judge", {})  # no source given, none in the nodes' storage
        assert "judge_source_required" in text_of(refused.text, "action-result")
        page, done = await confirm(c, "/do/judge", {"source": "/models/Llama-Guard-3-1B.Q4_K_M.gguf"})
        assert "Serve guard-1 as a judge: Llama Guard on CPU" in page
    assert "judge guard-1 served from /models/Llama-Guard-3-1B.Q4_K_M.gguf" in text_of(done.text, "action-result")
    judge = world.store.snapshot().models["guard-1"]
    assert (judge.role, judge.engine) == ("guard", "llama.cpp")
    async with world.client(ADMIN) as api:
        judges = (await api.get("/api/v1/guard/judges")).json()["judges"]
    assert judges[0]["model"] == "guard-1" and judges[0]["defined"] is True and judges[0]["judge"] is True


async def test_stop_and_start_the_system_and_guards_off_and_on() -> None:
    world = World()
    async with world.client() as c:
        await sign_in(c)
        page, done = await confirm(c, "/do/system", {"to": "stop"})
        assert "Stop the system: every replica is stopped" in page
        assert "the system is stopped" in text_of(done.text, "action-result")
        assert 'data-testid="stopped-banner"' in (await c.get("/do")).text
        async with world.client(ADMIN) as api:
            assert (await api.get("/api/v1/settings/serving.stopped")).json()["value"] is True
        _, started = await confirm(c, "/do/system", {"to": "start"})
        assert "the system is started" in text_of(started.text, "action-result")
        assert world.store.snapshot().settings["serving.stopped"] is False
        _, off = await confirm(c, "/do/guards", {"to": "off"})
        assert "guards are off" in text_of(off.text, "action-result")
        async with world.client(ADMIN) as api:
            assert (await api.get("/api/v1/guard/policies")).json()["enabled"] is False
        assert "Guards are off" in text_of((await c.get("/do")).text, "guards-state")
        _, on = await confirm(c, "/do/guards", {"to": "on"})
        assert 'data-outcome="done"' in on.text and world.store.snapshot().settings["guard.enabled"] is True
        csrf = csrf_of((await c.get("/do")).text)
        odd = await c.post("/do/system", data={"to": "pause", "csrf": csrf})
        assert "to must be stop or start" in text_of(odd.text, "action-result")


async def test_a_viewer_is_refused_every_action_and_nothing_changes() -> None:
    world = World()
    async with world.client() as c:
        await sign_in(c, VIEWER)
        menu = (await c.get("/do")).text
        assert 'data-testid="viewer-notice"' in menu
        before = world.store.snapshot()
        for path, fields in (("/do/system", {"to": "stop"}), ("/do/guards", {"to": "off"}),
                             ("/do/serve", SERVE), ("/do/retry", {"name": "x"}), ("/do/judge", {})):
            r = await c.post(path, data={**fields, "confirm": "yes", "token": "t" * 24, "csrf": csrf_of(menu)})
            assert r.status_code == 403 and "a viewer cannot act" in r.text, path
    assert world.store.snapshot() == before


async def test_csrf_missing_or_wrong_and_a_confirmation_without_its_form_id_are_refused() -> None:
    world = World()
    async with world.client() as c:
        await sign_in(c)
        before = world.store.snapshot()
        missing = await c.post("/do/system", data={"to": "stop", "confirm": "yes", "token": "t" * 24})
        wrong = await c.post("/do/system", data={"to": "stop", "confirm": "yes", "token": "t" * 24, "csrf": "x"})
        for r in (missing, wrong):
            assert r.status_code == 403 and "CSRF token" in text_of(r.text, "refusal-reason")
        assert world.store.snapshot() == before
        csrf = csrf_of((await c.get("/do")).text)
        forged: Any = await c.post("/do/system", data={"to": "stop", "confirm": "yes", "csrf": csrf})
        assert "no valid form id" in text_of(forged.text, "action-result")
    assert world.store.snapshot() == before


async def test_the_menu_shows_how_to_add_a_node_or_a_control_plane() -> None:
    world = World()
    async with world.client() as c:
        await sign_in(c)
        menu = (await c.get("/do")).text
    assert "llmgw server add root@NEW_HOST --role agent --url http://cp.test" in text_of(menu, "add-node-command")
    assert "--role gateway" in text_of(menu, "add-gateway-command")
    control = text_of(menu, "add-control-command")
    assert "--role control" in control and "--cluster-secret-file" in control and "--floating-address" in control
    assert "llmgw ctl members add NEW_HOST:RAFT_PORT" in text_of(menu, "add-member-command")
    assert "LLMGW_KEY" not in text_of(menu, "do-add"), "a machine never gets the admin key"


async def test_the_retry_list_is_bounded_at_fleet_scale_and_points_to_the_rest() -> None:
    from llmgw.console import do

    store = store_with([model(f"m{i:03}").sim() for i in range(do.PARKED_SHOWN + 10)])
    for i in range(do.PARKED_SHOWN + 10):
        for _ in range(5):
            store.submit_nowait(commands.start_failed(f"m{i:03}", f"m{i:03}-r1", "ImportError: torch", 1.0))
    world = World(store=store)
    async with world.client() as c:
        await sign_in(c)
        menu = (await c.get("/do")).text
        rest = (await c.get(f"/models/m{do.PARKED_SHOWN + 9:03}")).text  # not on Do: its own page retries
    assert len(rows(menu, "parked-table")) == do.PARKED_SHOWN
    assert "… and 10 more parked" in text_of(menu, "more-parked") and 'href="/models?state=parked"' in menu
    assert 'data-testid="retry-form"' in rest


async def test_approve_lists_the_pending_nodes_and_approves_one_as_the_api_does() -> None:
    store = store_with(settings={"nodes.require_approval": True})
    store.submit_nowait(commands.approve_nodes(["old"], 0.0))
    world = World(store=store, nodes=[node("old").engines("sim").build(), node("new").engines("sim").build()])
    async with world.client() as c:
        await sign_in(c)
        menu = (await c.get("/do")).text
        assert [r[0] for r in rows(menu, "pending-table")] == ["new"]
        page, done = await confirm(c, "/do/approve", {"name": "new"})
        assert "node new is connected and waiting for approval" in page
    assert 'data-outcome="done"' in done.text and "node new approved" in text_of(done.text, "action-result")
    assert "new" in world.store.snapshot().approved_nodes
    async with world.client(ADMIN) as api:
        shown = {n["node"]: n["approval"] for n in (await api.get("/api/v1/nodes")).json()["nodes"]}
    assert shown == {"old": "approved", "new": "approved"}


async def test_cordon_drain_and_uncordon_from_do_as_the_api_does() -> None:
    store = store_with([model("m1").sim()])
    world = World(store=store, nodes=[node("a").engines("sim").build(), node("b").engines("sim").build()])
    async with world.client() as c:
        await sign_in(c)
        menu = (await c.get("/do")).text
        assert [r[0] for r in rows(menu, "cordon-table")] == ["a", "b"]
        assert 'data-testid="drain-a"' in menu and 'data-testid="uncordon-a"' not in menu
        page, done = await confirm(c, "/do/cordon", {"name": "a", "verb": "drain"})
        assert "replicas move to other nodes one at a time" in page
        assert 'data-outcome="done"' in done.text and "node a: drained: no replica left" in text_of(done.text, "action-result")
        assert dict(world.store.snapshot().cordoned_nodes) == {"a": "drain"}
        menu = (await c.get("/do")).text
        assert 'data-testid="uncordon-a"' in menu and 'data-testid="drain-a"' not in menu
        nodes_page = (await c.get("/nodes")).text
        assert 'data-testid="node-draining"' in nodes_page
        _, done = await confirm(c, "/do/cordon", {"name": "a", "verb": "uncordon"})
        assert "node a: uncordoned" in text_of(done.text, "action-result")
    assert dict(world.store.snapshot().cordoned_nodes) == {}
    async with world.client(ADMIN) as api:
        r = await api.post("/api/v1/nodes/b/cordon")
        assert r.status_code == 200 and r.json()["changed"] is True
        shown = {n["node"]: n["cordon"] for n in (await api.get("/api/v1/nodes")).json()["nodes"]}
    assert shown == {"a": "none", "b": "cordon"}
