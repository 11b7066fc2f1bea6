"""The control role's loop, in one process: real reconciler, hub, router and
MemoryStore (the real `apply`), a scripted agent at the stream's edge, and a
MockClock so backoffs, parking and grace periods take no real time."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import trio
import trio.testing

from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.gateway.router import NoEndpoint, Router
from llmgw.testing import MemoryStore


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class ScriptedAgent:
    """Answers start/stop like a real agent would, with outcomes the test chooses."""

    def __init__(self, hub: AgentHub, node: str, *, fail: set[str] = frozenset(), engines: tuple[str, ...] = ("sim",)):
        self.hub = hub
        self.node = node
        self.fail = set(fail)  # model names whose engines fail to start
        self.engines = engines
        self.replicas: dict[str, ReplicaObs] = {}
        self.starts: list[str] = []
        self.link: Any = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        send, receive = trio.open_memory_channel[dict[str, Any]](100)
        self.link = self.hub.connect(self.node, send)
        self.hub.report_inventory(self.link, NodeInfo(self.node, cpus=4, engines=self.engines))
        task_status.started()
        try:
            async for message in receive:
                rid = message["replica_id"]
                if message["type"] == "start_replica":
                    model = message["model"]["name"]
                    self.starts.append(rid)
                    self.replicas[rid] = ReplicaObs(rid, model, self.node, "starting")
                    self._report()
                    await trio.sleep(0.5)  # an engine takes a moment to load
                    if model in self.fail:
                        self.replicas[rid] = ReplicaObs(rid, model, self.node, "failed", error="unknown architecture kev")
                    else:
                        self.replicas[rid] = ReplicaObs(rid, model, self.node, "ready", url=f"http://10.0.0.1:{len(self.starts)}")
                    self._report()
                else:
                    self.replicas.pop(rid, None)
                    self._report()
        finally:
            self.hub.disconnect(self.link)

    def _report(self) -> None:
        self.hub.report_replicas(self.link, list(self.replicas.values()))


def sim(name: str, **extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", **extra})


async def start_loop(
    nursery: trio.Nursery, store: MemoryStore, hub: AgentHub, router: Router, timeouts: Timeouts = TIMEOUTS
) -> Reconciler:
    rec = Reconciler(store, hub, sinks=[router], demand=[router], clock=trio.current_time, timeouts=timeouts)
    await nursery.start(rec.run)
    return rec


async def test_model_becomes_routable(clock: trio.testing.MockClock) -> None:
    store, hub, router = MemoryStore(), AgentHub(trio.current_time), Router()
    store.submit_nowait(commands.put_model(sim("demo"), 0.0))
    async with trio.open_nursery() as nursery:
        agent = ScriptedAgent(hub, "n1")
        await nursery.start(agent.run)
        await start_loop(nursery, store, hub, router)
        async with router.acquire("demo", deadline=trio.current_time() + 10) as endpoint:
            assert endpoint.replica_id == "demo-r1"
            assert endpoint.url == "http://10.0.0.1:1"
        assert agent.starts == ["demo-r1"]
        assert [p.node for p in store.snapshot().placements.values()] == ["n1"]
        nursery.cancel_scope.cancel()


async def test_failing_model_backs_off_then_parks(clock: trio.testing.MockClock) -> None:
    store, hub, router = MemoryStore(), AgentHub(trio.current_time), Router()
    store.submit_nowait(commands.put_model(sim("kev"), 0.0))
    async with trio.open_nursery() as nursery:
        agent = ScriptedAgent(hub, "n1", fail={"kev"})
        await nursery.start(agent.run)
        t0 = trio.current_time()
        await start_loop(nursery, store, hub, router)
        while not store.snapshot().model_health("kev").parked:
            await store.wait_changed(store.snapshot().revision)
        parked_at = trio.current_time() - t0
        # five starts, with 1 + 2 + 4 + 8 s of backoff between them (plus load time)
        assert len(agent.starts) == 5
        assert 15 <= parked_at < 25
        health = store.snapshot().model_health("kev")
        assert health.failures_in_row == 5 and "unknown architecture kev" in health.last_error
        await trio.sleep(600)  # parked means never placed again, however long we wait
        assert len(agent.starts) == 5
        assert not store.snapshot().placements_of("kev")
        route = router.route("kev")
        assert route is not None and route.state == "parked" and "unknown architecture kev" in route.reason
        with pytest.raises(NoEndpoint) as refused:
            async with router.acquire("kev", deadline=trio.current_time() + 120):
                pass
        assert refused.value.code == "model_parked"
        # `ctl model retry` clears it: placed again at once
        store.submit_nowait(commands.retry_model("kev", trio.current_time()))
        await trio.sleep(1)
        assert len(agent.starts) == 6
        nursery.cancel_scope.cancel()


async def test_lost_node_keeps_placements_for_the_grace_then_moves_them(clock: trio.testing.MockClock) -> None:
    # Not the default grace (30 s): the one the reconciler's config carries is the one honoured.
    grace = 100.0
    timeouts = dataclasses.replace(TIMEOUTS, lost_node_grace_s=grace)
    store, hub, router = MemoryStore(), AgentHub(trio.current_time, timeouts), Router()
    store.submit_nowait(commands.put_model(sim("demo"), 0.0))
    async with trio.open_nursery() as nursery:
        a1 = ScriptedAgent(hub, "n1")
        a1_scope = trio.CancelScope()

        async def run_a1(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with a1_scope:
                await a1.run(task_status=task_status)

        await nursery.start(run_a1)
        await start_loop(nursery, store, hub, router, timeouts)
        await trio.sleep(2)
        assert [p.node for p in store.snapshot().placements.values()] == ["n1"]
        a2 = ScriptedAgent(hub, "n2")
        await nursery.start(a2.run)
        a1_scope.cancel()  # n1's stream drops
        await trio.sleep(grace - 5)
        assert [p.node for p in store.snapshot().placements.values()] == ["n1"], "moved before the grace ended"
        await trio.sleep(10)
        assert [p.node for p in store.snapshot().placements.values()] == ["n2"]
        async with router.acquire("demo", deadline=trio.current_time() + 10) as endpoint:
            assert endpoint.replica_id in a2.replicas
        nursery.cancel_scope.cancel()


async def test_no_placement_warning_is_throttled(clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    store, hub, router = MemoryStore(), AgentHub(trio.current_time), Router()
    store.submit_nowait(commands.put_model(ModelDef.from_doc(
        {"name": "phi", "engine": "vllm", "source": "hf://microsoft/phi-4"}), 0.0))
    caplog.set_level(logging.WARNING, logger="llmgw.control.reconciler")
    async with trio.open_nursery() as nursery:
        await nursery.start(ScriptedAgent(hub, "n1").run)
        await start_loop(nursery, store, hub, router)
        await trio.sleep(9 * 60)  # hundreds of passes
        warnings = [r.getMessage() for r in caplog.records if "no placement for phi" in r.getMessage()]
        assert len(warnings) == 1
        assert "node has no GPU" in warnings[0]
        await trio.sleep(2 * 60)  # past the ten-minute repeat
        warnings = [r for r in caplog.records if "no placement for phi" in r.getMessage()]
        assert len(warnings) == 2
        route = router.route("phi")
        assert route is not None and route.state == "unplaceable"
        nursery.cancel_scope.cancel()


async def test_on_demand_model_is_activated_by_a_request(clock: trio.testing.MockClock) -> None:
    store, hub, router = MemoryStore(), AgentHub(trio.current_time), Router()
    store.submit_nowait(commands.put_model(sim("lazy", mode="on-demand", idle_timeout_s=300), 0.0))
    async with trio.open_nursery() as nursery:
        agent = ScriptedAgent(hub, "n1")
        await nursery.start(agent.run)
        await start_loop(nursery, store, hub, router)
        await trio.sleep(30)
        assert agent.starts == [], "an on-demand model nobody asked for must not start"
        async with router.acquire("lazy", deadline=trio.current_time() + 60) as endpoint:
            assert endpoint.replica_id == "lazy-r1"
        # unused past its idle timeout, it is stopped again
        await trio.sleep(400)
        assert not store.snapshot().placements_of("lazy")
        assert agent.replicas == {}
        nursery.cancel_scope.cancel()


async def test_serving_stopped_frees_everything_and_start_restores(clock: trio.testing.MockClock) -> None:
    store, hub, router = MemoryStore(), AgentHub(trio.current_time), Router()
    store.submit_nowait(commands.put_model(sim("demo"), 0.0))
    async with trio.open_nursery() as nursery:
        agent = ScriptedAgent(hub, "n1")
        await nursery.start(agent.run)
        await start_loop(nursery, store, hub, router)
        await trio.sleep(2)
        store.submit_nowait(commands.put_setting("serving.stopped", True, trio.current_time()))
        await trio.sleep(2)
        assert agent.replicas == {} and not store.snapshot().placements
        route = router.route("demo")
        assert route is not None and route.state == "stopped"
        store.submit_nowait(commands.put_setting("serving.stopped", False, trio.current_time()))
        async with router.acquire("demo", deadline=trio.current_time() + 10):
            pass
        assert "demo" in store.snapshot().models, "stopping never changes a definition"
        nursery.cancel_scope.cancel()
