"""A model's own upstream timeouts (its definition's `timeouts`), through the whole gateway over real
HTTP, against a scripted engine that takes its time. pytest-trio's autojump MockClock: "after 5 s" is exact, and free."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine, serving

KEY = "sk-test-client"
ENGINE_THINKS_S = 40.0  # how long the scripted engine takes before each part of its answer
ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}).encode()


async def _slow(request: Request, reply: Reply) -> None:
    """A whole answer after ENGINE_THINKS_S, or a stream whose second chunk comes ENGINE_THINKS_S late."""
    if b'"stream": true' not in request.body and b'"stream":true' not in request.body:
        await trio.sleep(ENGINE_THINKS_S)
        await reply.whole(200, ANSWER)
        return
    await reply.start()
    await reply.chunk(b'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n')
    await trio.sleep(ENGINE_THINKS_S)
    await reply.chunk(b'data: {"choices":[{"index":0,"delta":{"content":"two"}}]}\n\ndata: [DONE]\n\n')
    await reply.end()


@dataclass
class Setup:
    http: httpx.AsyncClient


@pytest.fixture
async def gw(nursery: trio.Nursery) -> AsyncIterator[Setup]:
    # The gateway's defaults are above the engine's pace, so only a model's own shorter timeout fails it.
    assert TIMEOUTS.upstream_first_byte_s > ENGINE_THINKS_S and TIMEOUTS.upstream_chunk_s > ENGINE_THINKS_S
    store = MemoryStore()
    url = await serving(nursery, ScriptedEngine(_slow))
    routes = {}
    for name, timeouts in (("patient", None), ("brief", {"first_byte_s": 5, "chunk_s": 7.5})):
        doc = {"name": name, "engine": "sim", "source": f"sim://{name}"}
        store.submit_nowait(commands.put_model(ModelDef.from_doc(doc | ({"timeouts": timeouts} if timeouts else {})),
                                               at=0.0))
        routes[name] = ModelRoute(name, "chat", "ready", (Endpoint(f"{name}-r1", url),))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    auth = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers=auth, timeout=None) as http:
        yield Setup(http)


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_a_models_first_byte_timeout_is_its_own_and_others_keep_the_default(gw: Setup, autojump_clock: trio.testing.MockClock) -> None:
    started = trio.current_time()
    response = await gw.http.post("/v1/chat/completions", json=chat("brief"))
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout" and "within 5 s" in error["message"], error
    assert trio.current_time() - started == pytest.approx(5.0, abs=0.1)  # its own 5 s, not the engine's 60
    # The same engine, the same pace: a model without its own timeout waits the gateway's default and is served.
    started = trio.current_time()
    response = await gw.http.post("/v1/chat/completions", json=chat("patient"))
    assert response.status_code == 200, response.text
    assert trio.current_time() - started == pytest.approx(ENGINE_THINKS_S, abs=0.1)


async def test_a_models_chunk_timeout_ends_its_stream_with_an_error_event(gw: Setup, autojump_clock: trio.testing.MockClock) -> None:
    async def frames(model: str) -> list[str]:
        async with gw.http.stream("POST", "/v1/chat/completions", json=chat(model, stream=True)) as response:
            assert response.status_code == 200
            text = (await response.aread()).decode()
        return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]

    started = trio.current_time()
    brief = await frames("brief")
    assert trio.current_time() - started == pytest.approx(7.5, abs=0.1)
    assert json.loads(brief[0])["choices"][0]["delta"]["content"] == "one"
    error = json.loads(brief[-1])["error"]
    assert error["code"] == "upstream_timeout" and "nothing for 7.5 s" in error["message"], error
    patient = await frames("patient")
    assert [json.loads(f)["choices"][0]["delta"]["content"] for f in patient[:2]] == ["one", "two"]
    assert patient[-1] == "[DONE]"


async def test_an_engine_that_takes_no_request_times_out_on_the_write(nursery: trio.Nursery,
                                                                        autojump_clock: trio.testing.MockClock) -> None:
    """The request's write has its own limit (`upstream_write_s`), told apart from the wait for the answer's head
    (the two share one cancel scope, its deadline moved once the request is written: gateway/upstream.py)."""

    async def deaf(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()  # takes the connection, never reads: the request fills the socket buffers

    listeners = await nursery.start(partial(trio.serve_tcp, deaf, 0, host="127.0.0.1"))
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": "deaf", "engine": "sim", "source": "sim://d"}),
                                           at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    router.update_routes({"deaf": ModelRoute("deaf", "chat", "ready", (Endpoint("deaf-r1", url),))})
    waits = dataclasses.replace(TIMEOUTS, upstream_write_s=3.0)
    deps = GatewayDeps(router=router, state=store, timeouts=waits)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps))
    # 7 MB: more than the loopback socket buffers take from a peer that never reads (4 MB to send, ~128 KB to
    # receive), less than the gateway's body limit.
    body = chat("deaf", messages=[{"role": "user", "content": "x" * 7_000_000}])
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=None,
                                 headers={"authorization": f"Bearer {KEY}"}) as http:
        started = trio.current_time()
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout" and "took no request within 3 s" in error["message"], error
    assert trio.current_time() - started == pytest.approx(3.0, abs=0.1)
