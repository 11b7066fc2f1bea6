"""An engine that drops kept-alive connections: it answers the first request of each connection
and closes on the next one without a byte (what llama.cpp's server does now and then), or answers
nothing at all (`answer_none`), or answers every request with an error status while `fail_with` is set
(an engine gone bad: for the circuit breaker's tests). A real tiny HTTP/1.1 server on loopback, for the
gateway's retry tests."""

from __future__ import annotations

from functools import partial

import trio

from llmgw.testing.scripted_engine import read_request

__all__ = ["Engine", "serving"]

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


class Engine:
    """Answers the first request of each connection (keeping it alive); on a later request of the same
    connection, or on every request when `answer_none`, it closes without a byte. While `fail_with` is
    set, every request is answered with that status (kept alive); with `drops` False, every request is
    answered (never a dropped connection)."""

    def __init__(self, answer_none: bool = False, fail_with: int | None = None, drops: bool = True) -> None:
        self.answer_none = answer_none
        self.fail_with = fail_with
        self.drops = drops
        self.requests = 0
        self.connections = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        served = 0
        buffer = bytearray()
        async with stream:
            while True:
                if await read_request(stream, buffer) is None:
                    return
                self.requests += 1
                if self.fail_with is not None:
                    body = b'{"error":{"message":"the engine is failing","type":"server_error"}}'
                    await stream.send_all(b"HTTP/1.1 %d Internal Server Error\r\ncontent-type: application/json\r\n"
                                          b"content-length: %d\r\n\r\n%s" % (self.fail_with, len(body), body))
                    continue
                if self.answer_none or (served >= 1 and self.drops):
                    return  # close, not a byte of answer
                served += 1
                await stream.send_all(OK)


async def serving(nursery: trio.Nursery, engine: Engine) -> str:
    """Serve `engine` on a free loopback port; its chat-completions URL."""
    listeners = await nursery.start(partial(trio.serve_tcp, engine.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/chat/completions"
