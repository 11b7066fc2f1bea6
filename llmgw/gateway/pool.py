"""The gateway's upstream connections: one pool per engine endpoint, each a free-list of kept-alive HTTP/1.1
connections (trio streams + llmgw/wire/http1.py), a limit on how many are open and a bounded queue of requests waiting for one.

Why not httpx/httpcore: httpcore's pool scans every connection for every request (its cost grows with the
number of requests in flight: at 256 concurrent requests half the gateway's CPU went there), and a call
through httpx costs ~0.8 ms of CPU against ~0.3 ms for bare h11, less with httptools (docs/performance.md). Here an acquire
pops the most recently released connection (O(1)), a release pushes it back (O(1)), and the counters in
`PoolStats` say so (`examined` per acquire: at most one connection, plus each expired one dropped once).

Over the limit (a replica's slots: its model's `limits.concurrency_per_replica`, else the setting) a request
waits in its endpoint's fair queue (gateway/fairqueue.py): by priority class, and within a class by turns
across keys, each step O(1) (`promoted` counts the moves up a class: at most three per request). Past its
class's bound it is refused at once (`Overloaded`, the gateway's 503 `overloaded`), never left to a client's
timeout. A request that holds a connection keeps it to its end: nothing is preempted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from llmgw.domain.priority import CLASSES, DEFAULT, RANK
from llmgw.domain.settings import effective
from llmgw.gateway.fairqueue import Entry, FairQueue, Full
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.net import url_host
from llmgw.wire.gate import raise_fd_limit
from llmgw.wire.http1 import ResponseReader

__all__ = [
    "ConnectFailed",
    "Connection",
    "Limits",
    "LimitsReader",
    "Overloaded",
    "Pool",
    "PoolStats",
    "Ticket",
    "raise_fd_limit",
    "split_url",
]


class Overloaded(Exception):
    """The endpoint's connections are all busy and its queue is full for the request's class: refuse now
    (503 `overloaded`); `priority` names the class."""

    def __init__(self, message: str, priority: str = DEFAULT) -> None:
        super().__init__(message)
        self.priority = priority


@dataclass(slots=True)
class Ticket:
    """Whose request asks for a connection and in which class (its rank in CLASSES); the pool writes how
    long it waited for one (`waited`, seconds: 0 when one was free; below 0 while it has not asked; the sum
    of its waits when it asked again, on another replica)."""

    key: str = ""
    rank: int = RANK[DEFAULT]
    waited: float = -1.0


class ConnectFailed(Exception):
    """No connection to the endpoint could be opened (refused, unreachable, or past `upstream_connect_s`);
    nothing of the request was sent, so another replica may take it."""


@dataclass
class PoolStats:
    """What the pool has done, counted (never timed): the proof that its work per request is constant."""

    acquires: int = 0
    examined: int = 0  # connections looked at by acquires (reused, or dropped as expired)
    opened: int = 0
    reused: int = 0
    queued: int = 0  # acquires that waited for a connection
    overloaded: int = 0  # acquires refused with the queue full
    promoted: int = 0  # waiting requests moved up a class (fairqueue.py: at most three per request)


@dataclass(frozen=True)
class Limits:
    """In each gateway: per replica, connections open at most and requests waiting at most beyond them
    (`class_queue`: per priority class, highest first; () = `queue` for each); per model, requests waiting
    at most for its activation (no replica ready); failed requests in a row that open a replica's circuit
    breaker; prefix affinity's ε."""

    connections: int
    queue: int
    activation_queue: int = 256
    breaker_failures: int = 5
    affinity_load_factor: float = 0.25  # ε of prefix affinity's bounded load (gateway/affinity.py)
    class_queue: tuple[int, ...] = ()

    @property
    def queues(self) -> tuple[int, ...]:
        return self.class_queue or (self.queue,) * len(CLASSES)


