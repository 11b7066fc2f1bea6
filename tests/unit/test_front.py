"""The lean HTTP/1.1 server (llmgw/wire/front.py) over trio's memory streams: keep-alive, one write per answer, streaming,
refusals, disconnects as the app hears them; every timeout on the autojump MockClock (exact virtual times)."""

from __future__ import annotations

import email.utils
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import h11
import pytest
import trio
import trio.testing

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.wire.asgi import WATCH, Exchange, Message, Receive, Scope, Send, cancel_on_disconnect, cancelled_on_disconnect
from llmgw.wire.front import MAX_HEAD_BYTES, App, Front, _bytes_waiting

T = TIMEOUTS  # virtual time: the real values, each different, so the elapsed time names the timeout that fired
Clock = trio.testing.MockClock
Pair = Callable[[], tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]]


class Wire(trio.abc.HalfCloseableStream):
    """The server's side of the connection, keeping each write it was given."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    chunks: list[bytes]

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class Client:
    """Writes raw bytes; reads answers with an h11 client told which request each answers."""

    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self.stream = stream
        self.h = h11.Connection(h11.CLIENT)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def event(self) -> Any:
        while (event := self.h.next_event()) is h11.NEED_DATA:
            self.h.receive_data(bytes(await self.stream.receive_some(65536)))
        return event

    async def head(self, method: str = "GET") -> tuple[int, dict[str, str]]:
        """The next answer's status and headers (its request was sent raw: h11 only learns its method)."""
        h = self.h
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
        h.send(h11.Request(method=method, target="/", headers=[("host", "test")]))
        h.send(h11.EndOfMessage())
        response = await self.event()
        assert type(response) is h11.Response, response
        return response.status_code, {n.decode(): v.decode() for n, v in response.headers}

    async def answer(self, method: str = "GET") -> Answer:
        status, headers = await self.head(method)
        chunks: list[bytes] = []
        while type(event := await self.event()) is h11.Data:
            chunks.append(bytes(event.data))
        assert type(event) is h11.EndOfMessage, event
        return Answer(status, headers, chunks)

    async def rest(self) -> bytes:
        """Whatever else the server sends until it closes."""
        rest = bytes(self.h.trailing_data[0])
        while data := await self.stream.receive_some(65536):
            rest += data
        return rest


def request(method: str = "GET", target: str = "/v1/models", body: bytes | None = None, *headers: str) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "host: test", *headers]
    if body is not None:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def start(status: int = 200) -> Message:
    return {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]}


def body(data: bytes, more: bool = False) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


@dataclass
class Served:
    client: Client
    wire: Wire
    closed: trio.Event = field(default_factory=trio.Event)  # the server's side of the connection has ended
    closed_at: float = -1.0


@asynccontextmanager
async def serving(app: App, *, lockstep: bool = False, watcher: bool = False) -> AsyncIterator[Served]:
    """`watcher`: the connection offers the app its watcher (`WATCH`), as under `Front.serve` (its tasks' nursery
    is the test's)."""
    pair: Pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    client_stream, server_stream = pair()
    served = Served(Client(client_stream), Wire(server_stream))
    front = Front(app, timeouts=T)

    async def run() -> None:
        await front._connection(served.wire)
        served.closed_at = trio.current_time()
        served.closed.set()

    with trio.fail_after(1000):  # longer than every timeout: a test waiting for what never comes fails
        async with trio.open_nursery() as nursery:
            if watcher:
                front._connections = nursery
            nursery.start_soon(run)
            yield served
            nursery.cancel_scope.cancel()


Heard = list[tuple[float, Message]]


def echo(heard: Heard) -> App:
    """Reads the whole body (noting each message and when), then answers "METHOD PATH BODY"."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        data = b""
        while True:
            message = await receive()
            heard.append((trio.current_time(), message))
            if message["type"] != "http.request":
                return
            data += message["body"]
            if not message["more_body"]:
                break
        await send(start())
        await send(body(f"{scope['method']} {scope['path']} ".encode() + data))

    return app


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers without reading the request (a GET's empty body stays unread)."""
    await send(start())
    await send(body(f"{scope['method']} {scope['path']}".encode()))


