"""An engine whose every answer a test scripts: status, headers, each chunk and when it goes out,
and which notices a caller that hangs up mid-answer. A real tiny HTTP/1.1 server on loopback, for the
gateway's streaming, cancellation and engine-error tests (what real engines do too fast to watch)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import trio

__all__ = ["Reply", "Request", "ScriptedEngine", "serving"]


async def read_request(stream: trio.abc.ReceiveStream, buffer: bytearray) -> tuple[bytes, bytes] | None:
    """The next request's head and (content-length) body off `stream`, `buffer` holding what was read past
    it; None when the caller closed first. The test engines' whole HTTP parsing: naive on purpose."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n")
    head = bytes(buffer[:end])
    del buffer[:end + 4]
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(buffer) < length:
        buffer += await stream.receive_some(65536)
    body = bytes(buffer[:length])
    del buffer[:length]
    return head, body


@dataclass
class Request:
    head: bytes
    body: bytes


class Reply:
    """One answer, written as the script says: `whole`, or `start`, `chunk`... and `end` (chunked)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self.ended = False

    async def whole(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
        await self._stream.send_all(head.encode() + body)
        self.ended = True

    async def start(self, status: int = 200, content_type: str = "text/event-stream") -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
        await self._stream.send_all(head.encode())

    async def chunk(self, data: bytes) -> None:
        if data:  # an empty chunk is the end of a chunked body: that is `end()`
            await self._stream.send_all(b"%x\r\n%s\r\n" % (len(data), data))

    async def end(self) -> None:
        await self._stream.send_all(b"0\r\n\r\n")
        self.ended = True


Script = Callable[[Request, Reply], Awaitable[None]]


@dataclass
class ScriptedEngine:
    """Runs `script` for each request. `arrived` is set when a request came in; `hung_up` when a
    caller closed its connection before its answer ended (the script is then cancelled)."""

    script: Script
    requests: list[Request] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)
    hung_up: trio.Event = field(default_factory=trio.Event)

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = bytearray()
        async with stream:
            while True:
                got = await read_request(stream, buffer)
                if got is None:
                    return
                request = Request(*got)
                self.requests.append(request)
                self.arrived.set()
                reply = Reply(stream)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch, stream, buffer, nursery.cancel_scope)
                    await self.script(request, reply)
                    nursery.cancel_scope.cancel()
                if not reply.ended:
                    return

    async def _watch(self, stream: trio.SocketStream, buffer: bytearray, scope: trio.CancelScope) -> None:
        """Read ahead while the script answers: EOF is the caller hanging up."""
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self.hung_up.set()
                scope.cancel()
                return
            buffer += data


async def serving(nursery: trio.Nursery, engine: ScriptedEngine) -> str:
    """Serve `engine` on a free loopback port; its base URL (`http://127.0.0.1:PORT`)."""
    listeners = await nursery.start(partial(trio.serve_tcp, engine.handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
