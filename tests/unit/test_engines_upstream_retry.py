"""The gateway sends a request once more when an engine closed a reused kept-alive connection before
answering (what llama.cpp's server does now and then), and never otherwise. A real tiny HTTP server
on loopback plays the engine."""

from __future__ import annotations

import httpx
import pytest
import trio

from llmgw.gateway.upstream import send
from llmgw.testing.flaky_engine import Engine, serving


def post(client: httpx.AsyncClient, url: str) -> httpx.Request:
    return client.build_request("POST", url, content=b'{"model":"m"}', headers={"content-type": "application/json"})


async def test_a_dropped_kept_alive_connection_is_retried_once() -> None:
    engine = Engine()
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as client:
        url = await serving(nursery, engine)
        first = await send(client, post(client, url))
        assert (first.status_code, await first.aread()) == (200, b'{"ok":true}')
        await first.aclose()
        second = await send(client, post(client, url))  # reuses the kept-alive connection: dropped
        assert (second.status_code, await second.aread()) == (200, b'{"ok":true}')
        await second.aclose()
        assert (engine.requests, engine.connections) == (3, 2)
        nursery.cancel_scope.cancel()


async def test_a_fresh_connection_that_answers_nothing_is_not_retried() -> None:
    engine = Engine(answer_none=True)
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as client:
        url = await serving(nursery, engine)
        with pytest.raises(httpx.RemoteProtocolError):
            await send(client, post(client, url))
        assert engine.requests == 1  # the engine may be failing on this very request: not twice
        nursery.cancel_scope.cancel()


async def test_retried_only_once() -> None:
    engine = Engine()
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as client:
        url = await serving(nursery, engine)
        kept = await send(client, post(client, url))
        await kept.aread()
        await kept.aclose()  # one kept-alive connection in the pool
        engine.answer_none = True  # now every connection, old or new, closes without an answer
        with pytest.raises(httpx.RemoteProtocolError):
            await send(client, post(client, url))
        assert (engine.requests, engine.connections) == (3, 2)  # the first, the dropped one, one retry
        nursery.cancel_scope.cancel()
