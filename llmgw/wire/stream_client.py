"""The client end of a stream to a control plane (agents and gateways each keep one): the
WebSocket URL of a control's admin URL, and a connection that always closes its TCP stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from llmgw.wire import protocol


def ws_url(control: str, path: str) -> str:
    """`http://h:p` (a control's admin URL) -> `ws://h:p` + `path`; https -> wss."""
    base = control.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if base.startswith(http):
            return ws + base[len(http):] + path
    return base + path


@asynccontextmanager
async def open_stream(control: str, path: str, key: str, *, connect_s: float,
                      close_s: float) -> AsyncIterator[WebSocketConnection]:
    """One stream, from TCP connect to close, authenticated with `key`. We own the TCP stream and
    always close it: trio-websocket leaves it open after an abnormal closure or a refused handshake.
    Connect and handshake each give up after `connect_s` (a machine that is down may never answer)."""
    url = urlsplit(ws_url(control, path))
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "wss" else 80)
    with trio.fail_after(connect_s):
        stream = await trio.open_tcp_stream(host, port)
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(connect_s):
                ws = await wrap_client_stream(
                    nursery, stream, f"{host}:{port}", url.path,
                    extra_headers=[(b"authorization", f"Bearer {key}".encode())],
                    max_message_size=protocol.MAX_MESSAGE_BYTES,
                )
            try:
                yield ws
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(close_s):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
