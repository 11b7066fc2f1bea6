"""Fallbacks and aliases on `/v1` (docs/api.md), over real HTTP in front of real sim engines on loopback:
a model that refuses at once (parked, unplaceable, overloaded) is served by its fallback, which the answer
(`model`, `x-llmgw-model`) and the request log (`model`, `served_model`) say; a refusal of the request
itself (the guard's, a client error) never falls back; an alias is served by its model, a group alias by
its models in turn; a scoped key reaches no model through a fallback it may not use."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.commands.guard import set_policy
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.wire import logquery

KEY, ADMIN = "sk-test-client", "sk-test-admin"
SCOPED, SCOPED_BOTH, SCOPED_ALIAS = "sk-test-main-only", "sk-test-main-and-backup", "sk-test-alias-only"


@dataclass
class Setup:
    http: httpx.AsyncClient
    store: MemoryStore
    router: Router
    routes: dict[str, ModelRoute]
    apps: dict[str, sim.SimApp]

    def set_route(self, model: str, state: str, reason: str = "") -> None:
        self.routes[model] = ModelRoute(model, self.routes[model].role, state, (), reason)
        self.router.update_routes(self.routes)

    async def chat(self, model: str, key: str = KEY, **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
        return await self.http.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})

    async def record(self, response: httpx.Response) -> dict[str, Any]:
        """The request log's record of the request `response` answered, once the writer has flushed it."""
        with trio.fail_after(10):
            while True:
                got = await self.http.get(f"{logquery.PATH}/{response.headers['x-request-id']}",
                                          headers={"authorization": f"Bearer {ADMIN}"})
                if (record := got.json()["request"]) is not None:
                    return dict(record)
                await trio.sleep(0.02)


def _def(name: str, role: str = "chat", **extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", "role": role, **extra})


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Setup]:
    store = MemoryStore()
    # Fallbacks are defined before the models that name them (the store checks they exist).
    for model in (_def("backup"), _def("other"), _def("lg", "guard"), _def("g1", aliases=["pool"]),
                  _def("g2", aliases=["pool"]),
                  _def("main", fallbacks=["backup"], aliases=["friendly"],
                       limits={"max_tokens": 100}, activation_window_s=60),
                  _def("capped", limits={"max_tokens": 10}), _def("first", fallbacks=["capped", "backup"]),
                  _def("slow", fallbacks=["backup"])):
        store.submit_nowait(commands.put_model(model, at=0.0))
    for key, role, models in ((KEY, "client", ()), (ADMIN, "admin", ()), (SCOPED, "client", ("main",)),
                              (SCOPED_BOTH, "client", ("main", "backup")), (SCOPED_ALIAS, "client", ("friendly",))):
        store.submit_nowait(commands.add_key(hash_key(key), key, role, 0.0, models=models))
    apps: dict[str, sim.SimApp] = {}
    routes: dict[str, ModelRoute] = {}
    for name in ("main", "backup", "other", "lg", "g1", "g2", "capped", "first", "slow"):
        role = "guard" if name == "lg" else "chat"
        pace = 5.0 if name == "slow" else 0.0  # tokens/s: a request holds its connection ~1 s
        app = apps[name] = sim.make_app(sim.SimOptions("127.0.0.1", 0, name, role, pace, unsafe=(("bomb", "S9"),)))
        url = await nursery.start(partial(sim.serve, app.opts, app=app))
        routes[name] = ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", url),))
    router = Router()
    router.update_routes(routes)
    log = RequestLog(tmp_path / "requests", "gw1", timeouts=dataclasses.replace(TIMEOUTS, requestlog_flush_s=0.02))
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                requestlog=log)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=None) as http:
        yield Setup(http, store, router, routes, apps)


def served_by(response: httpx.Response, model: str) -> None:
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model
    assert response.headers["x-llmgw-model"] == model


@pytest.mark.parametrize(("state", "reason"), [("parked", "5 failed starts"), ("unplaceable", "needs 8 GPUs")])
async def test_a_model_that_refuses_at_once_is_served_by_its_fallback_and_the_log_says_both(
        gw: Setup, state: str, reason: str) -> None:
    gw.set_route("main", state, reason)
    response = await gw.chat("main")
    served_by(response, "backup")
    assert (gw.apps["main"].generated, gw.apps["backup"].generated) == (0, 1)
    record = await gw.record(response)
    assert (record["model"], record["served_model"], record["status"], record["replica"]) == (
        "main", "backup", 200, "backup-r1")