# --- keep-alive ----------------------------------------------------------------------------------


async def test_two_requests_on_one_connection_are_both_answered(autojump_clock: Clock) -> None:
    heard: Heard = []
    async with serving(echo(heard)) as s:
        for n in (1, 2):
            await s.client.send(request("POST", "/v1/x", f"body {n}".encode()))
            assert (await s.client.answer("POST")).body == f"POST /v1/x body {n}".encode()
        assert not s.closed.is_set()


async def test_a_get_whose_empty_body_the_app_never_read_keeps_the_connection(autojump_clock: Clock) -> None:
    async with serving(hello) as s:
        for path in ("/v1/models", "/health"):
            await s.client.send(request("GET", path))
            assert (await s.client.answer()).body == f"GET {path}".encode()
        assert not s.closed.is_set()


async def test_pipelined_requests_are_answered_in_order(autojump_clock: Clock) -> None:
    heard: Heard = []
    async with serving(echo(heard)) as s:
        await s.client.send(request("GET", "/a") + request("POST", "/b", b"bee") + request("GET", "/c"))
        assert (await s.client.answer()).body == b"GET /a "
        assert (await s.client.answer("POST")).body == b"POST /b bee"
        assert (await s.client.answer()).body == b"GET /c "


# --- answers ---------------------------------------------------------------------------------------


async def test_a_whole_answer_is_one_write_with_length_date_and_server(autojump_clock: Clock) -> None:
    async with serving(hello) as s:
        await s.client.send(request("GET", "/v1/models"))
        answer = await s.client.answer()
        assert len(s.wire.writes) == 1 and s.wire.writes[0].endswith(b"\r\n\r\nGET /v1/models")
    assert answer.status == 200 and answer.body == b"GET /v1/models"
    assert answer.headers["content-length"] == str(len(answer.body))
    assert answer.headers["server"] == "llmgw"
    assert email.utils.parsedate_to_datetime(answer.headers["date"]).tzinfo is not None


