"""The gateway's upstream pool (llmgw/gateway/pool.py) and the calls over it (upstream.py): its work per request
does not grow with the requests in flight (counted, never timed), its limit and bounded queue, expiry,
timeouts and cancellation. A real tiny HTTP/1.1 server on loopback plays the engine."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial

import pytest
import trio
import trio.testing

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.domain.priority import RANK
from llmgw.gateway.pool import Overloaded, Pool, Ticket, raise_fd_limit
from llmgw.gateway.upstream import UpstreamTimeout, send
from llmgw.testing.scripted_engine import read_request

PATH = "/v1/chat/completions"
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


@dataclass
class Engine:
    """Holds every request until `hold` requests are in flight at once (then answers them and every later
    one), or answers at once (`hold` 0). `stream_then_silence`: a streamed head and one chunk, then nothing."""

    hold: int = 0
    stream_then_silence: bool = False
    in_flight: int = 0
    connections: int = 0
    closed: int = 0
    all_in: trio.Event = field(default_factory=trio.Event)

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buffer = bytearray()
        try:
            async with stream:
                while True:
                    if await read_request(stream, buffer) is None:
                        return
                    if self.stream_then_silence:
                        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nhi\n\r\n")
                        while await stream.receive_some(65536):  # silent until the gateway hangs up
                            pass
                        return
                    self.in_flight += 1
                    if self.in_flight == self.hold:
                        self.all_in.set()
                    if self.hold:
                        await self.all_in.wait()
                    self.in_flight -= 1
                    await stream.send_all(OK)
        finally:
            self.closed += 1

    def next_round(self) -> None:
        self.all_in = trio.Event()


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    pool = Pool()
    yield pool
    pool.close()


async def serve(nursery: trio.Nursery, engine: Engine) -> str:
    listeners = await nursery.start(partial(trio.serve_tcp, engine.handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def call(pool: Pool, url: str, limit: int = 10_000, queue: int | tuple[int, ...] = 10_000,
               ticket: Ticket | None = None) -> bytes:
    response = await send(pool, url, PATH, b"{}", "req-1", limit=limit, queue=queue, ticket=ticket)
    try:
        return await response.read()
    finally:
        response.close()


async def test_work_per_request_stays_constant_from_10_to_1000_requests_in_flight(pool: Pool) -> None:
    """httpcore looked at every connection for every request (quadratic under load); this pool looks at one."""
    raise_fd_limit()  # 1,000 requests in flight hold 2,000 sockets in this one process
    per_acquire = {}
    for n in (10, 100, 1000):
        engine = Engine(hold=n)
        async with trio.open_nursery() as nursery:
            url = await serve(nursery, engine)
            for _ in range(2):  # the first round opens n connections, the second reuses them, all at once
                engine.next_round()
                before = dataclasses.replace(pool.stats)
                async with trio.open_nursery() as calls:
                    for _ in range(n):
                        calls.start_soon(call, pool, url)
                    await engine.all_in.wait()
                    assert pool.in_use(url) == n  # every request in flight at once
            acquires = pool.stats.acquires - before.acquires
            assert acquires == n
            assert pool.stats.opened - before.opened == 0  # the second round opened nothing
            per_acquire[n] = (pool.stats.examined - before.examined) / acquires
            assert engine.connections == n
            pool.close()
            nursery.cancel_scope.cancel()
    assert per_acquire == {10: 1.0, 100: 1.0, 1000: 1.0}


async def test_over_the_limit_requests_queue_and_past_the_queue_are_refused_at_once(pool: Pool) -> None:
    engine = Engine(hold=1000)  # holds every request until `all_in` is set below
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        answers: list[bytes] = []

        async def one() -> None:
            answers.append(await call(pool, url, limit=2, queue=3))

        for _ in range(5):  # 2 in flight, 3 waiting
            nursery.start_soon(one)
        await trio.testing.wait_all_tasks_blocked()
        assert (pool.in_use(url), pool.waiting(url)) == (2, 3)
        with trio.fail_after(1), pytest.raises(Overloaded):  # the sixth: refused without waiting
            await call(pool, url, limit=2, queue=3)
        assert pool.stats.overloaded == 1
        engine.all_in.set()  # answer everything now
        with trio.fail_after(5):
            while len(answers) < 5:
                await trio.sleep(0.01)
        assert engine.connections == 2  # the waiters were served on the same two connections
        assert (pool.in_use(url), pool.waiting(url)) == (0, 0)
        nursery.cancel_scope.cancel()


async def test_a_busy_replica_serves_the_higher_class_first_then_keys_by_turns(pool: Pool) -> None:
    """One slot, held; a bulk key floods, then a default key and an interactive key each send one: the
    interactive one goes first, the default one next, then the flood; each waiter's wait is on its ticket."""
    engine = Engine(hold=1000)
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        order: list[str] = []
        tickets: dict[str, Ticket] = {}

        async def one(name: str, key: str, klass: str) -> None:
            tickets[name] = ticket = Ticket(key, RANK[klass])
            await call(pool, url, limit=1, ticket=ticket)
            order.append(name)

        nursery.start_soon(one, "first", "A", "bulk")
        await trio.testing.wait_all_tasks_blocked()  # it holds the one slot
        for i in range(5):
            nursery.start_soon(one, f"bulk{i}", "A", "bulk")
            await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, "default", "B", "default")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, "interactive", "C", "interactive")
        await trio.testing.wait_all_tasks_blocked()
        assert pool.depth == [0, 1, 1, 5] and pool.waiting(url) == 7
        engine.all_in.set()
        with trio.fail_after(5):
            while len(order) < 8:
                await trio.sleep(0.01)
        assert order == ["first", "interactive", "default", *(f"bulk{i}" for i in range(5))]
        assert tickets["first"].waited == 0 and tickets["bulk4"].waited > tickets["interactive"].waited > 0
        assert pool.depth == [0, 0, 0, 0]
        nursery.cancel_scope.cancel()


