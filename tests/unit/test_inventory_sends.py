"""An agent sends its inventory when it changed, plus a slow refresh (`inventory_refresh_s`): a GPU node's
readings (utilisation, temperature, power, processes, small moves of used memory) move at every look and
must not make every observation news. `changed` by example and by property; the agent's observe loop and
report loop on a MockClock, the GPU probe (the world's edge) faked with readings that never hold still."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.agent import service
from llmgw.agent.inventory import GPU_READINGS, MEMORY_STEP, changed
from llmgw.agent.storage import StorageScanner
from llmgw.agent.supervisor import Supervisor
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.domain.timeouts import TIMEOUTS

GIB = 1 << 30
CARD = Gpu(0, "GPU-0", "NVIDIA H100", "h100-80g", 80 * GIB, 2 * GIB, utilization=0.0, temperature_c=40.0,
           power_w=70.0)
INFO = NodeInfo("n1", hostname="h1", cpus=16, memory_total=128 * GIB, gpus=(CARD, dataclasses.replace(
    CARD, index=1, uuid="GPU-1")), engines=("sim",))
RESCAN = TIMEOUTS.storage_rescan_s


def moved(info: NodeInfo, step: int) -> NodeInfo:
    """`info` with every GPU reading moved, as a busy card's are from one look to the next."""
    return dataclasses.replace(info, gpus=tuple(dataclasses.replace(
        g, utilization=float(step % 100), temperature_c=40.0 + step % 9, power_w=70.0 + step % 13,
        processes=(1000 + step,), memory_used=(g.memory_used or 0) + (step % 5) * (1 << 20)) for g in info.gpus))


# --- which observations count as changed -------------------------------------------------------------


def test_readings_alone_are_no_change_and_anything_else_is() -> None:
    assert not changed(INFO, moved(INFO, 7))
    sick = dataclasses.replace(CARD, healthy=False, reason="Xid 79: fell off the bus")
    assert changed(INFO, dataclasses.replace(INFO, gpus=(sick, INFO.gpus[1])))
    assert changed(INFO, dataclasses.replace(INFO, gpus=INFO.gpus[:1])), "a card gone"
    assert changed(INFO, dataclasses.replace(INFO, engines=("sim", "vllm"))), "an engine installed"
    assert changed(INFO, dataclasses.replace(INFO, storage=({"path": "/models", "models": []},)))
    assert changed(INFO, dataclasses.replace(INFO, reserved_gpus=(1,)))


def test_every_gpu_field_but_the_readings_counts() -> None:
    other: dict[type, Any] = {int: 7, str: "other", bool: False, float: 1.5}
    for f in dataclasses.fields(Gpu):
        if f.name in GPU_READINGS or f.name == "parent_index":
            continue
        value = other[type(getattr(CARD, f.name))]
        assert changed(INFO, dataclasses.replace(INFO, gpus=(dataclasses.replace(CARD, **{f.name: value}),
                                                             INFO.gpus[1]))), f.name


def test_used_memory_counts_once_it_moved_by_a_step_of_the_card() -> None:
    step = int(MEMORY_STEP * CARD.memory_total)
    with_used = [dataclasses.replace(INFO, gpus=(dataclasses.replace(CARD, memory_used=used), INFO.gpus[1]))
                 for used in (CARD.memory_used, (CARD.memory_used or 0) + step - 1, (CARD.memory_used or 0) + step)]
    assert not changed(INFO, with_used[1]), "an engine's allocator breathing"
    assert changed(INFO, with_used[2]), "an engine loaded, or another program took the card"
    assert changed(INFO, dataclasses.replace(INFO, gpus=(dataclasses.replace(CARD, memory_used=None),
                                                         INFO.gpus[1]))), "used memory became unknown"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_property_moving_readings_never_count_and_changed_is_symmetric(a: int, b: int) -> None:
    one, other = moved(INFO, a), moved(INFO, b)
    assert not changed(one, other) and not changed(other, one)
    unhealthy = dataclasses.replace(other, gpus=(dataclasses.replace(other.gpus[0], healthy=False), other.gpus[1]))
    assert changed(one, unhealthy) and changed(unhealthy, one)


