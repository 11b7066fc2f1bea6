"""Prefix affinity across gateways (issue 22): three gateways with no shared state, each its own router and
table, send each conversation to the same one of three sim replicas, every turn of it; a model with affinity
off still spreads a conversation's turns by least outstanding. Real HTTP over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.engines import sim
from llmgw.engines.sim.app import SimApp
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore

KEY = "sk-test-affinity"
REPLICAS = 3


@dataclass
class World:
    sims: list[SimApp]
    gateways: list[httpx.AsyncClient]


@pytest.fixture
async def world(nursery: trio.Nursery) -> AsyncIterator[World]:
    apps, urls = [], []
    for _ in range(REPLICAS):
        opts = sim.SimOptions("127.0.0.1", 0, "chat")
        app = sim.make_app(opts)
        urls.append(await nursery.start(partial(sim.serve, opts, app=app)))
        apps.append(app)
    # Two models on the same engines (the sim answers any model name): one with affinity (the default for a
    # chat model), one with it off.
    routes = {
        name: ModelRoute(name, "chat", "ready", tuple(Endpoint(f"{name}-r{i}", url) for i, url in enumerate(urls)))
        for name in ("sticky", "spread")
    }
    clients = []
    async with trio.open_nursery() as gateways:
        for _ in range(3):  # each gateway: its own store, router and table, nothing shared but the engines
            store = MemoryStore()
            for model in (ModelDef.from_doc({"name": "sticky", "engine": "sim", "source": "sim://chat"}),
                          ModelDef.from_doc({"name": "spread", "engine": "sim", "source": "sim://chat",
                                             "routing": {"affinity": "off"}})):
                store.submit_nowait(commands.put_model(model, at=0.0))
            store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
            router = Router()
            router.update_routes(dict(routes))
            host, port = await gateways.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
            clients.append(httpx.AsyncClient(base_url=f"http://{host}:{port}",
                                             headers={"authorization": f"Bearer {KEY}"}))
        try:
            yield World(apps, clients)
        finally:
            for client in clients:
                await client.aclose()
            gateways.cancel_scope.cancel()


async def _served_by(world: World, gateway: httpx.AsyncClient, body: dict[str, Any]) -> int:
    """The replica (0..2) that answered `body` sent through `gateway` (requests go one at a time)."""
    before = [app.generated for app in world.sims]
    response = await gateway.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    changed = [i for i, app in enumerate(world.sims) if app.generated != before[i]]
    assert len(changed) == 1
    return changed[0]


def _turns(n: int, model: str = "sticky") -> list[dict[str, Any]]:
    """Conversation `n`'s first two turns, as a client sends them (the second carries the first back)."""
    system = {"role": "system", "content": "You answer questions about trains in one sentence."}
    first = [system, {"role": "user", "content": f"question {n}: when does the first train leave?"}]
    second = [*first, {"role": "assistant", "content": "sim says: at six"}, {"role": "user", "content": "and back?"}]
    return [{"model": model, "messages": first}, {"model": model, "messages": second}]


async def test_every_gateway_sends_a_conversation_to_the_same_replica(world: World) -> None:
    homes = []
    for n in range(12):
        served = {await _served_by(world, gateway, turn) for turn in _turns(n) for gateway in world.gateways}
        assert len(served) == 1, f"conversation {n} reached replicas {served}"
        homes.append(served.pop())
    assert len(set(homes)) > 1  # conversations still spread over the replicas


async def test_with_affinity_off_a_conversation_spreads_by_least_outstanding(world: World) -> None:
    gateway = world.gateways[0]
    served = [await _served_by(world, gateway, _turns(0, "spread")[1]) for _ in range(REPLICAS * 2)]
    assert sorted(served) == sorted(list(range(REPLICAS)) * 2)  # round robin over idle replicas
