"""A restart in place of the lean HTTP/1.1 server (llmgw/wire/front.py, `serve(hand_over=...)`), on real loopback
sockets: while it drains, a request sent on a kept-alive connection is answered (with `Connection: close`), a busy
one finishes, clients that connect meanwhile wait in the kernel's queue, and the next server, adopting the same
listening socket by its descriptor, answers them. Beside it, what a plain stop does to the same clients (the
behaviour a restart without the handover had): the kept-alive request is dropped and new clients are refused."""

from __future__ import annotations

import dataclasses
import socket

import pytest
import trio

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.wire.asgi import Receive, Scope, Send
from llmgw.wire.front import Front, adopt_socket, listen_socket
from tests.integration.test_front_sockets import Conn, hello

pytestmark = pytest.mark.slow

# Short enough for a test, and far above what a busy machine takes to answer on loopback.
DRAIN_IDLE_S = 1.0
TIMEOUTS_HERE = dataclasses.replace(TIMEOUTS, gateway_drain_idle_s=DRAIN_IDLE_S)


async def _until(condition: object) -> None:
    while not callable(condition) or not condition():
        await trio.sleep(0.01)


async def test_a_drain_serves_kept_alive_and_busy_clients_and_the_next_server_takes_the_queued_ones() -> None:
    entered, release = trio.Event(), trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/slow":
            entered.set()
            await release.wait()
        await hello(scope, receive, send)

    sock = await listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    old, stop, returned = Front(app, timeouts=TIMEOUTS_HERE), trio.Event(), trio.Event()

    async def run_old(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await old.serve([sock], shutdown_trigger=stop.wait, hand_over=[sock], task_status=task_status)
        returned.set()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_old)
            idle, busy = await Conn.open(port), await Conn.open(port)
            assert (await idle.ask("/first")).headers.get("connection") is None  # kept alive
            await busy.send("/slow")
            await entered.wait()
            stop.set()
            await _until(lambda: old.closing)
            # A client that connects now is queued by the kernel (the socket still listens): nobody accepts it yet.
            late = await Conn.open(port)
            await late.send("/late")
            # The client of the idle connection sends on it, as an SDK pool does: answered, and told to close.
            again = await idle.ask("/again")
            assert (again.status, again.body, again.headers["connection"]) == (200, b"/again", "close")
            assert await idle.closed()
            release.set()
            slow = await busy.answer()
            assert (slow.status, slow.body, slow.headers["connection"]) == (200, b"/slow", "close")
            await returned.wait()
            assert old.stopped
            # The next program: the same socket by its descriptor (as `llmgw gateway` passes it across its exec).
            fd = sock.detach()
            adopted = adopt_socket(fd)
            new = Front(app, timeouts=TIMEOUTS_HERE)
            await nursery.start(new.serve, [adopted])
            answer = await late.answer()
            assert (answer.status, answer.body) == (200, b"/late")
            fresh = await Conn.open(port)
            assert (await fresh.ask("/fresh")).body == b"/fresh"
            for conn in (idle, busy, late, fresh):
                await conn.stream.aclose()
            nursery.cancel_scope.cancel()
        adopted.close()


async def test_a_drain_closes_a_connection_left_idle_only_once_no_pool_would_send_on_it() -> None:
    sock = await listen_socket("127.0.0.1", 0)
    front, stop = Front(hello, timeouts=TIMEOUTS_HERE), trio.Event()
    with sock, trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: front.serve([sock], shutdown_trigger=stop.wait, hand_over=[sock],
                                                                task_status=task_status))
            conn = await Conn.open(sock.getsockname()[1])
            assert (await conn.ask("/a")).headers.get("connection") is None
            idle_from = trio.current_time()
            stop.set()
            assert await conn.closed()
            assert trio.current_time() - idle_from >= DRAIN_IDLE_S * 0.9  # not at once: a pool may still send
            await _until(lambda: front.stopped)
            await conn.stream.aclose()
            nursery.cancel_scope.cancel()


async def test_a_plain_stop_drops_a_request_sent_on_a_kept_alive_connection_and_refuses_new_clients() -> None:
    """What a restart did before the handover: the same clients lose their requests."""
    sock = await listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    front, stop, returned = Front(hello, timeouts=TIMEOUTS_HERE), trio.Event(), trio.Event()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await front.serve([sock], shutdown_trigger=stop.wait, task_status=task_status)
        returned.set()

    with sock, trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            idle = await Conn.open(port)
            assert (await idle.ask("/first")).headers.get("connection") is None
            stop.set()
            await returned.wait()
            try:
                await idle.send("/again")
                lost = await idle.stream.receive_some(65536) == b""
            except (trio.BrokenResourceError, OSError):
                lost = True
            assert lost, "the request sent on the kept-alive connection got no answer"
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
            await idle.stream.aclose()
            nursery.cancel_scope.cancel()


def test_adopt_socket_takes_only_a_listening_tcp_socket() -> None:
    with socket.socket() as bound_only:
        bound_only.bind(("127.0.0.1", 0))
        with pytest.raises(ValueError, match="not a listening TCP socket"):
            adopt_socket(bound_only.fileno())
        assert bound_only.fileno() >= 0  # left open: not the caller's to lose