class LimitsReader:
    """The limits in force from a table's settings, read again only when the settings mapping changes
    (a table is immutable: the same object means the same values), so a request pays one identity check."""

    __slots__ = ("_seen", "_limits")

    def __init__(self) -> None:
        self._seen: object = None
        self._limits = Limits(1, 1)

    def __call__(self, settings: Mapping[str, Any]) -> Limits:
        if settings is not self._seen:
            queue = effective(settings, "gateway.upstream_queue_per_replica")
            per_class = effective(settings, "gateway.queue_per_class")
            self._limits = Limits(effective(settings, "gateway.upstream_connections_per_replica"), queue,
                                  effective(settings, "gateway.activation_queue_per_model"),
                                  effective(settings, "gateway.breaker_failures"),
                                  float(effective(settings, "gateway.affinity_load_factor")),
                                  tuple(int(per_class.get(name, queue)) for name in CLASSES))
            self._seen = settings
        return self._limits


def split_url(base_url: str) -> tuple[str, int]:
    """`http://host:port` (or `http://[::1]:port`) -> (host, port); the endpoint's key in the pool."""
    rest = base_url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


class Connection:
    """One slot under the endpoint's limit: an open stream and its answer parser, or none yet (`stream`
    None: the holder connects it). `reused` is True when it served an earlier request."""

    __slots__ = ("endpoint", "stream", "reader", "reused", "idle_since")

    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint
        self.stream: trio.SocketStream | None = None
        self.reader = ResponseReader()
        self.reused = False
        self.idle_since = 0.0

    @property
    def host_header(self) -> bytes:
        return self.endpoint.host_header

    async def connect(self, timeout_s: float) -> None:
        """Open a fresh stream in this slot (after closing any old one). Raises ConnectFailed."""
        self.drop_stream()
        ep = self.endpoint
        try:
            with trio.fail_after(timeout_s):
                stream = await trio.open_tcp_stream(ep.host, ep.port)
        except (OSError, trio.TooSlowError) as error:
            what = "no answer" if isinstance(error, trio.TooSlowError) else (str(error) or type(error).__name__)
            raise ConnectFailed(f"cannot connect to {ep.host}:{ep.port}: {what}") from None
        self.stream = stream
        self.reader = ResponseReader()
        self.reused = False
        ep.stats.opened += 1

    def drop_stream(self) -> None:
        """Close the stream now (synchronously: safe in a cancelled or finishing task)."""
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.socket.close()


class _Waiter:
    __slots__ = ("event", "conn")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.conn: Connection | None = None  # handed over by a release


class _Endpoint:
    """One engine endpoint: idle connections (oldest left, newest right), the count open, the waiters."""

    __slots__ = ("host", "port", "host_header", "idle", "open", "limit", "waiters", "stats")

    def __init__(self, host: str, port: int, stats: PoolStats, promote_s: float) -> None:
        self.host = host
        self.port = port
        self.host_header = f"{url_host(host)}:{port}".encode()
        self.idle: deque[Connection] = deque()
        self.open = 0  # slots handed out or idle: what the limit counts
        self.limit = 1  # as the last acquire gave it (a lowered setting closes connections as they come back)
        self.waiters: FairQueue[_Waiter] = FairQueue(promote_s, (1,) * len(CLASSES))  # bounds: as the last acquire
        self.stats = stats

    @property
    def waiting(self) -> int:
        return len(self.waiters)

    def expire(self, oldest_allowed: float) -> None:
        """Drop idle connections released before `oldest_allowed` (they are at the left: O(dropped))."""
        idle = self.idle
        while idle and idle[0].idle_since < oldest_allowed:
            conn = idle.popleft()
            self.stats.examined += 1
            conn.drop_stream()
            self.open -= 1


