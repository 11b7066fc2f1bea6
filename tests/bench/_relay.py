"""The floors under the gateway bench's stream figures: trio relays with no work of the gateway's own. Each client
connection gets one connection to the upstream.

- bytes (the default): bytes are copied both ways as they come (no parsing, no checks, no routing). What it adds over
  the direct run is what any trio proxy pays on this machine before doing any work of its own: two more loopback hops
  and the wake-ups they cost.
- `--http`: each request is read whole (httptools) before it is sent on, and the answer's head before anything goes
  back; then the answer's bytes as they come until it ends. What it adds is what any HTTP gateway in trio pays before
  it checks, routes or rewrites anything.
- `--front`: llmgw's own server (`llmgw.wire.front.Front`, what every `/v1` listener runs) with a minimal ASGI app:
  the body read, sent on a kept upstream connection, the answer's head read (httptools) and its body relayed as it
  comes. No key, no checks, no routing, no pool of the gateway's: what the server and ASGI cost under any app.
  Its upstream connections are not one per client connection: an idle one is taken per request.

tests/bench/gateway.py prints all three beside the gateway's figure; tests/bench/gateway_ab.py `--floors` puts them
(and the upstream itself) in its rotation.

Run: `python tests/bench/_relay.py [--http | --front] UPSTREAM_URL`: prints `READY http://host:port`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools
import trio


async def _pump(source: trio.abc.Stream, sink: trio.abc.Stream, done: trio.CancelScope) -> None:
    """Copy until either side ends or breaks; then the connection's other direction stops too."""
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done.cancel()


async def _serve(host: str, port: int, client: trio.SocketStream, http: bool) -> None:
    """One client connection, on a connection of its own to the upstream: its bytes copied, or relayed as HTTP."""
    client.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
    try:
        upstream = await trio.open_tcp_stream(host, port)
    except OSError:
        await client.aclose()
        return
    async with client, upstream:
        await (_relay_http if http else _copy)(client, upstream)


async def _copy(client: trio.SocketStream, upstream: trio.SocketStream) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
        nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)


class _Message:
    """What httptools says of the message being read: its head is in, it is whole."""

    def __init__(self) -> None:
        self.head = False
        self.done = False

    def on_headers_complete(self) -> None:
        self.head = True

    def on_message_complete(self) -> None:
        self.done = True


async def _relay_http(client: trio.SocketStream, upstream: trio.SocketStream) -> None:
    try:
        while True:
            request = _Message()
            reader = httptools.HttpRequestParser(request)
            parts = []
            while not request.done:  # the whole request, as a gateway reads it before deciding anything
                data = await client.receive_some(65536)
                if not data:
                    return
                reader.feed_data(data)
                parts.append(data)
            await upstream.send_all(b"".join(parts))
            answer = _Message()
            reader = httptools.HttpResponseParser(answer)
            held = b""
            while not answer.done:  # its head before anything goes back; then each read as it comes
                data = await upstream.receive_some(65536)
                if not data:
                    return
                reader.feed_data(data)
                if not answer.head:
                    held += data
                    continue
                await client.send_all(held + data if held else data)
                held = b""
    except (trio.BrokenResourceError, trio.ClosedResourceError, httptools.HttpParserError):
        pass


# Hop-by-hop, and what llmgw's server writes itself: not relayed from the upstream's head (`--front`).
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server"})


class _Answer(_Message):
    """An upstream answer being read: its head's fields and the body bytes not yet sent on."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _HOP:
            self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)


class _FrontApp:
    """The ASGI app of `--front`: each request on an idle upstream connection (a new one when none is idle), its
    answer relayed as it is read. The connection is kept for the next request once its answer ended."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[trio.SocketStream] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        parts = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        upstream = self.idle.pop() if self.idle else await trio.open_tcp_stream(self.host, self.port)
        try:
            await upstream.send_all(b"%s %s HTTP/1.1\r\nhost: upstream\r\ncontent-type: application/json\r\n"
                                    b"content-length: %d\r\n\r\n%s" % (scope["method"].encode(), scope["raw_path"],
                                                                         len(body), body))
            answer = _Answer()
            reader = httptools.HttpResponseParser(answer)
            started = False
            while not answer.done:
                data = await upstream.receive_some(65536)
                if not data:
                    raise trio.BrokenResourceError("the upstream closed mid-answer")
                reader.feed_data(data)
                if answer.head and not started:
                    started = True
                    await send({"type": "http.response.start", "status": reader.get_status_code(),
                                "headers": answer.headers})
                if answer.body or answer.done:
                    chunk = b"".join(answer.body)
                    answer.body.clear()
                    await send({"type": "http.response.body", "body": chunk, "more_body": not answer.done})
        except BaseException:
            await trio.aclose_forcefully(upstream)
            raise
        self.idle.append(upstream)


async def _front(host: str, port: int) -> None:
    from llmgw.wire.front import Front, listen_socket

    sock = await listen_socket("127.0.0.1", 0)
    print(f"READY http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    await Front(_FrontApp(host, port)).serve([(sock, None)])


async def _main(upstream: str, http: bool, front: bool = False) -> None:
    parts = urlsplit(upstream)
    if front:
        await _front(parts.hostname or "127.0.0.1", parts.port or 80)
        return
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(f"READY http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)

    async def handler(client: trio.SocketStream) -> None:
        await _serve(parts.hostname or "127.0.0.1", parts.port or 80, client, http)

    await trio.serve_listeners(handler, listeners)


if __name__ == "__main__":
    if str(Path(__file__).resolve().parents[2]) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `--front` imports llmgw from this tree
    trio.run(_main, sys.argv[-1], "--http" in sys.argv[1:-1], "--front" in sys.argv[1:-1])
