"""A member that starts leading adopts the replicas its agents run (placements are in Raft), and
one that stops leading lets its agents go: the real reconciler and hub, a store whose
leadership the test flips, agents scripted at the hub's edge, and a MockClock."""

from __future__ import annotations

from typing import Any, Mapping

import pytest
import trio
import trio.testing

from llmgw.control.hub import AgentHub, AgentLink
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import ModelRoute, NodeInfo, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.testing import MemoryStore

# Far past `lost_node_grace_s` (30 s): a standby that takes over late.
LATE = 10 * TIMEOUTS.lost_node_grace_s


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Member(MemoryStore):
    """The store of one member of a group: leadership is the test's to give and take."""

    leading = False

    def is_leader(self) -> bool:
        return self.leading


class Agent:
    """One node at the hub's edge: what it runs, and every message the leader sent it."""

    def __init__(self, hub: AgentHub, node: str, runs: list[ReplicaObs]) -> None:
        self.hub, self.node, self.runs = hub, node, runs
        self.got: list[dict[str, Any]] = []
        self.closed = trio.Event()
        self.link: AgentLink | None = None

    async def attach(self, nursery: trio.Nursery, *, report: bool = True) -> None:
        send, receive = trio.open_memory_channel[dict[str, Any]](100)
        self.link = self.hub.connect(self.node, send)
        self.hub.report_inventory(self.link, NodeInfo(self.node, cpus=4, engines=("sim",)))

        async def listen() -> None:
            async for message in receive:
                self.got.append(message)
            self.closed.set()

        nursery.start_soon(listen)
        await trio.sleep(0.5)  # the leader plans in between, as a real agent's first report is a moment later
        if report:
            self.report()

    def report(self) -> None:
        assert self.link is not None
        self.hub.report_replicas(self.link, self.runs)

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.got]


class Routes:
    """An EndpointSink that keeps every publication."""

    def __init__(self) -> None:
        self.published: list[Mapping[str, ModelRoute]] = []

    def update_routes(self, routes: Mapping[str, ModelRoute]) -> None:
        self.published.append(routes)


def sim(name: str, **extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", **extra})


def placed(store: MemoryStore, model: ModelDef, node: str) -> str:
    store.submit_nowait(commands.put_model(model, 0.0))
    result = store.submit_nowait(commands.add_placement(model.name, node, (), model.launch_hash(), 0.0))
    return str(result["replica_id"])


def ready(rid: str, model: str, node: str, port: int) -> ReplicaObs:
    return ReplicaObs(rid, model, node, "ready", url=f"http://10.0.0.7:{port}")


async def test_a_new_leader_adopts_running_replicas_instead_of_replacing_them(clock: trio.testing.MockClock) -> None:
    store = Member()
    demo = placed(store, sim("demo"), "n1")
    lazy = placed(store, sim("lazy", mode="on-demand"), "n1")
    before = dict(store.snapshot().placements)
    hub, routes = AgentHub(trio.current_time), Routes()
    rec = Reconciler(store, hub, sinks=[routes], clock=trio.current_time)
    agent = Agent(hub, "n1", [ready(demo, "demo", "n1", 1), ready(lazy, "lazy", "n1", 2)])
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await trio.sleep(LATE)  # a standby for a long time: it plans nothing
        assert routes.published == [] and store.snapshot().placements == before
        store.leading = True
        await trio.sleep(2)  # the new leader's first passes, before any agent re-attached
        assert store.snapshot().placements == before, "nodes not heard from yet are not lost (nor idle)"
        await agent.attach(nursery)
        await trio.sleep(2)
        assert store.snapshot().placements == before, "the same replica ids: adopted, not replaced"
        assert [m for m in agent.got if m["type"] in ("start_replica", "stop_replica")] == [], agent.got
        last = routes.published[-1]
        assert [e.replica_id for e in last["demo"].endpoints] == [demo]
        assert [e.replica_id for e in last["lazy"].endpoints] == [lazy]
        # An adopted on-demand replica counts as used at the takeover: it idles out later, as any other.
        await trio.sleep(sim("lazy").idle_timeout_s + 5)
        assert {p.model for p in store.snapshot().placements.values()} == {"demo"}
        assert agent.got[-1] == {"type": "stop_replica", "replica_id": lazy}
        nursery.cancel_scope.cancel()


async def test_what_no_longer_runs_is_planned_as_any_other(clock: trio.testing.MockClock) -> None:
    """The node comes back without the replicas (its engines died): the always-on model is started
    again, and the on-demand one, which nobody asked for, is let go without a start."""
    store = Member()
    demo = placed(store, sim("demo"), "n1")
    placed(store, sim("lazy", mode="on-demand"), "n1")
    hub = AgentHub(trio.current_time)
    rec = Reconciler(store, hub, clock=trio.current_time)
    agent = Agent(hub, "n1", [])
    async with trio.open_nursery() as nursery:
        store.leading = True
        await nursery.start(rec.run)
        await agent.attach(nursery)
        await trio.sleep(2)
        assert [(m["type"], m["replica_id"]) for m in agent.got if "replica_id" in m] == [("start_replica", demo)]
        assert {p.model for p in store.snapshot().placements.values()} == {"demo"}
        nursery.cancel_scope.cancel()


async def test_a_member_that_stops_leading_lets_its_agents_go(clock: trio.testing.MockClock) -> None:
    store = Member()
    store.leading = True
    hub, routes = AgentHub(trio.current_time), Routes()
    store.submit_nowait(commands.put_model(sim("demo"), 0.0))
    rec = Reconciler(store, hub, sinks=[routes], clock=trio.current_time)
    agent = Agent(hub, "n1", [])
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await agent.attach(nursery)
        await trio.sleep(2)
        published = len(routes.published)
        assert published >= 1
        store.leading = False
        with trio.fail_after(TIMEOUTS.reconcile_tick_s * 2):
            await agent.closed.wait()
        assert agent.got[-1] == {"type": "refused", "reason": "this member no longer leads"}
        # Led again: its first routes go out again, even if they equal the last ones of its earlier term.
        store.leading = True
        await trio.sleep(TIMEOUTS.reconcile_tick_s * 2)
        assert len(routes.published) == published + 1
        nursery.cancel_scope.cancel()


async def test_a_gateways_report_counts_before_the_new_leader_routed_anything(clock: trio.testing.MockClock) -> None:
    """The use a gateway reports on re-attach names replicas this leader never routed: they are
    known by their placements, so the use is not lost."""

    class Gateway:
        def __init__(self) -> None:
            self.used: dict[str, float] = {}

        def last_used(self) -> Mapping[str, float]:
            return self.used

        def take_activation_asks(self) -> Mapping[str, float]:
            return {}

        def outstanding(self) -> Mapping[str, int]:
            return {}

    store, hub, gateway = Member(), AgentHub(trio.current_time), Gateway()
    store.leading = True
    lazy = placed(store, sim("lazy", mode="on-demand"), "n1")
    rec = Reconciler(store, hub, demand=[gateway], clock=trio.current_time)
    gateway.used[lazy] = trio.current_time()
    await rec.run_once()
    assert "lazy" in hub.demand
