"""Router (S4): least-outstanding pick, release on every exit, idle tracking, activation waits.

Activation waits run on trio's autojump MockClock, so a two-minute window takes no real time.
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.gateway.router import Lease, NoEndpoint, Router


def ready(model: str, *replicas: str) -> ModelRoute:
    return ModelRoute(model, "chat", "ready", tuple(Endpoint(r, f"http://{r}.test") for r in replicas))


def state(model: str, state: str, reason: str = "") -> ModelRoute:
    return ModelRoute(model, "chat", state, (), reason)


def far() -> float:
    return trio.current_time() + 120


async def test_picks_least_outstanding() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b", "c")})
    async with router.acquire("m", deadline=far()) as first:
        async with router.acquire("m", deadline=far()) as second:
            async with router.acquire("m", deadline=far()) as third:
                assert {first.replica_id, second.replica_id, third.replica_id} == {"a", "b", "c"}
                assert router.statistics().outstanding == {"m": 3}
            # Only the third's replica is free now, whatever the rotation says.
            for _ in range(3):
                async with router.acquire("m", deadline=far()) as endpoint:
                    assert endpoint.replica_id == third.replica_id
    assert router.statistics().replicas == {"a": 0, "b": 0, "c": 0}


async def test_ties_rotate_round_robin() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b", "c")})
    seen = []
    for _ in range(6):
        async with router.acquire("m", deadline=far()) as endpoint:
            seen.append(endpoint.replica_id)
    assert seen == ["a", "b", "c", "a", "b", "c"]


async def test_busy_replica_is_skipped_until_it_frees() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b")})
    lease = router.acquire("m", deadline=far())
    held = await lease.__aenter__()
    picks = []
    for _ in range(3):
        async with router.acquire("m", deadline=far()) as endpoint:
            picks.append(endpoint.replica_id)
    assert set(picks) == {"b" if held.replica_id == "a" else "a"}
    await lease.__aexit__(None, None, None)


async def test_release_on_exception() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a")})
    with pytest.raises(ValueError):
        async with router.acquire("m", deadline=far()):
            assert router.statistics().replicas == {"a": 1}
            raise ValueError("boom")
    assert router.statistics().replicas == {"a": 0}


async def test_release_on_cancellation() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a")})
    with trio.CancelScope() as scope:
        async with router.acquire("m", deadline=far()):
            scope.cancel()
            await trio.sleep(1)
    assert scope.cancelled_caught
    assert router.statistics().replicas == {"a": 0}


async def test_last_used_written_on_acquire(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b")})
    assert router.last_used() == {}  # unknown, not idle
    await trio.sleep(42)
    async with router.acquire("m", deadline=far()) as endpoint:
        assert router.last_used() == {endpoint.replica_id: trio.current_time()}
    copy = router.last_used()
    copy.clear()
    assert router.last_used() != {}


async def test_persisting_replicas_keep_counters_vanished_are_forgotten(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b")})
    lease_a = router.acquire("m", deadline=far())
    assert (await lease_a.__aenter__()).replica_id == "a"
    lease_b = router.acquire("m", deadline=far())
    assert (await lease_b.__aenter__()).replica_id == "b"
    used_a = router.last_used()["a"]

    router.update_routes({"m": ready("m", "a", "c")})
    assert router.statistics().replicas == {"a": 1, "c": 0}
    assert router.last_used() == {"a": used_a}

    # b comes back as a new replica: the old holder's release must not touch its count.
    router.update_routes({"m": ready("m", "a", "b", "c")})
    await lease_b.__aexit__(None, None, None)
    await lease_a.__aexit__(None, None, None)
    assert router.statistics().replicas == {"a": 0, "b": 0, "c": 0}
    assert "b" not in router.last_used()


async def test_activation_asks_recorded_and_cleared(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    await trio.sleep(5)
    with pytest.raises(NoEndpoint) as caught:
        async with router.acquire("cold", deadline=trio.current_time() + 10):
            pass
    assert caught.value.code == "activation_timeout"
    assert router.take_activation_asks() == {"cold": 5.0}
    assert router.take_activation_asks() == {}


async def test_a_models_first_ask_wakes_the_reader_of_asks_at_most_once_per_interval(
        autojump_clock: trio.testing.MockClock) -> None:
    """The reconciler (or a remote gateway's demand report) hears of a request waiting for an activation at once,
    not at its next round; a crowd of requests for one cold model wakes it once per `ask_wake_s`."""
    woken: list[float] = []
    router = Router(ask_wake_s=0.25)
    router.on_ask(lambda: woken.append(trio.current_time()))
    router.update_routes({"cold": state("cold", "absent"), "other": state("other", "absent")})

    async def ask(model: str) -> None:
        with pytest.raises(NoEndpoint):
            async with router.acquire(model, deadline=trio.current_time() + 0.01):
                pass

    await trio.sleep(5)
    await ask("cold")
    assert woken == [5.0]
    await ask("cold")
    await ask("other")  # another model's first ask is news
    assert woken == pytest.approx([5.0, 5.02])
    router.take_activation_asks()
    await ask("cold")  # read, but the last wake for it was under ask_wake_s ago: the next round takes it
    assert woken == pytest.approx([5.0, 5.02])
    router.take_activation_asks()
    await trio.sleep(1)
    await ask("cold")
    assert woken == pytest.approx([5.0, 5.02, 6.04])


async def test_ready_model_records_no_ask() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a")})
    async with router.acquire("m", deadline=far()):
        pass
    assert router.take_activation_asks() == {}


async def test_waiter_woken_by_ready_route(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes({"m": state("m", "absent")})
    got: list[str] = []

    async def client() -> None:
        async with router.acquire("m", deadline=trio.current_time() + 120) as endpoint:
            got.append(endpoint.replica_id)
            assert trio.current_time() == 30

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        await trio.sleep(10)
        assert router.statistics().waiting == {"m": 1}
        router.update_routes({"m": state("m", "starting")})  # still nothing ready: keeps waiting
        await trio.sleep(20)
        assert got == []
        router.update_routes({"m": ready("m", "r1")})
    assert got == ["r1"]
    assert router.statistics().waiting == {}
    assert router.take_activation_asks() == {"m": 0.0}


@pytest.mark.parametrize(
    ("route_state", "code"),
    [("parked", "model_parked"), ("unplaceable", "model_unplaceable")],
)
async def test_waiter_fails_at_once_when_route_turns_hopeless(
    autojump_clock: trio.testing.MockClock, route_state: str, code: str
) -> None:
    router = Router()
    failures: list[NoEndpoint] = []

    async def client() -> None:
        with pytest.raises(NoEndpoint) as caught:
            async with router.acquire("m", deadline=trio.current_time() + 120):
                pass
        failures.append(caught.value)
        assert trio.current_time() == 3  # not the full window

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        await trio.sleep(3)
        router.update_routes({"m": state("m", route_state, "needs 2 GPUs of class h100; none free")})
    assert [f.code for f in failures] == [code]
    assert "needs 2 GPUs of class h100; none free" in failures[0].message


@pytest.mark.parametrize(
    ("route_state", "code"),
    [("parked", "model_parked"), ("unplaceable", "model_unplaceable")],
)
async def test_hopeless_route_refused_at_once(
    autojump_clock: trio.testing.MockClock, route_state: str, code: str
) -> None:
    router = Router()
    router.update_routes({"m": state("m", route_state, "the reason")})
    with pytest.raises(NoEndpoint) as caught:
        async with router.acquire("m", deadline=far()):
            pass
    assert caught.value.code == code
    assert caught.value.message.endswith(": the reason")
    assert trio.current_time() == 0
    # Unplaceable still counts as demand (capacity may free up); parked does not.
    assert router.take_activation_asks() == ({"m": 0.0} if route_state == "unplaceable" else {})


async def test_stopped_route_fails_its_waiters_at_once(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes({"m": state("m", "starting")})

    async def stop() -> None:
        await trio.sleep(2)
        router.update_routes({"m": state("m", "stopped", "serving is stopped")})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop)
        with pytest.raises(NoEndpoint) as caught:
            async with router.acquire("m", deadline=far()):
                pass
    assert caught.value.code == "system_stopped"
    assert caught.value.message.endswith(": serving is stopped")
    assert trio.current_time() == 2


async def test_stale_stopped_route_waits_for_the_start(autojump_clock: trio.testing.MockClock) -> None:
    # The gateway checks `serving.stopped` itself; a request that gets this far on a
    # stopped route came right after a start, before the control plane's next push.
    router = Router()
    router.update_routes({"m": state("m", "stopped")})

    async def start() -> None:
        await trio.sleep(1)
        router.update_routes({"m": state("m", "stopped")})  # an unrelated push: still waiting
        await trio.sleep(1)
        router.update_routes({"m": ready("m", "a")})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(start)
        async with router.acquire("m", deadline=far()) as endpoint:
            assert endpoint.replica_id == "a"
    assert trio.current_time() == 2


async def test_listed_endpoints_are_served_whatever_the_state() -> None:
    router = Router()
    router.update_routes({"m": ModelRoute("m", "chat", "parked", (Endpoint("a", "http://a"),), "last one left")})
    async with router.acquire("m", deadline=far()) as endpoint:
        assert endpoint.replica_id == "a"


async def test_deadline_gives_activation_timeout(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes({"m": state("m", "starting")})
    with pytest.raises(NoEndpoint) as caught:
        async with router.acquire("m", deadline=trio.current_time() + 120):
            pass
    assert caught.value.code == "activation_timeout"
    assert "starting" in caught.value.message
    assert trio.current_time() == 120
    assert router.statistics().waiting == {}


async def test_cancelled_waiter_leaves_no_trace(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    with trio.move_on_after(5):
        async with router.acquire("m", deadline=trio.current_time() + 120):
            pass
    assert router.statistics().waiting == {}
    router.update_routes({"m": ready("m", "a")})
    assert router.statistics().replicas == {"a": 0}


# --- property: counts equal held acquisitions under any interleaving ------------------

_REPLICAS = {"r0": "m0", "r1": "m0", "r2": "m0", "r3": "m1", "r4": "m1"}

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(["m0", "m1", "m2"])),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.tuples(st.just("update"), st.sets(st.sampled_from(sorted(_REPLICAS)))),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_outstanding_counts_match_held_acquisitions(ops: list[tuple[str, object]]) -> None:
    async def scenario() -> None:
        router = Router()
        present: set[str] = set()
        generation: Counter[str] = Counter()  # bumped when a replica vanishes: its return is a new replica
        held: list[tuple[Lease, str, int]] = []
        for op, arg in ops:
            if op == "acquire":
                assert isinstance(arg, str)
                before = router.statistics().replicas
                lease = router.acquire(arg, deadline=trio.current_time())  # no waiting
                try:
                    endpoint = await lease.__aenter__()
                except NoEndpoint as refusal:
                    assert refusal.code == "activation_timeout"
                    assert not any(_REPLICAS[r] == arg for r in present)
                    continue
                assert _REPLICAS[endpoint.replica_id] == arg
                assert before[endpoint.replica_id] == min(n for r, n in before.items() if _REPLICAS[r] == arg)
                held.append((lease, endpoint.replica_id, generation[endpoint.replica_id]))
            elif op == "release":
                assert isinstance(arg, int)
                if held:
                    lease, _, _ = held.pop(arg % len(held))
                    await lease.__aexit__(None, None, None)
            else:
                assert isinstance(arg, set)
                for gone in present - arg:
                    generation[gone] += 1
                present = set(arg)
                router.update_routes(
                    {m: ready(m, *sorted(r for r in present if _REPLICAS[r] == m)) for m in ("m0", "m1")}
                )
            expected = Counter(rid for _, rid, gen in held if rid in present and gen == generation[rid])
            counts = router.statistics().replicas
            assert all(n >= 0 for n in counts.values())
            assert counts == {rid: expected[rid] for rid in present}
        for lease, _, _ in held:
            await lease.__aexit__(None, None, None)
        assert all(n == 0 for n in router.statistics().replicas.values())

    trio.run(scenario)


# --- replicas that refuse connections ------------------------------------------------------


async def test_a_replica_that_refused_leaves_the_rotation_and_the_lease_moves(
        autojump_clock: trio.testing.MockClock) -> None:
    router = Router(probe_s=2.0)
    router.update_routes({"m": ready("m", "a", "b")})
    lease = router.acquire("m", deadline=far())
    async with lease as endpoint:
        assert endpoint.replica_id == "a"
        moved = lease.refused()
        assert moved is not None and moved.replica_id == "b"
        assert router.statistics().replicas == {"a": 0, "b": 1}
    # Its failures are fast, so its count stays lowest: least-outstanding alone would send it everything.
    for _ in range(5):
        async with router.acquire("m", deadline=far()) as endpoint:
            assert endpoint.replica_id == "b"
    assert router.statistics().replicas == {"a": 0, "b": 0}


async def test_a_probe_after_the_interval_puts_it_back(autojump_clock: trio.testing.MockClock) -> None:
    router = Router(probe_s=2.0)
    router.update_routes({"m": ready("m", "a", "b")})
    lease = router.acquire("m", deadline=far())
    async with lease:
        lease.refused()
    await trio.sleep(2.0)
    probe = router.acquire("m", deadline=far())
    async with probe as endpoint:
        assert endpoint.replica_id == "a"  # one request tries it again...
        async with router.acquire("m", deadline=far()) as other:
            assert other.replica_id == "b"  # ...not every request: the next probe is one interval on
        probe.reached()  # it accepted the connection
    seen = set()
    for _ in range(4):
        async with router.acquire("m", deadline=far()) as endpoint:
            seen.add(endpoint.replica_id)
    assert seen == {"a", "b"}


async def test_a_failed_probe_keeps_it_out(autojump_clock: trio.testing.MockClock) -> None:
    router = Router(probe_s=2.0)
    router.update_routes({"m": ready("m", "a", "b")})
    lease = router.acquire("m", deadline=far())
    async with lease:
        lease.refused()
    await trio.sleep(2.0)
    probe = router.acquire("m", deadline=far())
    async with probe as endpoint:
        assert endpoint.replica_id == "a"
        assert probe.refused() is not None  # still refusing: the request moves to b
    for _ in range(3):
        async with router.acquire("m", deadline=far()) as endpoint:
            assert endpoint.replica_id == "b"


async def test_a_new_address_in_controls_table_puts_it_back(autojump_clock: trio.testing.MockClock) -> None:
    router = Router(probe_s=60.0)
    router.update_routes({"m": ready("m", "a", "b")})
    lease = router.acquire("m", deadline=far())
    async with lease:
        lease.refused()
    router.update_routes({"m": ready("m", "a", "b")})  # the same table again: still out
    async with router.acquire("m", deadline=far()) as endpoint:
        async with router.acquire("m", deadline=far()) as second:
            assert (endpoint.replica_id, second.replica_id) == ("b", "b")
    restarted = ModelRoute("m", "chat", "ready", (Endpoint("a", "http://a.test:9"), Endpoint("b", "http://b.test")))
    router.update_routes({"m": restarted})
    async with router.acquire("m", deadline=far()) as endpoint:
        async with router.acquire("m", deadline=far()) as second:
            assert {endpoint.replica_id, second.replica_id} == {"a", "b"}


async def test_with_every_replica_out_a_request_still_tries_one_and_no_third() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b")})
    lease = router.acquire("m", deadline=far())
    async with lease as endpoint:
        assert endpoint.replica_id == "a"
        assert lease.refused() is not None
        assert lease.refused(move=False) is None  # the retry refused too: no third try
    assert router.statistics().replicas == {"a": 0, "b": 0}
    async with router.acquire("m", deadline=far()) as endpoint:  # out of rotation, but not unroutable
        assert endpoint.replica_id in ("a", "b")
    single = Router()
    single.update_routes({"m": ready("m", "a")})
    lease = single.acquire("m", deadline=far())
    async with lease:
        assert lease.refused() is None  # no other replica to move to
    assert single.statistics().replicas == {"a": 0}


async def test_waiters_for_an_activation_are_bounded_per_model(autojump_clock: trio.testing.MockClock) -> None:
    """Each waiter holds a client's connection and body: past `max_waiting` for one model, `overloaded`
    at once; another model's waiters are not counted against it, and a freed place is taken again."""
    router = Router()
    router.update_routes({"cold": state("cold", "starting"), "other": state("other", "starting")})
    results: list[str] = []

    async def ask(model: str) -> None:
        try:
            async with router.acquire(model, deadline=trio.current_time() + 10, max_waiting=2):
                results.append("served")
        except NoEndpoint as refused:
            results.append(f"{refused.code}@{trio.current_time():g}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "cold")
        nursery.start_soon(ask, "cold")
        await trio.testing.wait_all_tasks_blocked()
        await ask("cold")  # a third: refused at once, not after the 10 s window
        assert results == ["overloaded@0"]
        nursery.start_soon(ask, "other")  # a waiter of another model is let in
        await trio.testing.wait_all_tasks_blocked()
        assert router.statistics().waiting == {"cold": 2, "other": 1}
    assert sorted(results) == ["activation_timeout@10"] * 3 + ["overloaded@0"]