async def test_a_streamed_answer_is_chunked_and_each_chunk_leaves_when_sent(autojump_clock: Clock) -> None:
    parts = [b"one ", b"two ", b"three"]
    go_send, go_receive = trio.open_memory_channel[None](0)

    async def streamer(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        for part in parts:
            await send(body(part, more=True))
            await go_receive.receive()  # the next part only once the client has this one
        await send(body(b""))

    async with serving(streamer) as s:
        await s.client.send(request("GET", "/v1/stream"))
        status, headers = await s.client.head()
        assert status == 200 and headers["transfer-encoding"] == "chunked" and "content-length" not in headers
        for part in parts:
            event = await s.client.event()
            assert type(event) is h11.Data and event.data == part
            await go_send.send(None)
        assert type(await s.client.event()) is h11.EndOfMessage
        assert not s.closed.is_set()


async def test_head_gets_the_headers_and_no_body(autojump_clock: Clock) -> None:
    async with serving(hello) as s:
        await s.client.send(request("HEAD", "/v1/models"))
        answer = await s.client.answer("HEAD")
        assert answer.headers["content-length"] == str(len(b"HEAD /v1/models")) and answer.body == b""
        assert s.wire.writes[-1].endswith(b"\r\n\r\n")  # not one byte of the body
        await s.client.send(request("GET", "/v1/models"))  # and the connection still frames the next one
        assert (await s.client.answer()).body == b"GET /v1/models"


# --- request bodies --------------------------------------------------------------------------------


async def test_expect_100_continue_is_answered_before_the_body_is_read(autojump_clock: Clock) -> None:
    heard: Heard = []
    async with serving(echo(heard)) as s:
        await s.client.send(request("POST", "/v1/x", None, "expect: 100-continue", "content-length: 5"))
        interim = bytes(await s.client.stream.receive_some(65536))
        assert interim.startswith(b"HTTP/1.1 100 ") and interim.endswith(b"\r\n\r\n")
        assert heard == []  # the app is still waiting for the body
        await s.client.send(b"hello")
        assert (await s.client.answer("POST")).body == b"POST /v1/x hello"


async def test_a_chunked_body_that_arrived_whole_is_one_message(autojump_clock: Clock) -> None:
    heard: Heard = []
    async with serving(echo(heard)) as s:
        chunks = b"5\r\nhello\r\n6\r\n world\r\n1\r\n!\r\n0\r\n\r\n"
        await s.client.send(request("POST", "/v1/x", None, "transfer-encoding: chunked") + chunks)
        assert (await s.client.answer("POST")).body == b"POST /v1/x hello world!"
    assert [m for _, m in heard] == [{"type": "http.request", "body": b"hello world!", "more_body": False}]


async def test_a_body_in_two_pieces_is_two_messages(autojump_clock: Clock) -> None:
    heard: Heard = []
    async with serving(echo(heard)) as s:
        await s.client.send(request("POST", "/v1/x", None, "content-length: 7"))
        await s.client.send(b"abc")
        await trio.testing.wait_all_tasks_blocked()
        await s.client.send(b"defg")
        assert (await s.client.answer("POST")).body == b"POST /v1/x abcdefg"
    assert [(m["body"], m["more_body"]) for _, m in heard] == [(b"abc", True), (b"defg", False)]


# --- refusals of bad and slow clients -------------------------------------------------------------


async def refused(s: Served, status: int) -> tuple[dict[str, Any], float]:
    """The refusal's error object and when it came, after checking it is JSON and the connection closes."""
    answer = await s.client.answer()
    answered = trio.current_time()
    assert answer.status == status and answer.headers["content-type"] == "application/json"
    assert answer.headers["connection"] == "close"
    assert await s.client.rest() == b""
    await s.closed.wait()
    doc = json.loads(answer.body)
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}
    return dict(doc["error"]), answered


async def test_a_malformed_request_line_gets_a_400_in_openai_shape(autojump_clock: Clock) -> None:
    async with serving(hello) as s:
        await s.client.send(b"NOT AN HTTP REQUEST\r\n\r\n")
        error, _ = await refused(s, 400)
    assert error["code"] == "invalid_request" and "not a valid HTTP/1.1 request" in error["message"]


async def test_a_head_over_the_limit_gets_a_431(autojump_clock: Clock) -> None:
    async with serving(hello) as s:
        await s.client.send(b"GET /v1/models HTTP/1.1\r\nx-big: " + b"a" * MAX_HEAD_BYTES + b"\r\n")
        error, _ = await refused(s, 431)
    assert error["message"].startswith("the request head is larger than")


async def test_a_70000_byte_head_gets_a_431(autojump_clock: Clock) -> None:
    # The report: 70,000 bytes, sent at once, read as 65,536 and the rest; the read that completed the
    # head was not counted, so the request reached the app.
    head = request("GET", "/v1/models", None, "x-big: " + "a" * 70_000)
    async with serving(hello) as s:
        await s.client.send(head)
        error, _ = await refused(s, 431)
    assert error["message"] == f"the request head is larger than {MAX_HEAD_BYTES} bytes"


async def test_a_large_head_under_the_limit_is_served(autojump_clock: Clock) -> None:
    head = request("GET", "/v1/models", None, "x-big: " + "a" * (MAX_HEAD_BYTES - 1024))
    async with serving(hello) as s:
        await s.client.send(head[:-1000])  # the limit holds for a head still incomplete
        await trio.testing.wait_all_tasks_blocked()
        await s.client.send(head[-1000:])
        assert (await s.client.answer()).status == 200


async def test_a_head_that_never_ends_gets_a_408_counted_from_its_first_byte(autojump_clock: Clock) -> None:
    async with serving(hello) as s:
        await trio.sleep(0.9 * T.gateway_first_request_s)  # idle before the first byte: not counted against the head
        began = trio.current_time()
        await s.client.send(b"GET /v1/models HTTP/1.1\r\nhost: te")
        error, answered = await refused(s, 408)
        assert answered - began == pytest.approx(T.gateway_head_s)
    assert error["code"] == "request_timeout"


