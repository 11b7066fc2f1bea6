"""The lean HTTP/1.1 server (trio + httptools) that serves the raw `/v1` apps (the gateway, the sim engine).
Owns listening sockets (`SO_REUSEPORT` for workers), keep-alive, the client's disconnect and a graceful stop.

Why not hypercorn here: per request it runs several tasks and event objects around h11, and writes the
head and body of an answer separately; measured, that was most of the gateway's CPU (docs/performance.md).
The bytes themselves are parsed and written by `llmgw/wire/http1.py`.
This server runs one task per connection, hands the app the subset of ASGI our two apps use, writes a
whole answer with one `send_all`, and reads the socket during a request only when the app asks: its
`receive`, or the connection's watcher (`WATCH`: a second task per connection, not one per request, that
hears the client go away and hands the next request over). The admin API and the console stay on hypercorn.

Hostile clients: a new connection must send its first byte within `gateway_first_request_s`, a kept-alive
one its next request within `gateway_keep_alive_s`; a head must arrive whole within `gateway_head_s` of its
first byte and stay under `MAX_HEAD_BYTES` (every byte counted); a body stalled `gateway_body_idle_s` counts
as a disconnect; a client that takes no bytes of its answer for `gateway_send_s` is dropped. Malformed HTTP
gets a JSON error and a close. How many connections it holds, in all and per address, is its gate's
(`llmgw/wire/gate.py`): a connection waiting for a request is idle there, the first closed to make room.
"""

from __future__ import annotations

import email.utils
import logging
import select
import socket as stdlib_socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any
from urllib.parse import unquote_to_bytes

import trio

from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import OpenAIError
from llmgw.wire.asgi import MAX_BODY_BYTES, WATCH, Message, Receive, Scope, Send, dumps
from llmgw.wire.gate import ConnectionGate, Slot, accept_loop
from llmgw.wire.http1 import BODY, END, HEAD, LAST_CHUNK, BadRequest, Head, RequestReader, chunk, response_head

__all__ = ["MAX_HEAD_BYTES", "Front", "adopt_socket", "listen_socket"]

_log = logging.getLogger("llmgw.front")

App = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_HEAD_BYTES = 64 * 1024  # request line and headers together
_READ = 65536
_PIPELINED_MAX = 256 * 1024  # bytes of a next request buffered while one is served; beyond, stop reading
# Read (and drop) at most this much of an unread body before closing: any body the apps accept, so the client
# of a refusal can send all of it and read its answer (1 MiB reset a 4 MiB sender mid-body).
_CLOSE_DRAIN_BYTES = MAX_BODY_BYTES


BACKLOG = 2048


