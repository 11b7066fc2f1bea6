"""A replica's circuit breaker (gateway/breaker.py) alone, and as the router uses it: an open breaker takes the
replica out of rotation; after `breaker_open_s` exactly one request probes it; its answer closes it."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.gateway.breaker import Breaker
from llmgw.gateway.router import Router

FAILURES = 3
OPEN_S = 5.0


def test_it_opens_after_n_failures_in_a_row_and_a_success_resets_the_count() -> None:
    breaker = Breaker()
    assert not breaker.failed(0.0, "HTTP 500", FAILURES, OPEN_S)
    assert not breaker.failed(0.0, "HTTP 500", FAILURES, OPEN_S)
    assert not breaker.succeeded()  # closed: nothing to close, but the count starts again
    assert not breaker.failed(1.0, "HTTP 500", FAILURES, OPEN_S)
    assert not breaker.failed(1.0, "timeout", FAILURES, OPEN_S)
    assert breaker.state() is None and breaker.admits(1.0)
    assert breaker.failed(2.0, "HTTP 503", FAILURES, OPEN_S)
    state = breaker.state()
    assert state is not None and state.since == 2.0 and "3 consecutive failures; last: HTTP 503" == state.reason
    assert not breaker.admits(2.0) and not breaker.admits(6.9)


def test_half_open_lets_one_probe_through_and_its_answer_decides() -> None:
    breaker = Breaker()
    for _ in range(FAILURES):
        breaker.failed(0.0, "HTTP 500", FAILURES, OPEN_S)
    assert breaker.admits(5.0)
    breaker.probe(5.0, OPEN_S)
    state = breaker.state()
    assert state is not None and state.half_open
    assert not breaker.admits(5.0)  # one probe, not a burst
    assert not breaker.failed(5.5, "HTTP 500", FAILURES, OPEN_S)  # the probe failed: open again
    assert not breaker.admits(10.4) and breaker.admits(10.5)
    breaker.probe(10.5, OPEN_S)
    assert breaker.succeeded()  # the probe answered: closed
    assert breaker.state() is None and breaker.admits(10.5) and breaker.consecutive == 0


def test_a_probe_that_never_reports_does_not_wedge_it() -> None:
    breaker = Breaker()
    for _ in range(FAILURES):
        breaker.failed(0.0, "HTTP 500", FAILURES, OPEN_S)
    breaker.probe(5.0, OPEN_S)  # its client went away: no result
    assert not breaker.admits(9.9) and breaker.admits(10.0)


@given(st.lists(st.tuples(st.sampled_from(["fail", "ok", "probe"]), st.floats(0, 3)), max_size=60))
def test_open_exactly_when_the_last_run_of_failures_reached_the_threshold(
        events: list[tuple[str, float]]) -> None:
    breaker = Breaker()
    now = 0.0
    run = 0
    opened = False
    for kind, step in events:
        now += step
        if kind == "fail":
            run += 1
            tripped = breaker.failed(now, "x", FAILURES, OPEN_S)
            assert tripped == (not opened and run >= FAILURES)
            opened = opened or tripped
        elif kind == "ok":
            assert breaker.succeeded() == opened
            run, opened = 0, False
        elif breaker.admits(now):
            breaker.probe(now, OPEN_S)
            assert not opened or not breaker.admits(now)  # an open one admits one probe per interval
        assert breaker.is_open == opened == (breaker.state() is not None)
        assert breaker.consecutive == run
        assert opened or breaker.admits(now)


def _ready(*replicas: str) -> dict[str, ModelRoute]:
    return {"m": ModelRoute("m", "chat", "ready", tuple(Endpoint(r, f"http://{r}.test") for r in replicas))}


async def _fail(router: Router, replica: str, times: int) -> None:
    for _ in range(times):
        lease = router.acquire("m", deadline=trio.current_time() + 60)
        async with lease as endpoint:
            if endpoint.replica_id == replica:
                lease.failed("the engine answered HTTP 500", FAILURES)
            else:
                lease.answered()


async def test_the_router_sends_an_open_replica_nothing_but_one_probe_per_interval(
        autojump_clock: trio.testing.MockClock) -> None:
    router = Router(breaker_open_s=OPEN_S)
    router.update_routes(_ready("a", "b"))
    await _fail(router, "a", 2 * FAILURES)  # round robin: a fails every other request
    opened = router.open_breakers()
    assert set(opened) == {"a"} and "last: the engine answered HTTP 500" in opened["a"].reason
    for _ in range(10):
        async with router.acquire("m", deadline=trio.current_time() + 60) as endpoint:
            assert endpoint.replica_id == "b"
    await trio.sleep(OPEN_S)
    probe = router.acquire("m", deadline=trio.current_time() + 60)
    async with probe as endpoint:
        assert endpoint.replica_id == "a"  # the probe
        assert router.open_breakers()["a"].half_open
        async with router.acquire("m", deadline=trio.current_time() + 60) as other:
            assert other.replica_id == "b"  # only one
        probe.answered()
    assert router.open_breakers() == {}
    seen = set()
    for _ in range(4):
        async with router.acquire("m", deadline=trio.current_time() + 60) as endpoint:
            seen.add(endpoint.replica_id)
    assert seen == {"a", "b"}


async def test_with_every_replica_open_a_request_still_goes_to_one(autojump_clock: trio.testing.MockClock) -> None:
    router = Router(breaker_open_s=OPEN_S)
    router.update_routes(_ready("a"))
    await _fail(router, "a", FAILURES)
    assert set(router.open_breakers()) == {"a"}
    async with router.acquire("m", deadline=trio.current_time() + 60) as endpoint:
        assert endpoint.replica_id == "a"  # the least bad: it may answer (and close its breaker)


async def test_a_lease_moves_to_another_replica(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes(_ready("a", "b"))
    lease = router.acquire("m", deadline=trio.current_time() + 60)
    async with lease as endpoint:
        moved = lease.move()
        assert moved is not None and moved.replica_id != endpoint.replica_id
        assert router.statistics().replicas == {endpoint.replica_id: 0, moved.replica_id: 1}
    assert router.statistics().replicas == {"a": 0, "b": 0}
