"""Every listener bounded (issue 20, docs/operations.md "Limits"): on real sockets, the gateway's front closes
its oldest idle connection to make room and refuses a new one when all are busy; and `llmgw up` limited to
1,024 descriptors keeps answering GET /api/v1/status and /v1/models while 1,000 idle connections are held
against each of its listeners (reported: they took every descriptor, and status answered 500)."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio

from llmgw.domain.limits import Caps
from llmgw.wire.asgi import Receive, Scope, Send, hypercorn_config, lifespan
from llmgw.wire.front import Front, listen_socket
from llmgw.wire.gate import ConnectionGate
from llmgw.wire.hyper import serve_gated
from tests.support.processes import UpProcess

GET = b"GET /v1/models HTTP/1.1\r\nhost: test\r\n\r\n"


@asynccontextmanager
async def front_on_loopback(app: object, caps: Caps) -> AsyncIterator[tuple[Front, int]]:
    sock = await listen_socket("127.0.0.1", 0)
    front = Front(app, gate=ConnectionGate("gateway", caps))  # type: ignore[arg-type]
    with sock:
        async with trio.open_nursery() as nursery:
            await nursery.start(front.serve, [sock])
            yield front, sock.getsockname()[1]
            nursery.cancel_scope.cancel()


async def answered(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    return data


async def closed(stream: trio.SocketStream) -> bool:
    """Whether the server closed the connection without a word (end of stream, or a reset)."""
    try:
        return await stream.receive_some(65536) == b""
    except trio.BrokenResourceError:
        return True


async def test_at_its_limit_the_front_closes_its_oldest_idle_connection_to_make_room() -> None:
    async def hello(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"hi"})

    async with front_on_loopback(hello, Caps(2, 2)) as (front, port):
        oldest = await trio.open_tcp_stream("127.0.0.1", port)
        kept = await trio.open_tcp_stream("127.0.0.1", port)
        await kept.send_all(GET)  # kept alive after its answer: idle, but not the oldest
        assert (await answered(kept)).startswith(b"HTTP/1.1 200")
        newest = await trio.open_tcp_stream("127.0.0.1", port)
        assert await closed(oldest)
        await newest.send_all(GET)
        assert (await answered(newest)).startswith(b"HTTP/1.1 200")
        stats = front.gate.statistics()
        assert (stats.open, stats.evicted, stats.refused_listener_full) == (2, 1, 0)
        for s in (oldest, kept, newest):
            await s.aclose()


async def test_with_every_connection_busy_a_new_one_is_refused_at_once() -> None:
    release = trio.Event()
    started = 0
    both_started = trio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal started
        started += 1
        if started == 2:
            both_started.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    async with front_on_loopback(slow, Caps(2, 10)) as (front, port):
        busy = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        for s in busy:
            await s.send_all(GET)
        await both_started.wait()
        refused = await trio.open_tcp_stream("127.0.0.1", port)
        assert await closed(refused)
        assert front.gate.statistics().refused_listener_full == 1
        release.set()
        for s in busy:  # the busy ones were never touched
            assert (await answered(s)).startswith(b"HTTP/1.1 200")
            await s.aclose()
        await refused.aclose()


async def test_the_admin_listener_under_hypercorn_makes_room_from_its_idle_connections() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = ConnectionGate("admin", Caps(4, 4))
    config = hypercorn_config("127.0.0.1", 0, logger="test", graceful_s=1.0, keep_alive_s=5.0)
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(partial(serve_gated, app, config, gate, accept_retry_s=0.1))
        port = int(url.rsplit(":", 1)[1])
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(10)]
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/api/v1/status")).status_code == 200
        for stream in idle[:7]:  # 10 idle and the request's: the 7 oldest made room
            assert await closed(stream)
        stats = gate.statistics()
        assert stats.evicted == 7 and stats.refused_listener_full == 0 and stats.open <= 4
        for stream in idle:
            await stream.aclose()
        nursery.cancel_scope.cancel()


# --- a whole process, limited to 1,024 descriptors ---------------------------------------------------

FLOOD = 1000
DESCRIPTORS = 1024


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    """This test process holds both floods (2,000 sockets) besides its own: raise its soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * FLOOD + 1024
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open-files limit ({hard}) is below the {need} this test holds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def flood(url: str) -> list[socket.socket]:
    """FLOOD connections that send nothing, each connected (in the listener's backlog, or accepted)."""
    host, port = url.split("://")[1].split("/")[0].rsplit(":", 1)
    return [socket.create_connection((host.strip("[]"), int(port)), timeout=5) for _ in range(FLOOD)]


def descriptors_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
def test_up_under_1024_descriptors_answers_while_1000_idle_connections_are_held_on_each_listener(
        tmp_path: object, many_descriptors: None) -> None:
    up = UpProcess(tmp_path / "state",  # type: ignore[operator]
                   wrap=["prlimit", f"--nofile={DESCRIPTORS}:{DESCRIPTORS}", "--"]).start()
    held: list[socket.socket] = []
    try:
        assert up.proc is not None
        creds = up.credentials
        admin = {"Authorization": f"Bearer {creds['admin_key']}"}
        client = {"Authorization": f"Bearer {creds['client_key']}"}
        # Less than the admin API's keep-alive (5 s): a flood that took every descriptor would still be
        # there, and the status's connection would wait in the backlog behind it.
        patience = httpx.Timeout(4.0)
        held += flood(creds["admin_url"])
        status = httpx.get(creds["admin_url"] + "/api/v1/status", headers=admin, timeout=patience)
        assert status.status_code == 200, status.text
        held += flood(creds["gateway_url"])
        models = httpx.get(creds["gateway_url"] + "/models", headers=client, timeout=patience)
        assert models.status_code == 200, models.text
        status = httpx.get(creds["admin_url"] + "/api/v1/status", headers=admin, timeout=patience)
        assert status.status_code == 200, status.text
        # The process kept descriptors to spare, and said why it closed connections.
        assert descriptors_of(up.proc.pid) < DESCRIPTORS - 200
        metrics = httpx.get(creds["admin_url"] + "/metrics", timeout=patience).text
        assert 'llmgw_admin_connections_limit{scope="listener"} 192.0' in metrics
        assert "llmgw_admin_connections_evicted_total" in metrics
        gateway_metrics = httpx.get(creds["gateway_url"].removesuffix("/v1") + "/metrics", timeout=patience).text
        assert 'llmgw_gateway_connections_limit{scope="listener"} 288.0' in gateway_metrics
        assert any(line.startswith("llmgw_gateway_connections_evicted_total ") and float(line.split()[-1]) > 0
                   for line in gateway_metrics.splitlines())
    finally:
        for s in held:
            s.close()
        if up.proc is not None and up.proc.poll() is None:
            up.stop()  # SIGTERM: `up` stops the engines it started (a kill could leave one starting)
    log = "".join(up.output)
    assert "admin API at its connection limit (192 connections, 96 per address" in log, log[-3000:]
    assert "gateway at its connection limit (288 connections, 144 per address" in log
