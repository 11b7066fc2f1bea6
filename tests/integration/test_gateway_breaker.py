"""A replica that answers 5xx is taken out of rotation by the gateway's circuit breaker (issue 22, point 6):
a real gateway over loopback in front of a sim engine and a flaky test engine answering 500, on a MockClock
that moves only when the test jumps it (so "while open" is exact, not a race with the wall clock)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

import httpx
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.flaky_engine import Engine, serving
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine
from llmgw.testing.scripted_engine import serving as scripted

KEY = "sk-test-client"
FAILURES = 3
OPEN_S = 30.0


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock()  # rate 0, no autojump: time moves when the test says


@dataclass
class Setup:
    http: httpx.AsyncClient
    router: Router
    bad: Engine


@pytest.fixture
async def setup(nursery: trio.Nursery, clock: trio.testing.MockClock) -> AsyncIterator[Setup]:
    store = MemoryStore()
    # Affinity off: the same prompt each time, spread by least-outstanding over both replicas.
    model = ModelDef.from_doc({"name": "m", "engine": "sim", "source": "sim://m", "routing": {"affinity": "off"}})
    store.submit_nowait(commands.put_model(model, at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    store.submit_nowait(commands.put_setting("gateway.breaker_failures", FAILURES, at=0.0))
    bad = Engine(fail_with=500, drops=False)
    bad_url = await serving(nursery, bad)
    good_url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, "m", "chat", 0)))
    router = Router(breaker_open_s=OPEN_S)
    router.update_routes({"m": ModelRoute("m", "chat", "ready", (Endpoint("m-bad", bad_url.rsplit("/v1", 1)[0]),
                                                                 Endpoint("m-good", good_url)))})
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"}) as http:
        yield Setup(http, router, bad)


async def _ask(http: httpx.AsyncClient, stream: bool = False) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = await http.post("/v1/chat/completions", json=body)
    return response.status_code


async def test_a_replica_answering_500_is_out_of_rotation_until_a_probe_answers(
        setup: Setup, clock: trio.testing.MockClock) -> None:
    http, router, bad = setup.http, setup.router, setup.bad
    statuses = [await _ask(http, stream=i % 2 == 0) for i in range(2 * FAILURES)]  # round robin: every other
    assert sorted(statuses) == [200] * FAILURES + [500] * FAILURES  # the engine's 500s reach their clients
    assert bad.requests == FAILURES
    opened = router.open_breakers()
    assert list(opened) == ["m-bad"]
    assert opened["m-bad"].reason == f"{FAILURES} consecutive failures; last: the engine answered HTTP 500"
    gauge = 'llmgw_gateway_breaker_open{model="m",replica="m-bad"} 1.0'
    assert gauge in (await http.get("/metrics")).text

    # Open: no client request reaches it.
    assert [await _ask(http, stream=i % 2 == 0) for i in range(20)] == [200] * 20
    assert bad.requests == FAILURES

    # Half-open after the interval: exactly one request probes it; it still fails, so open again.
    clock.jump(OPEN_S)
    statuses = [await _ask(http) for _ in range(10)]
    assert bad.requests == FAILURES + 1 and sorted(statuses) == [200] * 9 + [500]
    assert "m-bad" in router.open_breakers()

    # It answers again: the next probe closes the breaker, and it is back in rotation.
    bad.fail_with = None
    clock.jump(OPEN_S)
    assert await _ask(http) == 200
    assert bad.requests == FAILURES + 2
    assert router.open_breakers() == {}
    assert "llmgw_gateway_breaker_open{" not in (await http.get("/metrics")).text
    assert [await _ask(http) for _ in range(6)] == [200] * 6
    assert bad.requests == FAILURES + 2 + 3  # round robin again


# --- a replica that answers nothing, or breaks off a whole answer: the request goes to another --------------


@dataclass
class Pair:
    http: httpx.AsyncClient
    router: Router
    good: Endpoint


async def _pair(nursery: trio.Nursery, bad_url: str) -> Pair:
    store = MemoryStore()
    # Affinity off: the same prompt each time, spread by least-outstanding over both replicas.
    model = ModelDef.from_doc({"name": "m", "engine": "sim", "source": "sim://m", "routing": {"affinity": "off"}})
    store.submit_nowait(commands.put_model(model, at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    good = Endpoint("m-good", await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, "m", "chat", 0))))
    router = Router(breaker_open_s=OPEN_S)
    router.update_routes({"m": ModelRoute("m", "chat", "ready", (Endpoint("m-bad", bad_url), good))})
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    http = httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"})
    return Pair(http, router, good)


async def test_a_replica_that_closes_before_answering_passes_its_requests_on(
        nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
    dead = Engine(answer_none=True)  # every connection closed without a byte (a fresh one: no same-replica retry)
    pair = await _pair(nursery, (await serving(nursery, dead)).rsplit("/v1", 1)[0])
    async with pair.http:
        statuses = [await _ask(pair.http, stream=i % 2 == 0) for i in range(8)]
    assert statuses == [200] * 8  # streams too: nothing had reached the client
    assert dead.requests == 5  # until its breaker opened (gateway.breaker_failures: 5 by default)
    assert "the connection broke before the answer" in pair.router.open_breakers()["m-bad"].reason


async def test_a_whole_answer_broken_off_is_asked_of_another_replica(
        nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
    async def cut(request: Request, reply: Reply) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n"
        await reply._stream.send_all(head + b'{"choices": [')  # then the connection closes: the body broke off

    cutting = ScriptedEngine(cut)
    pair = await _pair(nursery, await scripted(nursery, cutting))
    async with pair.http:
        answers = [await pair.http.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]}) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert all(a.json()["choices"][0]["message"]["content"] for a in answers)
    assert cutting.requests  # it was asked (and broke off) before the other replica answered
