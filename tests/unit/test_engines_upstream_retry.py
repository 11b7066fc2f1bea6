"""The gateway sends a request once more when an engine closed a reused kept-alive connection before
answering (what llama.cpp's server does now and then), and never otherwise. A real tiny HTTP server
on loopback plays the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from llmgw.gateway.pool import Pool
from llmgw.gateway.upstream import Dropped, Response, send
from llmgw.testing.flaky_engine import Engine, serving

PATH = "/v1/chat/completions"


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    pool = Pool()
    yield pool
    pool.close()


async def post(pool: Pool, url: str) -> Response:
    return await send(pool, url.removesuffix(PATH), PATH, b'{"model":"m"}', "req-1", limit=4, queue=4)


async def test_a_dropped_kept_alive_connection_is_retried_once(pool: Pool) -> None:
    engine = Engine()
    async with trio.open_nursery() as nursery:
        url = await serving(nursery, engine)
        first = await post(pool, url)
        assert (first.status, await first.read()) == (200, b'{"ok":true}')
        first.close()
        second = await post(pool, url)  # reuses the kept-alive connection: dropped
        assert (second.status, await second.read()) == (200, b'{"ok":true}')
        second.close()
        assert (engine.requests, engine.connections) == (3, 2)
        assert pool.stats.reused == 1
        nursery.cancel_scope.cancel()


async def test_a_fresh_connection_that_answers_nothing_is_not_retried(pool: Pool) -> None:
    engine = Engine(answer_none=True)
    async with trio.open_nursery() as nursery:
        url = await serving(nursery, engine)
        with pytest.raises(Dropped):
            await post(pool, url)
        assert engine.requests == 1  # the engine may be failing on this very request: not twice
        nursery.cancel_scope.cancel()


async def test_retried_only_once(pool: Pool) -> None:
    engine = Engine()
    async with trio.open_nursery() as nursery:
        url = await serving(nursery, engine)
        kept = await post(pool, url)
        await kept.read()
        kept.close()  # one kept-alive connection in the pool
        engine.answer_none = True  # now every connection, old or new, closes without an answer
        with pytest.raises(Dropped):
            await post(pool, url)
        assert (engine.requests, engine.connections) == (3, 2)  # the first, the dropped one, one retry
        assert pool.in_use(url.removesuffix(PATH)) == 0  # the failed slot was given back
        nursery.cancel_scope.cancel()
