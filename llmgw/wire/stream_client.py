"""The client end of a stream to a control plane (agents and gateways each keep one): the
WebSocket URL of a control's admin URL, and a connection that always closes its TCP stream.
Over `wss://` the machine offers its certificate (its `tls` context) and verifies control's."""

from __future__ import annotations

import ssl
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
async def open_stream(control: str, path: str, tls: ssl.SSLContext | None, *, connect_s: float,
                      close_s: float, local: str | None = None) -> AsyncIterator[WebSocketConnection]:
    """One stream, from TCP connect to close, authenticated by the certificate in `tls` (an https
    control; None: plain, which a control refuses for machines). We own the TCP stream and always
    close it: trio-websocket leaves it open after an abnormal closure or a refused handshake.
    Connect and handshakes each give up after `connect_s` (a machine that is down may never answer).
    `local`: the in-memory credential of a machine inside the control plane's own process (`llmgw up`)."""
    url = urlsplit(ws_url(control, path))
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "wss" else 80)
    if url.scheme == "wss" and tls is None:
        raise ValueError(f"{control}: an https control plane needs this machine's TLS context")
    stream: trio.abc.Stream
    with trio.fail_after(connect_s):
        stream = await trio.open_tcp_stream(host, port)
    try:
        if url.scheme == "wss":
            assert tls is not None
            stream = trio.SSLStream(stream, tls, server_hostname=host, https_compatible=True)
            with trio.fail_after(connect_s):
                await stream.do_handshake()
        async with trio.open_nursery() as nursery:
            with trio.fail_after(connect_s):
                ws = await wrap_client_stream(
                    nursery, stream, f"{host}:{port}", url.path,
                    extra_headers=[(b"authorization", f"Bearer {local}".encode())] if local else None,
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
            with trio.move_on_after(close_s):  # a TLS close_notify the peer may never read
                await stream.aclose()
            if isinstance(stream, trio.SSLStream):
                await stream.transport_stream.aclose()
