"""The floor under the gateway bench's stream figures: a bare trio byte relay. Each client connection gets one
connection to the upstream, and bytes are copied both ways as they come (no parsing, no checks, no routing).

What it adds over the direct run is what any trio proxy pays on this machine before doing any work of its own:
two more loopback hops and the wake-ups they cost. tests/bench/gateway.py prints it beside the gateway's figure.

Run: `python tests/bench/_relay.py UPSTREAM_URL`: prints `READY http://host:port`.
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit

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


async def _serve(host: str, port: int, client: trio.SocketStream) -> None:
    client.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
    try:
        upstream = await trio.open_tcp_stream(host, port)
    except OSError:
        await client.aclose()
        return
    async with client, upstream, trio.open_nursery() as nursery:
        nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
        nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)


async def _main(upstream: str) -> None:
    parts = urlsplit(upstream)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(f"READY http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)

    async def handler(client: trio.SocketStream) -> None:
        await _serve(parts.hostname or "127.0.0.1", parts.port or 80, client)

    await trio.serve_listeners(handler, listeners)


if __name__ == "__main__":
    trio.run(_main, sys.argv[1])
