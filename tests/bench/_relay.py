"""The floors under the gateway bench's stream figures: trio relays with no work of the gateway's own. Each client
connection gets one connection to the upstream.

- bytes (the default): bytes are copied both ways as they come (no parsing, no checks, no routing). What it adds over
  the direct run is what any trio proxy pays on this machine before doing any work of its own: two more loopback hops
  and the wake-ups they cost.
- `--http`: each request is read whole (httptools) before it is sent on, and the answer's head before anything goes
  back; then the answer's bytes as they come until it ends. What it adds is what any HTTP gateway in trio pays before
  it checks, routes or rewrites anything.

tests/bench/gateway.py prints both beside the gateway's figure.

Run: `python tests/bench/_relay.py [--http] UPSTREAM_URL`: prints `READY http://host:port`.
"""

from __future__ import annotations

import sys
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


async def _main(upstream: str, http: bool) -> None:
    parts = urlsplit(upstream)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(f"READY http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)

    async def handler(client: trio.SocketStream) -> None:
        await _serve(parts.hostname or "127.0.0.1", parts.port or 80, client, http)

    await trio.serve_listeners(handler, listeners)


if __name__ == "__main__":
    trio.run(_main, sys.argv[-1], "--http" in sys.argv[1:-1])
