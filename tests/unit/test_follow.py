"""`llmgw.wire.follow.follow_leader`, the one loop agents and gateways find the leader with, for both
roles: a pointer is followed across hops, a pointer loop does not spin, the pause after a failed
round grows and starts again after a welcome, and the log words are the same for both. The loop's
logic runs on a MockClock against fake sessions (the edge: a stream's outcome); the real agent and
gateway follow two hops over loopback WebSockets."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from trio_websocket import WebSocketRequest, serve_websocket

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS, Reconnect
from llmgw.gateway.follower import GatewayConfig
from llmgw.gateway.follower import serve as gateway_serve
from llmgw.testing import FakeGpuProbe
from llmgw.wire import protocol
from llmgw.wire.follow import MAX_HOPS, Refused, Silent, Welcomed, follow_leader

ROLES = {"agent": TIMEOUTS.agent_reconnect, "gateway": TIMEOUTS.gateway_reconnect}
A, B, C = "http://a:8081", "http://b:8081", "http://c:8081"


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# --- the edge, faked: what each control URL does with a stream, in turn ----------------------------

Act = Callable[[str, Welcomed], Awaitable[None]]


def refuse(pointer: str | None = None) -> Act:
    async def act(control: str, welcomed: Welcomed) -> None:
        raise Refused(control, "this member does not lead", "m-lead" if pointer else None, pointer)
    return act


def down() -> Act:
    async def act(control: str, welcomed: Welcomed) -> None:
        raise ConnectionRefusedError(111, "Connection refused")
    return act


def lead(for_s: float) -> Act:
    """Welcome the stream, then go silent after `for_s` (float("inf"): never)."""
    async def act(control: str, welcomed: Welcomed) -> None:
        welcomed("m-lead", "")
        await trio.sleep(for_s)
        raise Silent(control, 1.0)
    return act


class World:
    """Control URLs, each with its acts in order (the last one again and again); every try is kept."""

    def __init__(self, acts: dict[str, list[Act]]) -> None:
        self.acts = acts
        self.tries: list[tuple[float, str]] = []
        self._tried = trio.Event()

    async def session(self, control: str, welcomed: Welcomed) -> None:
        self.tries.append((trio.current_time(), control))
        self._tried.set()
        self._tried = trio.Event()
        acts = self.acts[control]
        act = acts.pop(0) if len(acts) > 1 else acts[0]
        await act(control, welcomed)

    async def tried(self, n: int) -> None:
        """Until `n` streams were tried."""
        while len(self.tries) < n:
            await self._tried.wait()

    def urls(self) -> list[str]:
        return [url for _, url in self.tries]

    def gaps(self) -> list[float]:
        return [b - a for (a, _), (b, _) in zip(self.tries, self.tries[1:])]


@asynccontextmanager
async def following(world: World, controls: list[str], role: str, reconnect: Reconnect) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: follow_leader(controls, world.session, role=role, reconnect=reconnect))
        yield
        nursery.cancel_scope.cancel()


def about(gap: float, seconds: float) -> bool:
    """`gap` is `seconds` give or take half (the loop's jitter), read off the clock's floats."""
    return 0.5 * seconds - 1e-9 <= gap <= 1.5 * seconds + 1e-9


# --- the pointer policy ----------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
async def test_a_pointer_is_followed_across_two_hops_at_once(clock: trio.testing.MockClock, role: str) -> None:
    world = World({A: [refuse(B)], B: [refuse(C)], C: [lead(float("inf"))]})
    async with following(world, [A], role, ROLES[role]):
        await world.tried(3)
        await trio.sleep(60)
    assert world.urls() == [A, B, C]
    assert world.gaps() == [0.0, 0.0], "no pause on the way to the leader"


@pytest.mark.parametrize("role", ROLES)
async def test_members_pointing_at_each_other_do_not_make_a_busy_loop(clock: trio.testing.MockClock,
                                                                    role: str) -> None:
    """A and B each name the other as the leader: each chain stops where it began, every round
    ends with a pause (short: members answer, an election), and the loop never spins."""
    reconnect = ROLES[role]
    world = World({A: [refuse(B)], B: [refuse(A)]})
    async with following(world, [A, B], role, reconnect):
        await trio.sleep(30)
    rounds: dict[float, list[str]] = {}
    for at, url in world.tries:
        rounds.setdefault(at, []).append(url)
    assert list(rounds.values())[0] == [A, B, B, A]  # each configured URL, then where it points, once
    assert all(len(urls) <= 2 + MAX_HOPS for urls in rounds.values())
    pauses = [b - a for a, b in zip(rounds, list(rounds)[1:])]
    assert len(pauses) > 10 and all(p <= 1.5 * reconnect.election_s + 1e-9 for p in pauses), pauses


async def test_a_long_chain_of_pointers_is_cut_after_max_hops(clock: trio.testing.MockClock) -> None:
    urls = [f"http://m{i}:8081" for i in range(MAX_HOPS + 3)]
    world = World({url: [refuse(nxt)] for url, nxt in zip(urls, urls[1:])} | {urls[-1]: [lead(float("inf"))]})
    async with following(world, [urls[0]], "agent", TIMEOUTS.agent_reconnect):
        await world.tried(MAX_HOPS + 2)
    assert world.urls()[:MAX_HOPS + 2] == urls[:MAX_HOPS + 1] + [urls[0]]
    assert world.gaps()[MAX_HOPS] > 0, "back to the configured URL after a pause"


# --- the backoff -----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
async def test_the_pause_grows_while_nothing_answers_and_starts_again_after_a_welcome(
        clock: trio.testing.MockClock, role: str) -> None:
    r = ROLES[role]
    failures = 8
    world = World({A: [down()] * failures + [lead(r.settle_s * 2)] + [down()]})
    async with following(world, [A], role, r):
        await world.tried(failures + 5)
    gaps = world.gaps()
    expected = [min(r.first_s * 2 ** k, r.max_s) for k in range(failures)]
    for gap, delay in zip(gaps[:failures], expected, strict=True):
        assert about(gap, delay), (gaps, expected)
    assert expected[-1] == r.max_s, "the test reaches the longest pause"
    assert gaps[failures] == pytest.approx(r.settle_s * 2), "the next URL at once when the leader goes"
    assert about(gaps[failures + 1], r.first_s), "the backoff starts again"
    assert about(gaps[failures + 2], r.first_s * 2)


@pytest.mark.parametrize("role", ROLES)
async def test_a_leader_that_drops_the_stream_at_once_is_not_hammered(clock: trio.testing.MockClock,
                                                                      role: str) -> None:
    r = ROLES[role]
    world = World({A: [lead(0)]})
    async with following(world, [A], role, r):
        await trio.sleep(10)
    assert world.tries and all(about(gap, r.first_s) for gap in world.gaps())


# --- the log words ---------------------------------------------------------------------------------


async def test_both_roles_say_the_same_words(clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    said: dict[str, list[tuple[str, str]]] = {}
    for role, reconnect in ROLES.items():
        world = World({A: [down(), refuse(B)], B: [lead(reconnect.settle_s), refuse()]})
        caplog.clear()
        with caplog.at_level(logging.INFO):
            async with following(world, [A], role, reconnect):
                await trio.sleep(reconnect.settle_s + 10 * reconnect.max_s)
        assert {r.name for r in caplog.records} == {f"llmgw.{role}.follow"}
        said[role] = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said["agent"] == said["gateway"]
    assert said["agent"][:4] == [
        ("WARNING", f"stream to {A} lost: [Errno 111] Connection refused"),
        ("INFO", f"control {A} refused the stream: this member does not lead (leader: m-lead)"),
        ("INFO", f"following the leader at {B} (member m-lead)"),
        ("WARNING", f"lost the leader at {B} (no word from control {B} for 1 s): looking for the leader again"),
    ]


# --- both roles for real: two hops over loopback WebSockets ----------------------------------------

# The fake members check no credential; a machine in a control plane's process would send this one.
LOCAL = "llmgw-local-follow"


class Members:
    """Three WebSocket servers on loopback: the first two refuse, each pointing at the next; the
    third welcomes. Each records the streams it got."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.streams: list[str] = []

    async def serve(self, nursery: trio.Nursery) -> None:
        for i in range(3):
            server = await nursery.start(serve_websocket, self.handler(i), "127.0.0.1", 0, None)
            self.urls.append(f"http://127.0.0.1:{server.port}")

    def handler(self, i: int) -> Callable[[WebSocketRequest], Awaitable[None]]:
        async def handle(request: WebSocketRequest) -> None:
            ws = await request.accept()
            hello = protocol.loads(await ws.get_message())
            self.streams.append(self.urls[i])
            if i < 2:
                await ws.send_message(protocol.dumps({"type": "refused", "reason": "not the leader",
                                                      "leader": f"m{i + 1}", "leader_url": self.urls[i + 1]}))
                await trio.sleep_forever()
            await ws.send_message(protocol.dumps({"type": "welcome", "node": str(hello.get("node")), "leader": "m2"}))
            await trio.sleep_forever()
        return handle


def start_agent(first: str, tmp_path: Path) -> Callable[..., Awaitable[Any]]:
    config = AgentConfig(controls=[first], tls=None, local_credential=LOCAL, state_dir=tmp_path, node="n1",
                         probe=FakeGpuProbe(NodeInfo("x", hostname="h", cpus=2)))
    return lambda task_status=trio.TASK_STATUS_IGNORED: agent_serve(config, task_status=task_status)


def start_gateway(first: str, tmp_path: Path) -> Callable[..., Awaitable[Any]]:
    config = GatewayConfig(controls=[first], tls=None, local_credential=LOCAL, listen_port=0, name="gw")
    return lambda task_status=trio.TASK_STATUS_IGNORED: gateway_serve(config, task_status=task_status)


@pytest.mark.parametrize("start", [start_agent, start_gateway], ids=["agent", "gateway"])
async def test_each_role_follows_two_pointers_to_the_leader(start: Callable[[str, Path], Any],
                                                           tmp_path: Path) -> None:
    members = Members()
    async with trio.open_nursery() as servers:
        await members.serve(servers)
        async with trio.open_nursery() as role:  # stopped first: its stream closes while the server answers
            with trio.fail_after(10):
                await role.start(start(members.urls[0], tmp_path))
                while len(members.streams) < 3:
                    await trio.sleep(0.01)
            role.cancel_scope.cancel()
        assert members.streams == members.urls
        servers.cancel_scope.cancel()
