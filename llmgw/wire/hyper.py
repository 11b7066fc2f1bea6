"""hypercorn's trio worker with our gate in front (`serve_gated`): the admin API's listener.

Why not `hypercorn.trio.serve`: its accept loop (`trio.serve_listeners`) takes every connection it can, so
1,000 idle connections took a 1,024-descriptor process's last descriptors and GET /api/v1/status failed
(issue 20). Here each accepted connection goes through a `ConnectionGate` (llmgw/wire/gate.py) first, and
the connection tells the gate when it waits for a request (hypercorn's own `Updated(idle=...)` events) and
when its socket is closed. The rest is hypercorn 0.18's trio worker (the version is pinned): the same
lifespan, worker context, TLS and protocols, without QUIC.
"""

from __future__ import annotations

from functools import partial
from ssl import SSLContext
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.events import Event, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app

from llmgw.wire.gate import ConnectionGate, Slot, accept_loop

__all__ = ["serve_gated"]


class _GatedConnection(TCPServer):
    """hypercorn's connection, telling the gate when it waits for a request and when it is closed."""

    def __init__(self, app: AppWrapper, config: Config, context: WorkerContext, state: ConnectionState,
                 stream: Any, gate: ConnectionGate, slot: Slot) -> None:
        super().__init__(app, config, context, state, stream)
        self._gate = gate
        self._slot = slot

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            if event.idle:
                self._gate.rest(self._slot)
            else:
                self._gate.wake(self._slot)
        await super().protocol_send(event)

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            self._gate.release(self._slot)

    async def _initiate_server_close(self) -> None:  # (the keep-alive timeout's close)
        try:
            await super()._initiate_server_close()
        finally:
            self._gate.release(self._slot)


async def serve_gated(app: Any, config: Config, gate: ConnectionGate, *, accept_retry_s: float,
                      task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """`hypercorn.trio.serve(app, config)` with each connection admitted by `gate`; reports its bound
    URLs through `task_status`, and serves until cancelled. A failed accept waits `accept_retry_s`."""
    config.set_statsd_logger_class(StatsdLogger)
    wrapped = wrap_app(app, config.wsgi_max_body_size, None)
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    state = ConnectionState(lifespan_state.copy())
    ssl_context = config.create_ssl_context()

    async def connection(tls: SSLContext | None, stream: trio.SocketStream, slot: Slot) -> None:
        served: Any = stream if tls is None else trio.SSLStream(stream, tls, server_side=True, https_compatible=True)
        await _GatedConnection(wrapped, config, context, state, served, gate, slot).run()

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            listeners: list[tuple[trio.SocketListener, SSLContext | None]] = []
            binds = []
            try:
                for sock, tls, scheme in [*((s, ssl_context, "https") for s in sockets.secure_sockets),
                                          *((s, None, "http") for s in sockets.insecure_sockets)]:
                    sock.listen(config.backlog)
                    listeners.append((trio.SocketListener(trio.socket.from_stdlib_socket(sock)), tls))
                    binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")
                async with trio.open_nursery() as acceptors:
                    for listener, tls in listeners:
                        acceptors.start_soon(accept_loop, listener, gate, server_nursery, partial(connection, tls),
                                             accept_retry_s)
                    task_status.started(binds)
            finally:
                for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
                    sock.close()
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