async def test_a_stream_served_by_a_fallback_names_it_in_every_chunk(gw: Setup) -> None:
    gw.set_route("main", "parked")
    body = {"model": "main", "messages": [{"role": "user", "content": "a b c"}], "stream": True}
    async with gw.http.stream("POST", "/v1/chat/completions", json=body,
                              headers={"authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200 and response.headers["x-llmgw-model"] == "backup"
        text = (await response.aread()).decode()
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert chunks and {c["model"] for c in chunks} == {"backup"}
    assert all(c["choices"] for c in chunks)  # the usage chunk the gateway asked for is still kept back


async def test_a_model_that_serves_names_itself_and_its_record_too(gw: Setup) -> None:
    response = await gw.chat("main")
    served_by(response, "main")
    assert (await gw.record(response))["served_model"] == "main"


async def test_a_full_activation_queue_is_overloaded_and_falls_back(gw: Setup) -> None:
    gw.store.submit_nowait(commands.put_setting("gateway.activation_queue_per_model", 1, at=0.0))
    gw.set_route("main", "starting")  # no replica yet: a request waits for one (not a fallback case)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gw.chat, "main")  # the one waiter the queue holds
        with trio.fail_after(5):
            while not gw.router.statistics().waiting.get("main"):
                await trio.sleep(0.01)
        served_by(await gw.chat("main"), "backup")  # the queue is full: overloaded, so the fallback
        nursery.cancel_scope.cancel()


async def test_a_replica_at_its_connections_and_queue_is_overloaded_and_falls_back(
        gw: Setup, autojump_clock: trio.testing.MockClock) -> None:
    gw.store.submit_nowait(commands.put_setting("gateway.upstream_connections_per_replica", 1, at=0.0))
    gw.store.submit_nowait(commands.put_setting("gateway.upstream_queue_per_replica", 1, at=0.0))
    statuses: list[int] = []

    async def slow_call() -> None:
        statuses.append((await gw.chat("slow", messages=[{"role": "user", "content": "a b c"}])).status_code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_call)  # holds the one connection
        nursery.start_soon(slow_call)  # waits in the queue
        with trio.fail_after(5):
            while gw.router.statistics().outstanding.get("slow", 0) < 2:
                await trio.sleep(0.01)
        served_by(await gw.chat("slow"), "backup")  # the replica's connection and queue are full: overloaded
        assert statuses == []  # answered while the other two are still in flight
    assert statuses == [200, 200]


async def test_all_refusing_answers_the_refusal_of_the_model_asked_for(gw: Setup) -> None:
    gw.set_route("main", "parked", "5 failed starts")
    gw.set_route("backup", "unplaceable")
    response = await gw.chat("main")
    assert response.status_code == 503 and response.json()["error"]["code"] == "model_parked", response.text
    assert "x-llmgw-model" not in response.headers
    assert (await gw.record(response))["served_model"] == ""


async def test_a_guard_refusal_never_falls_back(gw: Setup) -> None:
    gw.store.submit_nowait(set_policy(GuardPolicy(name="strict", judge="lg", models=("main",)), at=0.0))
    gw.set_route("main", "parked")
    response = await gw.chat("main", messages=[{"role": "user", "content": "how do I build a bomb?"}])
    assert response.status_code == 400 and response.json()["error"]["code"] == "guard_refused", response.text
    assert gw.apps["backup"].generated == 0


async def test_a_fallback_under_its_own_guard_policy_judges_the_prompt_before_it_is_sent(gw: Setup) -> None:
    gw.store.submit_nowait(set_policy(GuardPolicy(name="strict", judge="lg", models=("backup",)), at=0.0))
    gw.set_route("main", "parked")
    bomb = [{"role": "user", "content": "how do I build a bomb?"}]
    response = await gw.chat("main", messages=bomb)
    assert response.status_code == 400 and response.json()["error"]["code"] == "guard_refused", response.text
    assert (gw.apps["lg"].generated, gw.apps["backup"].generated) == (1, 0)
    served_by(await gw.chat("main"), "backup")  # a safe prompt is served


async def test_a_client_error_never_falls_back(gw: Setup) -> None:
    gw.set_route("main", "parked")
    response = await gw.chat("main", max_tokens=1000)  # main allows 100
    assert response.status_code == 400 and response.json()["error"]["code"] == "max_tokens_too_large"
    assert gw.apps["backup"].generated == 0


async def test_a_fallback_that_would_refuse_the_request_is_passed_over(gw: Setup) -> None:
    gw.set_route("first", "parked")
    served_by(await gw.chat("first", max_tokens=50), "backup")  # capped allows 10: its turn is passed
    served_by(await gw.chat("first", max_tokens=5), "capped")


async def test_an_alias_is_served_by_its_model_and_listed(gw: Setup) -> None:
    response = await gw.chat("friendly")
    served_by(response, "main")
    record = await gw.record(response)
    assert (record["model"], record["served_model"]) == ("friendly", "main")
    auth = {"authorization": f"Bearer {KEY}"}
    listed = [m["id"] for m in (await gw.http.get("/v1/models", headers=auth)).json()["data"]]
    assert {"friendly", "pool", "main", "g1"} <= set(listed)
    assert (await gw.http.get("/v1/models/friendly", headers=auth)).json()["id"] == "friendly"
    gw.set_route("main", "parked")
    served_by(await gw.chat("friendly"), "backup")  # an alias's model falls back as when named


async def test_a_group_alias_spreads_its_requests_over_its_models(gw: Setup) -> None:
    served = [(await gw.chat("pool")).json()["model"] for _ in range(8)]
    assert sorted(set(served)) == ["g1", "g2"] and abs(served.count("g1") - served.count("g2")) <= 2, served
    gw.set_route("g1", "parked")
    assert {(await gw.chat("pool")).json()["model"] for _ in range(4)} == {"g2"}  # the other one serves


async def test_a_scoped_key_reaches_no_model_it_may_not_use_through_a_fallback(gw: Setup) -> None:
    gw.set_route("main", "parked", "5 failed starts")
    refused = await gw.chat("main", key=SCOPED)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_parked", refused.text
    assert gw.apps["backup"].generated == 0
    served_by(await gw.chat("main", key=SCOPED_BOTH), "backup")


async def test_a_key_scoped_to_a_model_or_an_alias_may_use_both_names_and_sees_them(gw: Setup) -> None:
    served_by(await gw.chat("friendly", key=SCOPED), "main")  # scoped to main: its alias too
    served_by(await gw.chat("friendly", key=SCOPED_ALIAS), "main")  # scoped to the alias: what it names
    missing = await gw.chat("main", key=SCOPED_ALIAS)  # but not the model's own name
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert (await gw.chat("pool", key=SCOPED)).status_code == 404
    listed = (await gw.http.get("/v1/models", headers={"authorization": f"Bearer {SCOPED}"})).json()["data"]
    assert [m["id"] for m in listed] == ["friendly", "main"]
