"""The lean HTTP/1.1 server (llmgw/wire/front.py) on real loopback sockets: its listening sockets (`SO_REUSEPORT`,
IPv6), the gentle close that keeps an answer alive when a body was left unread, and its graceful stop."""

from __future__ import annotations

import dataclasses
import errno
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import h11
import pytest
import trio
import trio.testing

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.wire.asgi import Receive, Scope, Send
from llmgw.wire.front import App, Front, listen_socket


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class Conn:
    """One client connection, speaking h11."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> Conn:
        return cls(await trio.open_tcp_stream(host, port))

    async def __aenter__(self) -> Conn:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stream.aclose()

    async def send(self, path: str) -> None:
        if self.h.our_state is h11.DONE and self.h.their_state is h11.DONE:
            self.h.start_next_cycle()
        wire = self.h.send(h11.Request(method="GET", target=path, headers=[("host", "test")]))
        await self.stream.send_all(wire + self.h.send(h11.EndOfMessage()))

    async def answer(self) -> Answer:
        response: h11.Response | None = None
        body = b""
        while True:
            event = self.h.next_event()
            if event is h11.NEED_DATA:
                self.h.receive_data(await self.stream.receive_some(65536))
            elif type(event) is h11.Response:
                response = event
            elif type(event) is h11.Data:
                body += event.data
            elif type(event) is h11.EndOfMessage:
                assert response is not None
                return Answer(response.status_code, {n.decode(): v.decode() for n, v in response.headers}, body)
            else:
                raise AssertionError(event)

    async def ask(self, path: str) -> Answer:
        await self.send(path)
        return await self.answer()

    async def closed(self) -> bool:
        """Whether the server closed the connection (sending nothing more)."""
        return self.h.trailing_data[0] == b"" and await self.stream.receive_some(65536) == b""


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["path"].encode(), "more_body": False})


@dataclass
class Server:
    front: Front
    port: int
    stop: trio.Event
    returned: trio.Event


@asynccontextmanager
async def serving(app: App, **timeouts: float) -> AsyncIterator[Server]:
    sock = await listen_socket("127.0.0.1", 0)
    front = Front(app, timeouts=dataclasses.replace(TIMEOUTS, **timeouts))
    server = Server(front, sock.getsockname()[1], trio.Event(), trio.Event())

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await front.serve([sock], shutdown_trigger=server.stop.wait, task_status=task_status)
        server.returned.set()

    with sock:  # its owner closes it (a cancelled `serve` leaves it open)
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            yield server
            nursery.cancel_scope.cancel()


# --- the gentle close ---------------------------------------------------------------------------


async def test_an_app_refusing_a_large_unread_body_still_gets_its_answer_to_the_client() -> None:
    async def refuser(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 413, "headers": []})
        await send({"type": "http.response.body", "body": b"too large", "more_body": False})

    size = 4 * 1024 * 1024  # more than the kernel's socket buffers hold
    async with serving(refuser) as server:
        with trio.fail_after(10):
            async with await Conn.open(server.port) as conn:
                head = conn.h.send(h11.Request(method="POST", target="/v1/x",
                                               headers=[("host", "test"), ("content-length", str(size))]))
                # As a plain HTTP/1.1 client does: the whole body, then the answer. Closing on an unread body
                # would reset the connection, failing this send (and, across a network, losing the answer).
                await conn.stream.send_all(head + bytes(size))
                conn.h.send(h11.Data(data=bytes(size)))
                conn.h.send(h11.EndOfMessage())
                answer = await conn.answer()
                assert await conn.closed()
    assert (answer.status, answer.body) == (413, b"too large")


# --- the graceful stop --------------------------------------------------------------------------


async def test_a_stop_closes_idle_connections_at_once_and_lets_a_busy_one_finish() -> None:
    entered, release = trio.Event(), trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/slow":
            entered.set()
            await release.wait()
        await hello(scope, receive, send)

    # Far below the keep-alive: an idle connection must not wait for it.
    with trio.fail_after(10):
        async with serving(app) as server, await Conn.open(server.port) as idle, \
                await Conn.open(server.port) as busy:
            assert (await idle.ask("/fast")).headers.get("connection") is None  # kept alive
            await busy.send("/slow")
            await entered.wait()
            server.stop.set()
            assert await idle.closed()  # while the busy request is still in the app
            assert not server.returned.is_set()
            release.set()
            answer = await busy.answer()
            assert (answer.status, answer.body, answer.headers["connection"]) == (200, b"/slow", "close")
            assert await busy.closed()
            await server.returned.wait()
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", server.port)


async def test_a_stop_gives_a_request_that_never_ends_the_grace_then_returns(
        autojump_clock: trio.testing.MockClock) -> None:
    entered = trio.Event()

    async def hangs(scope: Scope, receive: Receive, send: Send) -> None:
        entered.set()
        await trio.sleep_forever()

    async with serving(hangs, gateway_shutdown_grace_s=7.0) as server, await Conn.open(server.port) as conn:
        await conn.send("/v1/hangs")
        await entered.wait()
        stopped = trio.current_time()
        server.stop.set()
        await server.returned.wait()
        assert trio.current_time() - stopped == pytest.approx(7.0)
        assert await conn.closed()


# --- listening sockets --------------------------------------------------------------------------


async def test_listen_socket_takes_a_free_ipv4_port_and_serves_on_it() -> None:
    sock = await listen_socket("127.0.0.1", 0)
    with sock:
        host, port = sock.getsockname()
        assert (sock.family, host) == (socket.AF_INET, "127.0.0.1") and port > 0
        with trio.fail_after(10):
            front = Front(hello)
            async with trio.open_nursery() as nursery:
                await nursery.start(front.serve, [sock])
                async with await Conn.open(port) as conn:
                    assert (await conn.ask("/v1/models")).body == b"/v1/models"
                assert front.bound == ("127.0.0.1", port)
                nursery.cancel_scope.cancel()


async def test_two_listeners_share_a_port_with_reuse_port() -> None:
    first = await listen_socket("127.0.0.1", 0, reuse_port=True)
    port = first.getsockname()[1]
    second = await listen_socket("127.0.0.1", port, reuse_port=True)
    with first, second:
        assert second.getsockname()[1] == port
        with trio.fail_after(10):  # each one accepts on its own
            front = Front(hello)
            async with trio.open_nursery() as nursery:
                await nursery.start(front.serve, [first, second])
                for _ in range(4):
                    async with await Conn.open(port) as conn:
                        assert (await conn.ask("/x")).status == 200
                nursery.cancel_scope.cancel()


async def test_without_reuse_port_a_second_listener_on_the_port_is_refused() -> None:
    first = await listen_socket("127.0.0.1", 0)
    with first:
        port = first.getsockname()[1]
        with pytest.raises(OSError) as refused:
            await listen_socket("127.0.0.1", port)
        assert refused.value.errno == errno.EADDRINUSE
        with pytest.raises(OSError) as refused:  # nor can a worker asking for reuse_port join it
            await listen_socket("127.0.0.1", port, reuse_port=True)
        assert refused.value.errno == errno.EADDRINUSE


async def test_listen_socket_serves_ipv6_loopback_only_on_ipv6() -> None:
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6 support")
    try:
        sock = await listen_socket("::1", 0)
    except OSError as error:
        pytest.skip(f"no IPv6 loopback on this machine: {error}")
    with sock:
        assert sock.family == socket.AF_INET6
        port = sock.getsockname()[1]
        with trio.fail_after(10):
            front = Front(hello)
            async with trio.open_nursery() as nursery:
                await nursery.start(front.serve, [sock])
                async with await Conn.open(port, "::1") as conn:
                    assert (await conn.ask("/v6")).body == b"/v6"
                nursery.cancel_scope.cancel()


async def test_an_ipv6_wildcard_listener_leaves_ipv4_to_its_own_listener() -> None:
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6 support")
    try:
        any6 = await listen_socket("::", 0)
    except OSError as error:
        pytest.skip(f"no IPv6 on this machine: {error}")
    with any6:
        assert any6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        with await listen_socket("0.0.0.0", any6.getsockname()[1]) as any4:  # dual-stack would hold it: EADDRINUSE
            assert any4.family == socket.AF_INET