async def listen_socket(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> trio.socket.SocketType:
    """A listening TCP socket on host:port (a name, an IPv4 or an IPv6 address; port 0: any free one).

    `reuse_port`: several processes listen on one port and the kernel spreads connections among them.
    `listen=False`: bound only (the port is held, no connection comes in) until `sock.listen(BACKLOG)`."""
    infos = await trio.socket.getaddrinfo(host or None, port, type=stdlib_socket.SOCK_STREAM,
                                          flags=stdlib_socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = trio.socket.socket(family, kind, proto)
    try:
        sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_REUSEPORT, 1)
        if family == stdlib_socket.AF_INET6:
            sock.setsockopt(stdlib_socket.IPPROTO_IPV6, stdlib_socket.IPV6_V6ONLY, 1)
        await sock.bind(address)
        # The default backlog would drop the SYNs of a burst of new clients (they retry after 1 s, 3 s...);
        # the kernel caps it at net.core.somaxconn.
        if listen:
            sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def adopt_socket(fd: int) -> trio.socket.SocketType:
    """The listening TCP socket a previous program of this process left open at descriptor `fd` (a restart
    in place), taken over as it is: still listening, its queued connections kept. ValueError when `fd` is
    not a listening TCP socket."""
    try:
        sock = stdlib_socket.socket(fileno=fd)
    except OSError as e:
        raise ValueError(f"descriptor {fd} is not a socket: {e}") from None
    if sock.type != stdlib_socket.SOCK_STREAM or not sock.getsockopt(stdlib_socket.SOL_SOCKET,
                                                                     stdlib_socket.SO_ACCEPTCONN):
        sock.detach()  # not ours to close
        raise ValueError(f"descriptor {fd} is not a listening TCP socket")
    sock.set_inheritable(False)  # (an engine or worker started from here must not hold it)
    return trio.socket.from_stdlib_socket(sock)


def _bytes_waiting(stream: trio.abc.Stream) -> bool:
    """Whether bytes from the client wait to be read on the connection's socket (False when it has none:
    the memory streams of tests)."""
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)  # (under TLS: the socket's)
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class _Date:
    """The `date` header, formatted once a second rather than per answer."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


class _Connection:
    """One client connection: the ASGI `receive` and `send` of its current request, and its parser."""

    __slots__ = ("front", "stream", "slot", "reader", "peer", "status", "head", "head_only", "body_done", "gone",
                 "sent_head", "finished", "close_after", "chunked", "http10", "continue_pending", "buffered",
                 "extensions", "_tasks", "_watcher", "_watching", "_on_gone", "_reading", "_kick", "_stopped",
                 "_handed", "_read")

    def __init__(self, front: Front, stream: trio.abc.Stream, slot: Slot) -> None:
        self.front = front
        self.stream = stream
        self.slot = slot
        self.reader = RequestReader(MAX_HEAD_BYTES)
        self.peer = slot.peer  # (None over the memory streams of tests)
        # The watcher (see `watch`): the nursery it runs in (the server's; None: not offered, as when a test
        # serves one connection alone), whether it was started, and its scope, cancelled when the connection ends.
        self._tasks = front.connections_nursery
        self.extensions: dict[str, Any] = {} if self._tasks is None else {WATCH: self.watch}
        self._watcher = False
        self._watching = trio.CancelScope()
        self._on_gone: Callable[[], None] | None = None  # the watching request's: called when the client goes
        self._reading = False  # the watcher reads the socket now: nothing else may
        self._kick = trio.Event()  # set: the watcher starts reading
        self._stopped = trio.Event()  # set (then replaced) each time the watcher stops reading
        self._handed: bytes | Exception | None = None  # what it read when no request was watching any more
        self._read: trio.CancelScope | None = None  # the watcher's read, while it reads
        self._reset(None)

    def _reset(self, request: Head | None) -> None:
        self.status = 0
        self.head: list[tuple[bytes, bytes]] | None = None
        self.head_only = request is not None and request.method == b"HEAD"
        self.body_done = request is None  # (no request: nothing of a body is owed)
        self.gone = False
        self.sent_head = False
        self.finished = False
        self.close_after = request is not None and not request.keep_alive
        self.chunked = False
        self.http10 = request is not None and request.version == "1.0"
        self.continue_pending = request is not None and request.expects_continue
        self.buffered = 0

    # --- the ASGI side ------------------------------------------------------------------

    def watch(self, on_gone: Callable[[], None] | None) -> bool:
        """The `WATCH` extension: call `on_gone` when the client goes away (its socket ends or breaks) until
        `watch(None)`; False (nothing watched) before the request's body is read. What `receive` after the body
        does in a task of the app's (`cancel_on_disconnect`), without a task per request: a task of the
        connection's reads for whichever request watches, and once none does, hands what it reads next (the next
        request) over to the connection's own reads (`_recv`). Starting and cancelling a task per request cost
        more than the rest of the gateway's own work on a request (docs/performance.md, "The stream's first
        chunk")."""
        if on_gone is None:
            self._on_gone = None
            return True
        if not self.body_done or self._tasks is None:
            return False
        if self._handed is not None:  # what the watcher read after the last request (a pipelined one's bytes)
            handed, self._handed = self._handed, None
            if isinstance(handed, Exception) or not handed:
                self.gone = True
            else:
                try:
                    self.reader.feed(handed)
                    self.buffered += len(handed)
                except BadRequest:  # not HTTP: answer this request, then close (as `receive` would)
                    self.close_after = True
                    return True
        if self.gone:
            on_gone()
            return True
        self._on_gone = on_gone
        if not self._reading and self.buffered <= _PIPELINED_MAX:
            self._reading = True  # from now on, until it stops, the socket is the watcher's to read
            if not self._watcher:
                self._watcher = True
                self._tasks.start_soon(self._watch)
            self._kick.set()
        return True

    def _unwatch(self) -> None:
        """The answer's end goes out now: a disconnect has nothing left to cancel. The watcher stops reading unless
        bytes wait (a pipelined request's, its to hand over): a client that sends its next request the moment the
        end arrives finds the connection's own read waiting for it, not the watcher's, which would hand the bytes
        over from one task to the other (a task step more before the next answer could begin)."""
        self._on_gone = None
        if self._read is None and self._reading:  # asked to read, not reading yet (its task has not run): it will not
            self._reading = False
        else:
            self._stop_reading()

    def _stop_reading(self) -> None:
        """Stop the watcher's read, unless bytes wait: they are its to hand over (stopping it first would cost more)."""
        read = self._read
        if read is not None and not read.cancel_called and not _bytes_waiting(self.stream):
            read.cancel()

    async def _watch(self) -> None:
        with self._watching:
            while True:
                await self._kick.wait()
                self._kick = trio.Event()
                if not self._reading:  # the answer ended before this task ran (`_unwatch`)
                    continue
                try:
                    with trio.CancelScope() as self._read:
                        await self._watch_once()
                finally:
                    self._read = None
                    self._reading = False
                    stopped, self._stopped = self._stopped, trio.Event()
                    stopped.set()

    async def _watch_once(self) -> None:
        """Read for the watching request, as `receive` after the body does; once none watches, what comes is
        handed over (to `_recv`) and reading stops."""
        while True:
            failed: Exception | None = None
            try:
                data = bytes(await self.stream.receive_some(_READ))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                data, failed = b"", error
            on_gone = self._on_gone
            if on_gone is None:  # no request watches: the next request's bytes, or the end
                self._handed = data if failed is None else failed
                return
            if not data:
                self.gone = True
                self._on_gone = None
                on_gone()
                return
            try:
                self.reader.feed(data)
            except BadRequest:  # what follows is not HTTP: answer this request, then close
                self.close_after = True
                return
            self.buffered += len(data)
            if self.buffered > _PIPELINED_MAX:
                return  # no more reading until this answer is out

    async def _recv(self) -> bytes | None:
        """The client's next bytes; None when the watcher was reading and fed what it read (the reader's events
        are to be looked at again). Raises trio.BrokenResourceError, trio.ClosedResourceError."""
        if self._reading:
            if self._on_gone is None:
                # No request watches: unless the client has sent something, the watcher stops (an answer's end may
                # have stopped it already: `_unwatch`), and the next request's bytes are read here, waking this task
                # alone rather than the watcher to hand them over (a task switch and a scheduler pass more before
                # the next answer could begin).
                self._stop_reading()
            while self._reading:
                await self._stopped.wait()
            if self._handed is None:
                return None
        handed, self._handed = self._handed, None
        if handed is not None:
            if isinstance(handed, Exception):
                raise handed
            return handed
        return bytes(await self.stream.receive_some(_READ))

    async def receive(self) -> Message:
        if self.gone:
            return {"type": "http.disconnect"}
        if not self.body_done:
            return await self._body()
        # The body is read: what remains to hear is the client going away (or its next request, kept).
        try:
            while True:
                data = await self._recv()
                if data is None:
                    continue
                if not data:
                    break
                self.reader.feed(data)
                self.buffered += len(data)
                if self.buffered > _PIPELINED_MAX:
                    await trio.sleep_forever()  # no more reading until this answer is out
        except BadRequest:  # what follows is not HTTP: answer this request, then close
            self.close_after = True
            await trio.sleep_forever()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.gone = True
        return {"type": "http.disconnect"}

    async def _body(self) -> Message:
        if self.continue_pending:
            self.continue_pending = False
            await self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        events = self.reader.events
        try:
            while True:
                if events:
                    kind, value = events.popleft()
                    if kind == END:
                        self.body_done = True
                        return {"type": "http.request", "body": b"", "more_body": False}
                    parts = [value]
                    # A small body usually came whole with its head: say "no more" in the same message.
                    while events and events[0][0] == BODY:
                        parts.append(events.popleft()[1])
                    if events and events[0][0] == END:
                        events.popleft()
                        self.body_done = True
                    body = parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[arg-type]
                    return {"type": "http.request", "body": body, "more_body": not self.body_done}
                with trio.move_on_after(self.front.timeouts.gateway_body_idle_s):
                    data = await self._recv()
                    if data is None:
                        continue
                    if not data:
                        break  # the client closed mid-body
                    self.reader.feed(data)
                    continue
                break  # stalled mid-body: taken for gone
        except (BadRequest, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.gone = self.body_done = True
        self.close_after = True
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.head = [(bytes(n).lower(), bytes(v)) for n, v in message.get("headers", ())]
            return
        if kind != "http.response.body" or self.finished:
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        wire = b""
        if not self.sent_head:
            if self.head is None:
                raise RuntimeError("http.response.body before http.response.start")
            headers = self.head
            if not any(n == b"content-length" for n, _ in headers):
                if not more:
                    headers.append((b"content-length", str(len(body)).encode()))
                elif self.http10:
                    self.close_after = True  # no chunks for HTTP/1.0: the close ends the body
                else:
                    self.chunked = True
                    headers.append((b"transfer-encoding", b"chunked"))
            if self.front.closing or self.close_after:
                headers.append((b"connection", b"close"))
                self.close_after = True  # told: the client does not send on it again
            elif self.http10:
                headers.append((b"connection", b"keep-alive"))
            headers.append((b"date", self.front.date()))
            if self.front.server_header:
                headers.append((b"server", self.front.server_header))
            self.sent_head = True
            wire = response_head(self.status, headers)
        if body and not self.head_only:
            wire += chunk(body) if self.chunked else body
        if not more:
            self.finished = True
            if self.chunked and not self.head_only:
                wire += LAST_CHUNK
            if self._on_gone is not None:
                self._unwatch()
        if wire:
            await self._write(wire)

    async def _write(self, wire: bytes) -> None:
        if self.gone:
            return
        try:
            with trio.move_on_after(self.front.timeouts.gateway_send_s) as writing:
                await self.stream.send_all(wire)
            if not writing.cancelled_caught:
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        # The client is gone or takes nothing: close, which also wakes a task waiting in `receive`.
        self.gone = True
        self.close_after = True
        await trio.aclose_forcefully(self.stream)

    # --- the connection's life --------------------------------------------------------------

    async def run(self, app: App) -> None:
        first = True
        try:
            while True:
                request = await self._next_request(first)
                if request is None:
                    return
                first = False
                await self._serve(app, request)
                if self.gone or self.close_after or not self.finished:
                    return
                if self.front.closing and not self.front.handing_over:
                    return
                # Handing over: this answer did not say `Connection: close` (its head went out before the
                # drain began), so its client may send on it now; it waits as an idle one (see _next_request).
                if not self._skip_body():
                    return  # the app left a body unread that is still on the wire: no next request here
        finally:
            try:
                await self._close()
            finally:
                self._watching.cancel()

    def _skip_body(self) -> bool:
        """Drop what is buffered of the current request's body (a GET's empty one, which the app had no
        reason to read); False when some of it is still to come."""
        events = self.reader.events
        while not self.body_done and events:
            if events.popleft()[0] == END:
                self.body_done = True
        return self.body_done

    async def _next_request(self, first: bool) -> Head | None:
        """The next request's head; None when the client closed, went quiet, or sent no valid HTTP."""
        events = self.reader.events
        timeouts = self.front.timeouts
        gate, slot = self.front.gate, self.slot
        deadline: float | None = None  # set by the head's first byte
        try:
            while True:
                if events:
                    kind, value = events.popleft()
                    if kind == HEAD:
                        return value  # type: ignore[return-value]
                    continue
                if deadline is None and not self.reader.in_head:
                    if self.front.closing and not self.front.handing_over:
                        return None
                    # Idle: the gate may close it to make room (its socket closed: ClosedResourceError).
                    wait = timeouts.gateway_first_request_s if first else timeouts.gateway_keep_alive_s
                    if self.front.closing:  # handing over: closed once no client would send on it any more
                        wait = min(wait, timeouts.gateway_drain_idle_s)
                    with trio.move_on_after(wait) as idle:
                        slot.scope = idle
                        slot.idle_since = trio.current_time()
                        gate.rest(slot)
                        try:
                            data = await self._recv()
                        finally:
                            slot.scope = None
                            gate.wake(slot)
                    if idle.cancelled_caught:
                        return None
                    if data is None:  # the watcher stopped, or fed what it read: no head has begun unless the
                        continue      # reader says so (then the head's deadline is set below)
                    deadline = trio.current_time() + timeouts.gateway_head_s
                else:
                    if deadline is None:
                        deadline = trio.current_time() + timeouts.gateway_head_s
                    with trio.move_on_at(deadline) as heading:
                        data = await self._recv()
                    if heading.cancelled_caught:
                        await self._refuse(408, "request_timeout", "the request head did not arrive in time")
                        return None
                if data is None:
                    continue
                if not data:
                    return None
                self.reader.feed(data)
        except BadRequest as error:
            await self._refuse(error.status, "invalid_request", str(error))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return None

    async def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer a request that never reached the app (malformed, too large, too slow), then close."""
        self._reset(None)
        body = dumps(OpenAIError(status, code, message).doc())
        self.status, self.head = status, [(b"content-type", b"application/json"), *self.front.request_id()]
        self.close_after = True
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    async def _serve(self, app: App, request: Head) -> None:
        self._reset(request)
        method = request.method.decode("ascii")
        raw_path, _, query = request.target.partition(b"?")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.version,
            "method": method,
            "scheme": "http",
            "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": request.headers,
            "client": self.peer,
            "server": self.front.bound,
            "extensions": self.extensions,
        }
        try:
            await app(scope, self.receive, self.send)
        except Exception:
            _log.exception("the app failed: %s %s", method, raw_path.decode("ascii", "replace"))
            if not self.sent_head and not self.gone:
                self.status, self.head = 500, [(b"content-type", b"application/json"), *self.front.request_id()]
                self.close_after = True
                body = dumps(OpenAIError(500, "internal_error", "the server failed; see its log").doc())
                await self.send({"type": "http.response.body", "body": body, "more_body": False})
        if not self.finished:
            self.close_after = True  # an answer cut short: the connection cannot carry another

    async def _close(self) -> None:
        """Close the connection; a client still sending gets its answer before the close (closing a socket
        with unread bytes would send a reset, which can destroy the answer on its way)."""
        if self.gone or (self.body_done and not self.reader.in_head):
            await trio.aclose_forcefully(self.stream)
            return
        try:
            with trio.move_on_after(self.front.timeouts.gateway_close_drain_s):
                if isinstance(self.stream, trio.abc.HalfCloseableStream):  # TLS has no half-close: drain, then close
                    await self.stream.send_eof()
                seen = 0
                while seen < _CLOSE_DRAIN_BYTES and (data := await self._recv()) != b"":
                    seen += len(data or b"")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:  # cancelled too (the stop's grace ran out): the socket is closed now, not when collected
            await trio.aclose_forcefully(self.stream)


class Front:
    """Serves one app on listening sockets. `serve` runs until cancelled or `shutdown_trigger` returns;
    then it stops accepting, closes idle connections, and gives busy ones `gateway_shutdown_grace_s`.

    Handing over (`serve(hand_over=...)`, a restart in place): those listening sockets stay open for the
    program that runs next (connections that arrive meanwhile wait in the kernel's queue: closing a
    listener would reset them), every answer from then on says `Connection: close`, and a kept-alive
    connection is closed only once it has been idle `gateway_drain_idle_s` (a client that sent a request
    on it meanwhile gets its answer; closing it at once would race that request); busy ones get
    `gateway_restart_drain_s`."""

    def __init__(self, app: App, *, timeouts: Timeouts = TIMEOUTS, server_header: bytes = b"llmgw",
                 new_id: Callable[[], str] | None = None, gate: ConnectionGate | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.app = app
        # Every connection speaks TLS with this context (its handshake within `gateway_first_request_s`),
        # unless its listener was added with its own (`add`); None: plain HTTP (a listener on loopback).
        self.tls = tls
        self.new_id = new_id  # names the answers this server gives itself (`x-request-id`), as the app's
        self.timeouts = timeouts
        self.server_header = server_header
        self.closing = False
        self.handing_over = False  # closing for a restart in place (see the class's docstring)
        self.stopped = False  # the stop `shutdown_trigger` asked for ran to its end (not cut by a cancel)
        # Which connections it holds, which are idle (waiting for a request); None: no limits (the sim engine).
        self.gate = gate if gate is not None else ConnectionGate("gateway", log_every_s=timeouts.listener_limit_log_s)
        self.date = _Date()
        self.bound: tuple[str, int] | None = None
        self.connections = 0
        self._all_closed = trio.Event()
        self._listeners: list[trio.SocketListener] = []
        self._acceptors: trio.Nursery | None = None
        self._connections: trio.Nursery | None = None

    @property
    def connections_nursery(self) -> trio.Nursery | None:
        """Where connections' tasks run while `serve` runs (None before, or for a connection a test serves)."""
        return self._connections

    async def serve(
        self,
        sockets: list[trio.socket.SocketType] | list[tuple[trio.socket.SocketType, ssl.SSLContext | None | bool]],
        *,
        shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
        hand_over: Sequence[trio.socket.SocketType] = (),
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """`hand_over`: when `shutdown_trigger` returns, these listening sockets are left open (not accepted
        on any more) for the next program, and the stop is a patient drain (see the class's docstring)."""
        async with trio.open_nursery() as connections:
            accepting = trio.CancelScope()

            async def accept_all(*, task_status: trio.TaskStatus[trio.Nursery]) -> None:
                with accepting:
                    async with trio.open_nursery() as acceptors:
                        task_status.started(acceptors)
                        await trio.sleep_forever()

            self._acceptors = await connections.start(accept_all)
            self._connections = connections
            for item in sockets:  # a socket, or (socket, its own TLS context: see `add`)
                sock, tls = item if isinstance(item, tuple) else (item, True)
                self.add(sock, tls=tls)
            task_status.started()
            if shutdown_trigger is None:
                await trio.sleep_forever()
            await shutdown_trigger()
            # Stop: no new connections, idle ones closed now (handing over: once no client would send on them),
            # busy ones after their answer (or the grace).
            self.closing = True
            self.handing_over = bool(hand_over)
            accepting.cancel()
            for listener in self._listeners:
                if not any(listener.socket is kept for kept in hand_over):
                    await listener.aclose()
            for slot in self.gate.idle_slots():
                if slot.scope is None:  # (one not yet waiting sees `closing` first)
                    continue
                if self.handing_over:  # closed once idle long enough that no client sends on it any more
                    slot.scope.deadline = min(slot.scope.deadline, slot.idle_since + self.timeouts.gateway_drain_idle_s)
                else:
                    slot.scope.cancel()
            grace = self.timeouts.gateway_restart_drain_s if hand_over else self.timeouts.gateway_shutdown_grace_s
            with trio.move_on_after(grace):
                if self.connections:
                    await self._all_closed.wait()
            self.stopped = True
            if self.connections:
                _log.warning("%d connection(s) still busy %g s after the stop began: cut", self.connections, grace)
            connections.cancel_scope.cancel()

    def request_id(self) -> list[tuple[bytes, bytes]]:
        """The `x-request-id` header of an answer this server gives itself (none without `new_id`)."""
        return [] if self.new_id is None else [(b"x-request-id", self.new_id().encode())]

    def add(self, sock: trio.socket.SocketType, *, tls: ssl.SSLContext | None | bool = True) -> None:
        """Accept connections on one more listening socket (once `serve` has started); `tls`: this
        listener's own context (None: plain), True: the server's."""
        context = self.tls if tls is True else (tls or None)
        assert self._acceptors is not None and self._connections is not None, "add() before serve() started"
        if self.bound is None:
            host, port = sock.getsockname()[:2]
            self.bound = (host, port)
        listener = trio.SocketListener(sock)
        self._listeners.append(listener)
        self._acceptors.start_soon(accept_loop, listener, self.gate, self._connections,
                                   partial(self._connection, tls=context), self.timeouts.gateway_accept_retry_s)

    async def _handshake(self, stream: trio.abc.HalfCloseableStream,
                         context: ssl.SSLContext) -> trio.SSLStream[Any] | None:
        """The connection's TLS, or None (closed) when its handshake fails or takes too long: in this
        task, so the client's certificate is what `llmgw.trust.tls.peer_certificate()` reads here."""
        tls = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
        try:
            with trio.fail_after(self.timeouts.gateway_first_request_s):
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            await trio.aclose_forcefully(stream)
            return None
        return tls

    async def _connection(self, stream: trio.abc.HalfCloseableStream, slot: Slot | None = None, *,
                          tls: ssl.SSLContext | None = None) -> None:
        """Serve one connection (`slot`: its place in the gate, taken when accepted; tests pass none)
        over TLS with `tls` (None: plain)."""
        if slot is None:
            slot = self.gate.admit(stream)
            if slot is None:
                await trio.aclose_forcefully(stream)
                return
        self.connections += 1
        try:
            served: trio.abc.Stream = stream
            if tls is not None:
                secured = await self._handshake(stream, tls)
                if secured is None:
                    return
                served = secured
            await _Connection(self, served, slot).run(self.app)
        finally:
            self.gate.release(slot)
            self.connections -= 1
            if not self.connections and self.closing:
                self._all_closed.set()