async def test_a_new_connection_that_sends_nothing_closes_after_the_first_request_wait(
        autojump_clock: Clock) -> None:
    # Not after the keep-alive (75 s): a flood of silent connections would hold descriptors that long.
    assert T.gateway_first_request_s < T.gateway_keep_alive_s
    async with serving(hello) as s:
        await s.closed.wait()
        assert s.closed_at == pytest.approx(T.gateway_first_request_s)
        assert await s.client.rest() == b""  # closed without a word: nothing was asked


async def test_an_idle_kept_alive_connection_closes_after_the_keep_alive(autojump_clock: Clock) -> None:
    async with serving(hello) as s:
        await s.client.send(request("GET", "/v1/models"))
        await s.client.answer()
        answered = trio.current_time()
        assert await s.client.rest() == b""
        await s.closed.wait()
        assert s.closed_at - answered == pytest.approx(T.gateway_keep_alive_s)


# --- disconnects, as the app hears them ------------------------------------------------------------


async def test_a_body_stalled_midway_is_a_disconnect_after_the_body_idle(autojump_clock: Clock) -> None:
    heard: Heard = []
    async with serving(echo(heard)) as s:
        began = trio.current_time()
        await s.client.send(request("POST", "/v1/x", None, "content-length: 10") + b"abcd")
        await s.closed.wait()
    assert [m for _, m in heard] == [{"type": "http.request", "body": b"abcd", "more_body": True},
                                     {"type": "http.disconnect"}]
    assert heard[1][0] - began == pytest.approx(T.gateway_body_idle_s)


def watched(log: list[tuple[float, Exchange]], then: Callable[[Send], Any]) -> App:
    """Reads the body, then runs `then(send)` (the upstream call) under the gateway's disconnect watcher,
    noting when that call ended and how."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass
        ex = Exchange()
        with trio.CancelScope() as upstream:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_on_disconnect, receive, upstream, ex)
                await then(send)
        log.append((trio.current_time(), ex))

    return app


async def test_a_client_that_takes_nothing_is_dropped_and_the_upstream_call_cancelled(
        autojump_clock: Clock) -> None:
    async def stream_forever(send: Send) -> None:
        await send(start())
        while True:
            await send(body(b"x" * 65536, more=True))
            await trio.sleep(1)

    log: list[tuple[float, Exchange]] = []
    async with serving(watched(log, stream_forever), lockstep=True) as s:
        began = trio.current_time()
        await s.client.send(request("POST", "/v1/x", b"{}"))  # then reads nothing
        await s.closed.wait()
    (ended, ex), = log
    assert ex.disconnected and ended - began == pytest.approx(T.gateway_send_s)


async def test_a_client_closing_after_its_body_is_a_disconnect_at_once(autojump_clock: Clock) -> None:
    log: list[tuple[float, Exchange]] = []
    async with serving(watched(log, lambda send: trio.sleep_forever())) as s:
        await s.client.send(request("POST", "/v1/x", b"{}"))
        await trio.testing.wait_all_tasks_blocked()
        closed = trio.current_time()
        await s.client.stream.send_eof()
        await s.closed.wait()
    (ended, ex), = log
    assert ex.disconnected and ended == closed


# --- apps that fail -----------------------------------------------------------------------------


async def test_an_app_that_raises_before_answering_gets_a_500_and_a_close(autojump_clock: Clock) -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())  # a start alone is not yet an answer: the 500 replaces it
        raise RuntimeError("boom")

    async with serving(broken) as s:
        await s.client.send(request("GET", "/v1/models"))
        error, _ = await refused(s, 500)
    assert error["code"] == "internal_error"


async def test_an_answer_cut_short_closes_the_connection(autojump_clock: Clock) -> None:
    async def quitter(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        await send(body(b"partial", more=True))

    async with serving(quitter) as s:
        began = trio.current_time()
        await s.client.send(request("GET", "/v1/a") + request("GET", "/v1/b"))
        status, _ = await s.client.head()
        event = await s.client.event()
        assert status == 200 and type(event) is h11.Data and event.data == b"partial"
        assert (await s.client.rest()).strip() == b""  # (the chunk's CRLF) no last chunk, no second answer
        assert trio.current_time() == began  # closed at once, not kept for the keep-alive


async def test_an_unread_body_is_drained_after_the_answer_for_the_close_drain(autojump_clock: Clock) -> None:
    async def refuser(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start(413))
        await send(body(b"too large"))

    async with serving(refuser) as s:
        await s.client.send(request("POST", "/v1/x", None, "content-length: 1000000") + b"x" * 1000)
        assert (await s.client.answer("POST")).status == 413
        assert await s.client.rest() == b""  # the server's side ends (send_eof), its reading goes on
        answered = trio.current_time()
        for _ in range(10):  # so the client can still send: no reset destroys the answer on its way
            await s.client.send(b"x" * 10_000)
        await s.closed.wait()
        assert s.closed_at - answered == pytest.approx(T.gateway_close_drain_s)


# --- the connection's watcher (WATCH) ----------------------------------------------------------------------


async def body_read(receive: Receive) -> tuple[bytes, Exchange]:
    """The request's whole body, and its exchange (the body read: a disconnect may now be watched for)."""
    data = b""
    while (message := await receive())["type"] == "http.request":
        data += message["body"]
        if not message["more_body"]:
            break
    ex = Exchange()
    ex.body_done = True
    return data, ex