async def test_each_class_has_its_own_bound_and_a_refusal_names_the_class(pool: Pool) -> None:
    engine = Engine(hold=1000)
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        bounds = (4, 4, 4, 1)  # system, interactive, default, bulk
        nursery.start_soon(partial(call, pool, url, limit=1, queue=bounds))  # holds the slot
        await trio.testing.wait_all_tasks_blocked()  # (trio may start tasks in any order)
        nursery.start_soon(partial(call, pool, url, limit=1, queue=bounds, ticket=Ticket("A", RANK["bulk"])))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(Overloaded) as refused:
            await call(pool, url, limit=1, queue=bounds, ticket=Ticket("B", RANK["bulk"]))
        assert refused.value.priority == "bulk" and "1 requests of class bulk waiting" in str(refused.value)
        nursery.start_soon(partial(call, pool, url, limit=1, queue=bounds, ticket=Ticket("B", RANK["default"])))
        await trio.testing.wait_all_tasks_blocked()
        assert pool.waiting(url) == 2 and pool.stats.overloaded == 1
        nursery.cancel_scope.cancel()


async def test_a_cancelled_waiter_leaves_no_trace(pool: Pool) -> None:
    engine = Engine(hold=1000)  # holds every request
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        nursery.start_soon(partial(call, pool, url, limit=1, queue=1))
        await trio.testing.wait_all_tasks_blocked()
        assert engine.in_flight == 1
        with trio.move_on_after(0.05):
            await call(pool, url, limit=1, queue=1)  # waits, then is cancelled
        assert pool.waiting(url) == 0 and pool.depth == [0, 0, 0, 0]
        nursery.start_soon(partial(call, pool, url, limit=1, queue=1))  # the queue has room again
        await trio.testing.wait_all_tasks_blocked()
        assert pool.waiting(url) == 1
        nursery.cancel_scope.cancel()


async def test_idle_connections_expire(autojump_clock: trio.testing.MockClock) -> None:
    engine = Engine()
    pool = Pool(dataclasses.replace(TIMEOUTS, upstream_idle_s=4.0))
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        await call(pool, url)
        await call(pool, url)
        assert (pool.stats.opened, pool.stats.reused) == (1, 1)
        await trio.sleep(5)
        await call(pool, url)  # the idle one is older than upstream_idle_s: closed, a new one opened
        assert (pool.stats.opened, pool.stats.reused) == (2, 1)
        pool.close()
        nursery.cancel_scope.cancel()


async def test_an_engine_silent_mid_answer_times_out(autojump_clock: trio.testing.MockClock) -> None:
    engine = Engine(stream_then_silence=True)
    pool = Pool(dataclasses.replace(TIMEOUTS, upstream_chunk_s=7.0))
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        response = await send(pool, url, PATH, b"{}", "req-1", limit=1, queue=1)
        assert await response.next_chunk() == b"hi\n"
        started = trio.current_time()
        with pytest.raises(UpstreamTimeout, match="nothing for 7 s"):
            await response.next_chunk()
        assert trio.current_time() - started == pytest.approx(7.0)
        assert pool.in_use(url) == 0
        nursery.cancel_scope.cancel()


async def test_a_cancelled_read_closes_the_connection_to_the_engine(pool: Pool) -> None:
    """A client that goes away cancels the relay: the engine sees its connection close (and stops)."""
    engine = Engine(stream_then_silence=True)
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        response = await send(pool, url, PATH, b"{}", "req-1", limit=1, queue=1)
        with trio.move_on_after(0.05):
            await response.next_chunk()
            await response.next_chunk()  # silent: cancelled here
        response.close()
        assert pool.in_use(url) == 0
        with trio.fail_after(2):
            while not engine.closed:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_a_lowered_limit_closes_connections_as_they_come_back(pool: Pool) -> None:
    engine = Engine(hold=1000)  # holds every request until `all_in` is set
    async with trio.open_nursery() as nursery:
        url = await serve(nursery, engine)
        for _ in range(3):
            nursery.start_soon(partial(call, pool, url, limit=3, queue=5))
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(partial(call, pool, url, limit=1, queue=5))  # the setting is now 1: it waits
        await trio.testing.wait_all_tasks_blocked()
        assert (pool.in_use(url), pool.waiting(url)) == (3, 1)
        engine.all_in.set()
        with trio.fail_after(5):
            while pool.in_use(url) or pool.waiting(url):
                await trio.sleep(0.01)
        with trio.fail_after(5):  # of the three connections, two were closed as they came back
            while engine.closed < 2:
                await trio.sleep(0.01)
        assert engine.closed == 2
        await call(pool, url, limit=1, queue=5)  # on the one kept
        assert engine.connections == 3
        nursery.cancel_scope.cancel()