class Pool:
    """Every upstream connection of one gateway process. Runs in the trio thread (no locks needed).

    `acquire(url, limit, queue, ticket)` -> a `Connection` (connected, or not yet: `stream` None);
    `release(conn, keep)` gives it back, kept alive for the next request when `keep`, else closed (its slot
    freed). `depth[rank]`: requests of each class waiting now, over every endpoint.
    """

    def __init__(self, timeouts: Timeouts = TIMEOUTS, clock: Callable[[], float] = trio.current_time) -> None:
        self.timeouts = timeouts
        self.stats = PoolStats()
        self._clock = clock
        self._endpoints: dict[tuple[str, int], _Endpoint] = {}
        self._next_sweep = 0.0
        self.depth = [0] * len(CLASSES)

    def in_use(self, base_url: str) -> int:
        """Connections of this endpoint held by requests now (not idle); 0 for an endpoint never used."""
        ep = self._endpoints.get(split_url(base_url))
        return 0 if ep is None else ep.open - len(ep.idle)

    def waiting(self, base_url: str) -> int:
        ep = self._endpoints.get(split_url(base_url))
        return 0 if ep is None else ep.waiting

    async def acquire(self, base_url: str, limit: int, queue: int | tuple[int, ...],
                      ticket: Ticket | None = None) -> Connection:
        """A connection to the endpoint: the newest idle one, else a new slot while fewer than `limit` are
        open, else a turn in the endpoint's fair queue in the ticket's class and key (at most `queue` of
        that class waiting: one bound per class, or one for all). Raises Overloaded past that."""
        now = self._clock()
        if now >= self._next_sweep:
            self._sweep(now)
        key = split_url(base_url)
        ep = self._endpoints.get(key)
        if ep is None:
            ep = self._endpoints[key] = _Endpoint(key[0], key[1], self.stats, self.timeouts.priority_promote_s)
        stats = self.stats
        stats.acquires += 1
        if ticket is not None and ticket.waited < 0:
            ticket.waited = 0.0  # (a second acquire, on another replica, adds its wait to the first's)
        ep.limit = limit
        ep.expire(now - self.timeouts.upstream_idle_s)
        if ep.idle:
            conn = ep.idle.pop()
            stats.examined += 1
            stats.reused += 1
            return conn
        if ep.open < limit:
            ep.open += 1
            return Connection(ep)
        if ticket is None:
            ticket = Ticket()
        waiters = ep.waiters
        waiters.bounds = (queue,) * len(CLASSES) if isinstance(queue, int) else queue
        waiter = _Waiter()
        try:
            entry = waiters.push(waiter, ticket.key, ticket.rank, now)
        except Full as full:
            stats.overloaded += 1
            name = CLASSES[full.rank]
            raise Overloaded(f"{limit} slots busy and {full.bound} requests of class {name} waiting", name) from None
        stats.queued += 1
        self.depth[ticket.rank] += 1
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.conn is None:
                waiters.remove(entry)
                self.depth[ticket.rank] -= 1
            else:  # handed a connection just as it was cancelled: pass it on
                self._hand_on(waiter.conn)
            raise
        finally:
            ticket.waited = max(ticket.waited, 0.0) + self._clock() - now
        assert waiter.conn is not None
        return waiter.conn

    def release(self, conn: Connection, keep: bool) -> None:
        """Give a connection back: to the first waiter, else to the idle list (`keep`) or closed."""
        if not keep:
            conn.drop_stream()
        elif conn.reader.complete and conn.reader.keep_alive:
            conn.reader.reset()
            conn.reused = True
        else:
            conn.drop_stream()  # the exchange did not end cleanly: the connection cannot carry another
        self._hand_on(conn)

    def _hand_on(self, conn: Connection) -> None:
        ep = conn.endpoint
        if ep.open > ep.limit:  # the limit was lowered: this slot goes
            conn.drop_stream()
            ep.open -= 1
            return
        waiters = ep.waiters
        if len(waiters):
            promoted = waiters.promotions
            entry: Entry[_Waiter] | None = waiters.pop(self._clock())
            assert entry is not None
            self.stats.promoted += waiters.promotions - promoted
            self.depth[entry.asked] -= 1
            if conn.stream is None:
                conn = Connection(ep)  # a fresh slot: the waiter connects it
            entry.item.conn = conn
            entry.item.event.set()
            return
        if conn.stream is None:
            ep.open -= 1
            return
        conn.idle_since = self._clock()
        ep.idle.append(conn)

    def _sweep(self, now: float) -> None:
        """Every `upstream_idle_s`, drop expired idle connections of every endpoint (one the router no longer
        sends to would otherwise keep them), and forget endpoints with nothing open or waiting."""
        self._next_sweep = now + self.timeouts.upstream_idle_s
        oldest = now - self.timeouts.upstream_idle_s
        for key, ep in list(self._endpoints.items()):
            ep.expire(oldest)
            if not ep.open and not ep.waiting:
                del self._endpoints[key]

    def close(self) -> None:
        """Close every idle connection (those in use close when their requests end)."""
        for ep in self._endpoints.values():
            while ep.idle:
                ep.idle.pop().drop_stream()
                ep.open -= 1
        self._endpoints.clear()