def watching(log: list[tuple[float, bool, bool]], wait_s: float = 1.0) -> App:
    """Reads the body, then answers after `wait_s` (an upstream call) under `cancelled_on_disconnect`, noting when
    the wait ended, whether the client went away and whether the server's watcher (not a task of its own) heard."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        data, ex = await body_read(receive)
        async with cancelled_on_disconnect(scope, receive, ex):
            await trio.sleep(wait_s)
            await send(start())
            ex.finished = True
            await send(body(b"answered " + data))
        log.append((trio.current_time(), ex.disconnected, WATCH in scope.get("extensions", {})))

    return app


async def test_the_watcher_hands_each_next_request_over_kept_alive_and_pipelined(autojump_clock: Clock) -> None:
    log: list[tuple[float, bool, bool]] = []
    async with serving(watching(log), watcher=True) as s:
        for n in (1, 2):  # one after the other: the watcher reads the next request's bytes, the connection serves it
            await s.client.send(request("POST", "/v1/x", f"body {n}".encode()))
            assert (await s.client.answer("POST")).body == f"answered body {n}".encode()
        # Pipelined: the next two come while the first watches; split, one of them mid-head.
        both = request("POST", "/v1/x", b"body 3") + request("POST", "/v1/x", b"body 4")
        await s.client.send(both[:-30])
        await trio.sleep(0.5)
        await s.client.send(both[-30:])
        assert (await s.client.answer("POST")).body == b"answered body 3"
        assert (await s.client.answer("POST")).body == b"answered body 4"
        assert not s.closed.is_set()
    assert [(gone, watched) for _, gone, watched in log] == [(False, True)] * 4


class _Steps(trio.abc.Instrument):
    """The names of the tasks that run, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


async def test_once_an_answer_is_out_the_next_request_is_read_by_the_connection_not_the_watcher(
        autojump_clock: Clock) -> None:
    # The watcher stops reading when no request watches any more, so a kept-alive client's next request wakes
    # the connection's task alone: handing its bytes over from the watcher cost a task switch and a scheduler
    # pass in every request's path (docs/performance.md, "The stream's first chunk").
    log: list[tuple[float, bool, bool]] = []
    steps = _Steps()
    async with serving(watching(log), watcher=True) as s:
        await s.client.send(request("POST", "/v1/x", b"first"))
        assert (await s.client.answer("POST")).body == b"answered first"
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(steps)
        await s.client.send(request("POST", "/v1/x", b"second"))
        await trio.testing.wait_all_tasks_blocked()  # the app has the body and waits in its upstream call
        trio.lowlevel.remove_instrument(steps)
        read = list(steps.names)
        assert (await s.client.answer("POST")).body == b"answered second"
    server = [name for name in read if name.endswith(("._watch", ".serving.<locals>.run"))]
    # The connection's task reads the request first (it serves it); the watcher runs only once the request watches.
    assert server[0].endswith(".serving.<locals>.run"), server


