"""The gateway's call to an engine over one pooled HTTP/1.1 connection (llmgw/wire/http1.py): the request sent, the answer
read as it comes, under explicit timeouts; and sent once more when an engine dropped a reused connection.

The retry: llama.cpp's server closes an idle kept-alive connection on its own schedule; a request that
arrives on it just then gets no answer at all (seen in ~0.8% of requests at concurrency >= 2). Sending it
again is safe exactly then: the connection was reused (not opened for this request, so the engine is up),
no byte of an answer came back, and nothing has reached the client yet (`send` returns before the
gateway relays anything). The retry opens a new connection in the same pool slot.

`answer` goes further, across replicas: a request no byte of whose answer can have reached the client is
sent once to another replica when its own refused the connection, broke it before the answer's head (a
replica killed under load), or broke off an answer read whole; and it feeds each replica's circuit breaker.

Timeouts (llmgw/domain/timeouts.py): `upstream_connect_s` per connect, `upstream_write_s` for the request,
`upstream_first_byte_s` until the answer's head, `upstream_chunk_s` between two reads of its body; a model's
definition may set its own connect, first-byte and chunk timeouts (`ModelDef.timeouts`), which win for its requests.
"""

from __future__ import annotations

import logging

import trio

from llmgw.domain.model import NO_OVERRIDES, ModelTimeouts
from llmgw.domain.observed import Endpoint
from llmgw.errors import OpenAIError
from llmgw.gateway.pool import ConnectFailed, Connection, Limits, Overloaded, Pool, Ticket
from llmgw.gateway.router import Lease
from llmgw.wire.http1 import BadRequest, request_bytes

__all__ = ["Dropped", "Response", "UpstreamFailed", "UpstreamTimeout", "Whole", "answer", "failure", "send"]

_log = logging.getLogger("llmgw.gateway.upstream")
_READ = 65536


class UpstreamFailed(Exception):
    """The engine failed the request after the connection was made (502 `upstream_error`)."""