# --- the agent: observe loop and report loop on a MockClock -------------------------------------------


class BusyProbe:
    """A `GpuProbe` (the NVML edge, faked) whose readings move at every look; `info` is what it reports
    apart from them (a test changes it), `calls` how many looks it took."""

    def __init__(self, info: NodeInfo) -> None:
        self.info = info
        self.calls = 0

    def inventory(self, node: str) -> NodeInfo:
        self.calls += 1
        return moved(dataclasses.replace(self.info, node=node), self.calls)


class Sent:
    def __init__(self) -> None:
        self.inventories: list[tuple[float, dict[str, Any]]] = []
        self.arrived = trio.Event()

    async def send(self, text: str) -> None:
        message = json.loads(text)
        if message["type"] == "inventory":
            self.inventories.append((trio.current_time(), message["inventory"]))
            self.arrived.set()

    async def next(self) -> None:
        self.arrived = trio.Event()
        await self.arrived.wait()


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def observations(probe: BusyProbe, n: int) -> None:
    """Until the agent took `n` more looks after the one in progress: each one before the last is decided
    (the loop decides one look before it sleeps and takes the next). The probe runs in a worker thread the
    MockClock cannot see, so this counts looks, not seconds."""
    until = probe.calls + n
    while probe.calls < until:
        await trio.sleep(RESCAN / 7)


@asynccontextmanager
async def running(tmp_path: Path, refresh_s: float, heartbeat_s: float = TIMEOUTS.stream_heartbeat_s,
                  ) -> AsyncIterator[tuple[BusyProbe, Sent, Any]]:
    probe, sent = BusyProbe(INFO), Sent()
    timeouts = dataclasses.replace(TIMEOUTS, inventory_refresh_s=refresh_s)
    config = service.AgentConfig(controls=["http://c"], tls=None, state_dir=tmp_path, node="n1", probe=probe,
                                 timeouts=timeouts)
    scanner = StorageScanner(())
    link = service._Link(await service._observe_once(config, scanner))
    async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
        supervisor = Supervisor(nursery, node="n1", host="127.0.0.1", engine_dir=tmp_path / "engines",
                                on_change=link.mark, http=http)
        nursery.start_soon(service._observe, config, scanner, link)
        # As after the hello: the first inventory went with it.
        nursery.start_soon(service._report, sent.send, supervisor, link, link.inventory, heartbeat_s)
        yield probe, sent, link
        nursery.cancel_scope.cancel()


async def test_an_unchanged_inventory_is_not_sent_and_a_changed_one_once(clock: trio.testing.MockClock,
                                                                       tmp_path: Path) -> None:
    async with running(tmp_path, refresh_s=1e9) as (probe, sent, link):
        await observations(probe, 10)
        assert sent.inventories == [], "ten looks whose readings moved: nothing sent"
        probe.info = dataclasses.replace(INFO, engines=("sim", "vllm"))  # vLLM installed on the node
        await observations(probe, 6)
        assert [doc["engines"] for _, doc in sent.inventories] == [["sim", "vllm"]], "sent once, not at every look"
        assert link.inventory.engines == ("sim", "vllm")


async def test_the_slow_refresh_sends_the_readings(clock: trio.testing.MockClock, tmp_path: Path) -> None:
    refresh = 4 * RESCAN
    # No timer but the agent's own while its probe runs in a worker thread (no heartbeat, the test waits on
    # sends): the MockClock has nothing to jump to meanwhile, so each look comes exactly RESCAN after the last.
    async with running(tmp_path, refresh_s=refresh, heartbeat_s=math.inf) as (probe, sent, _):
        start, looks = trio.current_time(), probe.calls
        for _ in range(3):
            await sent.next()
        times = [start, *(at for at, _ in sent.inventories)]
        assert all(later - earlier >= refresh for earlier, later in zip(times, times[1:])), "never before it is due"
        assert probe.calls - looks >= 3 * 4, "one send per refresh, not per look"
        temperatures = {doc["gpus"][0]["temperature_c"] for _, doc in sent.inventories}
        assert len(temperatures) > 1 or len({doc["gpus"][0]["utilization"] for _, doc in sent.inventories}) > 1, \
            "each refresh carries the readings of its look"