async def test_a_next_request_sent_as_the_answer_ends_is_read_by_the_connection_not_the_watcher(
        autojump_clock: Clock) -> None:
    # A client that sends its next request the moment an answer ends finds the app still finishing its request (the
    # request log's record, the lease's release). The watcher stops reading when the answer's end goes out, so those
    # bytes wait for the connection's own read: had it still been reading, it would have taken them and handed them
    # over, a task step more in the next request's path (docs/performance.md, "The stream's first chunk").
    finishing = trio.Event()  # set once the next request is sent: the app's request ends

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        data, ex = await body_read(receive)
        async with cancelled_on_disconnect(scope, receive, ex):
            await send(start())
            await send(body(b"answered " + data, more=True))
            ex.finished = True
            await send(body(b""))
            if data == b"first":
                await finishing.wait()

    steps = _Steps()
    async with serving(app, watcher=True) as s:
        await s.client.send(request("POST", "/v1/x", b"first"))
        assert (await s.client.answer("POST")).body == b"answered first"
        await trio.testing.wait_all_tasks_blocked()  # the app finishes its request: it waits
        trio.lowlevel.add_instrument(steps)
        await s.client.send(request("POST", "/v1/x", b"second"))
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.remove_instrument(steps)
        finishing.set()
        assert (await s.client.answer("POST")).body == b"answered second"
    # Nothing of the server ran while the first request was finishing: the bytes waited to be read.
    assert not [name for name in steps.names if name.endswith("._watch")], steps.names


async def test_bytes_waiting_says_whether_the_client_has_sent_what_is_not_read_yet() -> None:
    # When a request ends the watcher is stopped only if nothing waits on the socket: bytes already there are
    # its to hand over at once (stopping it first would cost more).
    a, b = trio.socket.socketpair()
    server, client = trio.SocketStream(a), trio.SocketStream(b)
    async with server, client:
        assert not _bytes_waiting(server)
        await client.send_all(b"GET / HTTP/1.1\r\n")
        with trio.fail_after(10):
            while not _bytes_waiting(server):  # (a socketpair's bytes are there at once; a loaded box may lag)
                await trio.sleep(0.001)
        assert await server.receive_some(100) == b"GET / HTTP/1.1\r\n"
        assert not _bytes_waiting(server)
    memory, _ = trio.testing.memory_stream_pair()
    assert not _bytes_waiting(memory)  # no socket: as if nothing waited


@pytest.mark.parametrize("watcher", [True, False])
async def test_a_request_whose_client_goes_away_is_cancelled_at_once(watcher: bool, autojump_clock: Clock) -> None:
    """By the server's watcher (`WATCH`); under a server without one (another ASGI server), `cancelled_on_disconnect`
    reads `receive` in a task of its own. A request that ended normally before ended that task."""
    for kept in (False, True):  # on the connection's first request, and on one after the watcher read a request
        log: list[tuple[float, bool, bool]] = []
        async with serving(watching(log, wait_s=100), watcher=watcher) as s:
            if kept:
                await s.client.send(request("POST", "/v1/x", b"first"))
                assert (await s.client.answer("POST")).body == b"answered first"
            await s.client.send(request("POST", "/v1/x", b"body"))
            await trio.sleep(1)
            began = trio.current_time()
            await s.client.stream.aclose()
            await s.closed.wait()
        assert [entry[1:] for entry in log[:-1]] == [(False, watcher)] * kept  # the first one answered
        assert log[-1] == (began, True, watcher), "cancelled at once, told as a disconnect"