class Dropped(UpstreamFailed):
    """The connection was closed or reset under the request; `retryable` when it was a reused one and no
    byte of an answer had come back."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class UpstreamTimeout(UpstreamFailed):
    """The engine did not answer (or went silent mid-answer) within its timeout (504 `upstream_timeout`)."""


class Response:
    """An engine's answer: `status` and `headers` (names lower-case) now, the body read with `next_chunk`
    (or `read`). `close()` hands the connection back: kept alive when the answer was read to its end."""

    __slots__ = ("status", "headers", "_pool", "_conn", "_open", "_chunk_s")

    def __init__(self, pool: Pool, conn: Connection, status: int, headers: list[tuple[bytes, bytes]],
                 chunk_s: float | None = None) -> None:
        self.status = status
        self.headers = headers
        self._pool = pool
        self._conn = conn
        self._open = True
        self._chunk_s = pool.timeouts.upstream_chunk_s if chunk_s is None else chunk_s  # the model's, or the default

    async def next_chunk(self) -> bytes | None:
        """What of the body has come since the last call (the engine's chunks read so far, joined: a stream's
        events that arrived together go on in one write); None at its end. Raises UpstreamFailed."""
        if not self._open:
            return None
        conn = self._conn
        reader = conn.reader
        stream = conn.stream
        assert stream is not None
        try:
            while True:
                body = reader.body
                if body:
                    if len(body) == 1:
                        return body.popleft()
                    joined = b"".join(body)
                    body.clear()
                    return joined
                if reader.complete:
                    self.close(keep=True)
                    return None
                with trio.move_on_after(self._chunk_s) as waited:
                    data = bytes(await stream.receive_some(_READ))
                if waited.cancelled_caught:
                    raise UpstreamTimeout(f"the engine sent nothing for {self._chunk_s:g} s mid-answer")
                if not data:
                    if reader.until_close:  # its end, for an answer with neither a length nor chunks
                        self.close()
                        return None
                    raise UpstreamFailed("the engine's answer broke off: the engine closed the connection "
                                         "before the end of the answer")
                reader.feed(data)
        except BadRequest as error:
            self.close()
            raise UpstreamFailed(f"the engine's answer broke off: {error}") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self.close()
            raise Dropped(f"the connection broke mid-answer: {error or type(error).__name__}", False) from None
        except BaseException:
            self.close()  # cancelled (the client went away), timed out, or failed: this connection is done
            raise

    def at_end(self) -> bool:
        """Whether the whole answer is read: the next `next_chunk` returns None without waiting (a stream's last
        event and its end came in one read)."""
        if not self._open:
            return True
        reader = self._conn.reader
        return not reader.body and reader.complete

    async def read(self) -> bytes:
        """The whole body."""
        chunks = []
        while (chunk := await self.next_chunk()) is not None:
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self, keep: bool = False) -> None:
        """Hand the connection back (idempotent); kept alive only when `keep` and the exchange is complete."""
        if self._open:
            self._open = False
            self._pool.release(self._conn, keep)


async def send(
    pool: Pool, base_url: str, path: str, body: bytes, request_id: str, *, limit: int, queue: int | tuple[int, ...],
    waits: ModelTimeouts = NO_OVERRIDES, ticket: Ticket | None = None,
) -> Response:
    """POST `body` to `base_url + path` over a pooled connection and return the answer's head (the body
    is the caller's to read, then `close()`). Once more on a fresh connection when a reused one was
    dropped before answering. `waits`: the model's own timeouts, each None taking the pool's; `ticket`: the
    request's key and priority class, for its turn when every connection is busy (pool.py).
    Raises Overloaded, ConnectFailed (pool.py), or UpstreamFailed."""
    # An endpoint URL may carry a path (one server for many replicas, as `llmgw sim-fleet` runs):
    # the connection is the host's, the request goes under that path.
    prefix = base_url.split("://", 1)[-1].partition("/")[2].rstrip("/")
    path = f"/{prefix}{path}" if prefix else path
    connect_s = pool.timeouts.upstream_connect_s if waits.connect_s is None else waits.connect_s
    conn = await pool.acquire(base_url, limit, queue, ticket)
    try:
        if conn.stream is None:
            await conn.connect(connect_s)
        try:
            return await _exchange(pool, conn, path, body, request_id, waits)
        except Dropped as error:
            if not error.retryable:
                raise
            _log.info("engine at %s closed a kept-alive connection before answering; sending once more",
                      base_url.split("://", 1)[-1])
        await conn.connect(connect_s)
        return await _exchange(pool, conn, path, body, request_id, waits)
    except BaseException:
        pool.release(conn, keep=False)
        raise


async def _exchange(
    pool: Pool, conn: Connection, path: str, body: bytes, request_id: str, waits: ModelTimeouts
) -> Response:
    t = pool.timeouts
    first_byte_s = t.upstream_first_byte_s if waits.first_byte_s is None else waits.first_byte_s
    stream = conn.stream
    assert stream is not None
    reused = conn.reused
    wire = request_bytes(b"POST", path.encode(), [
        (b"host", conn.host_header),
        (b"content-type", b"application/json"),
        # Raw bytes are relayed as they come, so nothing may be compressed.
        (b"accept-encoding", b"identity"),
        (b"x-request-id", request_id.encode()),
    ], body)
    reader = conn.reader
    received = False
    written = False
    try:
        # One cancel scope for both waits (the request written, then the answer's head), its deadline moved
        # between them: a scope less on the way to the answer's first byte.
        with trio.CancelScope(deadline=trio.current_time() + t.upstream_write_s) as waiting:
            await stream.send_all(wire)
            written = True
            waiting.deadline = trio.current_time() + first_byte_s
            while not reader.status:  # (a 1xx head is passed over)
                data = bytes(await stream.receive_some(_READ))
                if not data:
                    raise Dropped("the engine closed the connection without sending a response",
                                  reused and not received)
                received = True
                reader.feed(data)
            return Response(pool, conn, reader.status, reader.headers, waits.chunk_s)
        if not written:
            raise UpstreamTimeout(f"the engine took no request within {t.upstream_write_s:g} s")
        raise UpstreamTimeout(f"the engine sent no answer within {first_byte_s:g} s")
    except BadRequest as error:
        raise UpstreamFailed(f"the engine's answer is not valid HTTP/1.1: {error}") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
        raise Dropped(f"the connection broke: {error or type(error).__name__}", reused and not received) from None


async def answer(
    pool: Pool, lease: Lease, endpoint: Endpoint, model: str, path: str, body: bytes, request_id: str, limits: Limits,
    waits: ModelTimeouts = NO_OVERRIDES, whole: bool = False, ticket: Ticket | None = None,
    slots: int | None = None,
) -> tuple[Response, Endpoint]:
    """The head of the answer of the replica `lease` holds (`whole`: the whole answer, read before it is
    returned), and that replica. Sent once more, to another replica of the model, when nothing can have
    reached the client yet: the replica refused the connection (it leaves the rotation: nothing was sent),
    the connection broke before the answer's head (the engine died or reset it: it answered nothing), or,
    for a `whole` answer, its body broke off (nothing of it is relayed before its end). Never after a
    timeout (a request that took that long is not worth doing twice). Each failure, and each 5xx answer,
    counts toward the replica's circuit breaker (router.py); an answer below 500 closes it. `waits`: the
    model's own upstream timeouts (its definition's); `slots`: its `limits.concurrency_per_replica` (None:
    `limits.connections`); `ticket`: the request's key and class (its turn when the replica's slots are
    busy: pool.py). Failures become the client's `OpenAIError`: 503 `overloaded`, 502
    `upstream_unavailable` or `upstream_error`, 504 `upstream_timeout`."""
    limit = limits.connections if slots is None else slots
    for last in (False, True):
        try:
            response = await send(pool, endpoint.url, path, body, request_id, limit=limit,
                                  queue=limits.queues, waits=waits, ticket=ticket)
        except Overloaded as error:
            raise OpenAIError(503, "overloaded", f"replica {endpoint.replica_id} of model {model!r} is at its limit "
                                                 f"for priority class {error.priority} ({error}: "
                                                 "gateway.queue_per_class); retry later") from None
        except ConnectFailed as error:
            _log.warning("replica %s of model %s cannot be reached: %s", endpoint.replica_id, model, error)
            other = lease.refused(move=not last)
            if other is None:
                raise OpenAIError(502, "upstream_unavailable",
                                  f"replica {endpoint.replica_id} of model {model!r} cannot be reached") from None
            endpoint = other
            continue
        except Dropped as error:  # before the answer's head: the engine answered nothing
            lease.failed(f"the connection broke before the answer ({error})", limits.breaker_failures)
            if not last and (other := _moved(lease, endpoint, model, "answered nothing", error)) is not None:
                endpoint = other
                continue
            raise failure(endpoint, model, error) from None
        except UpstreamFailed as error:  # timed out, or not HTTP
            lease.failed(str(error), limits.breaker_failures)
            raise failure(endpoint, model, error) from None
        lease.reached()
        if response.status >= 500:
            lease.failed(f"the engine answered HTTP {response.status}", limits.breaker_failures)
        else:
            lease.answered()
        if not whole:
            return response, endpoint
        chunks: list[bytes] = []
        try:
            while (chunk := await response.next_chunk()) is not None:
                chunks.append(chunk)
        except UpstreamTimeout as error:
            lease.failed(str(error), limits.breaker_failures)
            raise failure(endpoint, model, error) from None
        except UpstreamFailed as error:
            lease.failed(str(error), limits.breaker_failures)
            if not last and (other := _moved(lease, endpoint, model, "broke off its answer", error)) is not None:
                endpoint = other
                continue
            raise failure(endpoint, model, error) from None
        finally:
            response.close()
        return Whole(response.status, response.headers, chunks), endpoint
    raise AssertionError("unreachable")  # the loop returns or raises


def _moved(lease: Lease, endpoint: Endpoint, model: str, what: str, error: UpstreamFailed) -> Endpoint | None:
    """Another replica of the model for a request `endpoint` failed before anything reached the client (None:
    there is none), said in the log."""
    other = lease.move()
    if other is not None:
        _log.warning("replica %s of model %s %s (%s): sending the request to replica %s", endpoint.replica_id,
                     model, what, error, other.replica_id)
    return other


class Whole(Response):
    """An answer read to its end before anything of it is relayed (`answer(whole=True)`): its chunks replayed."""

    __slots__ = ("_chunks",)

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> None:
        # No connection of its own: it went back to the pool when the answer was read.
        self.status = status
        self.headers = headers
        self._chunks = chunks[::-1]

    async def next_chunk(self) -> bytes | None:
        return self._chunks.pop() if self._chunks else None

    def at_end(self) -> bool:
        return not self._chunks

    def close(self, keep: bool = False) -> None:
        self._chunks = []


def failure(endpoint: Endpoint, model: str, error: UpstreamFailed, mid_stream: bool = False) -> OpenAIError:
    """An engine's failure in the client's words (502 `upstream_error`, 504 `upstream_timeout`), logged."""
    when = " mid-stream" if mid_stream else ""
    _log.warning("replica %s of model %s failed%s: %s", endpoint.replica_id, model, when, error)
    if isinstance(error, UpstreamTimeout):
        return OpenAIError(504, "upstream_timeout", f"replica {endpoint.replica_id} of model {model!r}: {error}")
    return OpenAIError(502, "upstream_error", f"replica {endpoint.replica_id} of model {model!r} failed{when}")
