"""The gateway sends a request once more when an engine closed a reused kept-alive connection before
answering (what llama.cpp's server does now and then), and never otherwise. A real tiny HTTP server
on loopback plays the engine."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
import trio

from llmgw.gateway.upstream import send

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


class Engine:
    """Answers the first request of each connection (keeping it alive); on a later request of the same
    connection, or on every request when `answer_none`, it closes without a byte."""

    def __init__(self, answer_none: bool = False) -> None:
        self.answer_none = answer_none
        self.requests = 0
        self.connections = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        served = 0
        buffer = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                buffer = buffer[length:]
                self.requests += 1
                if self.answer_none or served >= 1:
                    return  # close, not a byte of answer
                served += 1
                await stream.send_all(OK)


async def serving(nursery: trio.Nursery, engine: Engine) -> str:
    listeners = await nursery.start(partial(trio.serve_tcp, engine.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/chat/completions"


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
