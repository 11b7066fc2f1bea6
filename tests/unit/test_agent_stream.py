"""Both ends of an agent's stream, driven message by message on a MockClock: a silent peer is
taken for gone within three heartbeat intervals, each way; a malformed message is rejected
with its reason and the stream goes on; a repeated inventory updates the node; a node gone
past its grace period is lost, and only then can be forgotten."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from llmgw.agent import service
from llmgw.agent.storage import StorageDir, StorageScanner
from llmgw.agent.supervisor import Supervisor
from llmgw.control.agent_stream import session
from llmgw.control.hub import AgentHub
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import SILENT_BEATS, TIMEOUTS
from llmgw.testing import FakeGpuProbe
from llmgw.wire import protocol
from llmgw.wire.follow import Silent

T = TIMEOUTS
BEAT = T.stream_heartbeat_s
INFO = NodeInfo("n1", hostname="h1", cpus=4)
Clock = trio.testing.MockClock  # each test names it: pytest-trio runs a test on the clock among its own arguments


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Pipe:
    """One end's view of a stream: what the peer sent (`incoming`), what this end sent (`sent`,
    decoded, with the MockClock time it was sent)."""

    def __init__(self) -> None:
        self.to_end, self.incoming = trio.open_memory_channel[str](100)
        self.sent: list[tuple[float, dict[str, Any]]] = []

    async def receive(self) -> str:
        return await self.incoming.receive()

    async def send(self, text: str) -> None:
        self.sent.append((trio.current_time(), json.loads(text)))

    async def peer_says(self, message: dict[str, Any] | str) -> None:
        await self.to_end.send(message if isinstance(message, str) else protocol.dumps(message))
        await trio.testing.wait_all_tasks_blocked()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for _, m in self.sent if m.get("type") == kind]


async def wait_until(predicate: Any) -> float:
    """The MockClock time at which `predicate()` became true."""
    while not predicate():
        await trio.sleep(BEAT / 100)
    return trio.current_time()


# --- the leader's end ---------------------------------------------------------------------------

Leader = tuple[AgentHub, "Pipe"]


@pytest.fixture
async def leader(clock: Clock) -> AsyncIterator[tuple[AgentHub, Pipe]]:
    hub, pipe = AgentHub(trio.current_time, T), Pipe()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(session, pipe.receive, pipe.send, hub, is_leader=lambda: True,
                                   leader_info=dict, self_id="m1"))
        await pipe.peer_says({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": "n1", "version": "t"})
        await pipe.peer_says({"type": "inventory", "inventory": INFO.to_doc()})
        assert pipe.of_type("welcome") and "n1" in hub.links
        yield hub, pipe
        nursery.cancel_scope.cancel()


async def test_the_leader_takes_a_silent_agent_for_gone_within_three_intervals(clock: Clock, leader: Leader) -> None:
    hub, pipe = leader
    for _ in range(5):  # an agent that beats on time stays, however long
        await trio.sleep(BEAT)
        await pipe.peer_says({"type": "heartbeat"})
    assert "n1" in hub.links
    silent_from = trio.current_time()  # the agent stops (SIGSTOP, a cable pulled): nothing closes
    gone_at = await wait_until(lambda: "n1" not in hub.links)
    assert (SILENT_BEATS - 1) * BEAT < gone_at - silent_from <= SILENT_BEATS * BEAT + BEAT / 50
    assert hub.node_state("n1") == "disconnected" and hub.lost["n1"] == pytest.approx(gone_at, abs=BEAT / 50)


async def test_the_leader_beats_when_it_has_nothing_to_say(clock: Clock, leader: Leader) -> None:
    hub, pipe = leader
    for _ in range(4):
        await trio.sleep(BEAT)
        await pipe.peer_says({"type": "heartbeat"})
    beats = [at for at, m in pipe.sent if m["type"] == "heartbeat"]
    assert len(beats) >= 3 and all(b - a <= BEAT * 1.01 for a, b in zip(beats, beats[1:]))


async def test_a_malformed_report_is_rejected_and_the_stream_goes_on(clock: Clock, leader: Leader) -> None:
    hub, pipe = leader
    await pipe.peer_says({"type": "replicas", "replicas": [{"replica_id": "demo-r1", "state": "dancing"}]})
    await pipe.peer_says("{not json")
    await pipe.peer_says({"type": "inventory", "inventory": {"cpus": "many"}})
    await pipe.peer_says({"type": "replica_metrics", "whatever": 1})  # a newer agent: ignored
    await trio.sleep(BEAT / 10)  # the answers go out through the stream's queue
    rejected = pipe.of_type("rejected")
    assert [(r["message_type"], r["reason"].split(":")[0]) for r in rejected] == [
        ("replicas", "replicas[0].state"), ("?", "not JSON"), ("inventory", "inventory.cpus")]
    assert "n1" in hub.links and hub.nodes["n1"].cpus == 4, "the node and its last good inventory stand"
    await pipe.peer_says({"type": "replicas", "replicas": [{"replica_id": "demo-r1", "model": "demo",
                                                            "state": "ready", "url": "http://h1:9"}]})
    assert hub.replicas["n1"]["demo-r1"].state == "ready"


async def test_a_repeated_inventory_updates_the_node(clock: Clock, leader: Leader) -> None:
    hub, pipe = leader
    changed = hub.change_event()
    storage = ({"path": "/models", "fabric": "ib-a", "shared": True, "models": [], "not_weights": [], "error": ""},)
    await pipe.peer_says({"type": "inventory", "inventory": NodeInfo("n1", cpus=4, storage=storage).to_doc()})
    assert hub.nodes["n1"].storage == storage and changed.is_set()


async def test_a_bad_opening_is_refused_with_its_reason(clock: trio.testing.MockClock) -> None:
    for opening, reason in (
        ([{"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": "../n1", "version": ""}], "hello.node"),
        ([{"type": "hello", "protocol": 99, "node": "n1", "version": ""}], "unsupported protocol"),
        ([{"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": "n1", "version": ""},
          {"type": "inventory", "inventory": {"gpus": [{"index": "zero"}]}}], "inventory.gpus[0].index"),
    ):
        hub, pipe = AgentHub(trio.current_time, T), Pipe()
        for message in opening:
            await pipe.to_end.send(protocol.dumps(message))
        await session(pipe.receive, pipe.send, hub, is_leader=lambda: True, leader_info=dict, self_id="m1")
        [refused] = pipe.of_type("refused")
        assert reason in refused["reason"] and not hub.links and not hub.lost


# --- the leader's memory of lost nodes ------------------------------------------------------------


async def test_a_node_is_lost_after_its_grace_period_and_only_then_forgotten(clock: trio.testing.MockClock) -> None:
    hub = AgentHub(trio.current_time, T)
    send, _ = trio.open_memory_channel[dict[str, Any]](1)
    link = hub.connect("n1", send)
    assert hub.node_state("n1") == "connected"
    assert "connected" in (hub.forget("n1") or "")
    hub.disconnect(link)
    assert hub.node_state("n1") == "disconnected"
    assert "grace period" in (hub.forget("n1") or "")
    await trio.sleep(T.lost_node_grace_s)
    assert hub.node_state("n1") == "lost", "gone past its grace period: lost, and still listed"
    assert [a["state"] for a in hub.agents()] == ["lost"]
    assert hub.forget("n1") is None
    assert hub.node_state("n1") == "unknown" and hub.agents() == [] and "n1" not in hub.observed().lost
    assert "no node named 'n1'" in (hub.forget("n1") or "")
    hub.connect("n1", send)  # a forgotten node that comes back simply reappears
    assert hub.node_state("n1") == "connected"


async def test_a_new_leader_counts_the_placed_nodes_that_never_come_as_lost(clock: trio.testing.MockClock) -> None:
    hub = AgentHub(trio.current_time, T)
    hub.take_office(["gpu-1", "gpu-2"])
    assert hub.node_state("gpu-1") == "disconnected"
    await trio.sleep(T.lost_node_grace_s)
    assert hub.node_state("gpu-2") == "lost", "shown as lost, not dropped with its placements"


# --- the agent's end ---------------------------------------------------------------------------


@dataclass
class Agent:
    pipe: Pipe
    supervisor: Supervisor
    link: Any  # the session's _Link
    outcome: dict[str, BaseException]  # "error": how the session ended


@pytest.fixture
async def agent(clock: trio.testing.MockClock, tmp_path: Path) -> AsyncIterator[Agent]:
    """The agent's session with a control that welcomed it."""
    config = service.AgentConfig(controls=["http://c"], tls=None, state_dir=tmp_path, node="n1",
                                 probe=FakeGpuProbe(INFO))
    pipe, outcome = Pipe(), dict[str, BaseException]()
    link = service._Link(INFO)
    async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
        supervisor = Supervisor(nursery, node="n1", host="127.0.0.1", engine_dir=tmp_path / "engines",
                                on_change=link.mark, http=http)

        async def run() -> None:
            try:
                await service._session(pipe.receive, pipe.send, "http://c", config, supervisor, link,
                                       lambda member, note: None)
            except BaseException as e:  # noqa: BLE001 - the test reads how the session ended
                outcome["error"] = e

        nursery.start_soon(run)
        await pipe.peer_says({"type": "welcome", "node": "n1", "leader": "m1"})
        assert [m["type"] for _, m in pipe.sent][:2] == ["hello", "inventory"]
        yield Agent(pipe, supervisor, link, outcome)
        nursery.cancel_scope.cancel()


async def test_the_agent_takes_a_silent_control_for_gone_within_three_intervals(clock: Clock, agent: Agent) -> None:
    pipe, outcome = agent.pipe, agent.outcome
    for _ in range(5):
        await trio.sleep(BEAT)
        await pipe.peer_says({"type": "heartbeat"})
    assert "error" not in outcome
    silent_from = trio.current_time()
    gone_at = await wait_until(lambda: "error" in outcome)
    assert (SILENT_BEATS - 1) * BEAT < gone_at - silent_from <= SILENT_BEATS * BEAT + BEAT / 50
    assert any(isinstance(e, Silent) for e in _leaves(outcome["error"]))
    beats = [at for at, m in pipe.sent if m["type"] == "heartbeat"]
    assert beats and all(b - a <= BEAT * 1.01 for a, b in zip(beats, beats[1:])), "the agent beats too"


async def test_a_malformed_command_is_rejected_and_harms_nothing(clock: Clock, agent: Agent) -> None:
    pipe, supervisor, outcome = agent.pipe, agent.supervisor, agent.outcome
    model = {"name": "demo", "engine": "sim", "source": "sim://demo"}
    for bad in (
        {"type": "start_replica", "model": model, "gpus": []},  # no replica_id: a KeyError once
        {"type": "start_replica", "replica_id": "../../escape", "model": model, "gpus": []},
        {"type": "start_replica", "replica_id": "demo-r1", "model": {"name": "demo"}, "gpus": []},
        {"type": "start_replica", "replica_id": "demo-r1", "model": model, "gpus": ["0"]},
        {"type": "stop_replica"},
    ):
        await pipe.peer_says(bad)
    await pipe.peer_says("\x00garbage")
    await pipe.peer_says({"type": "drain", "x": 1})  # a newer control's message: ignored
    await trio.sleep(BEAT / 10)
    reasons = [(r["message_type"], r["reason"].split(":")[0], r["replica_id"]) for r in pipe.of_type("rejected")]
    assert reasons == [
        ("start_replica", "start_replica.replica_id", None),
        ("start_replica", "start_replica.replica_id", None),
        ("start_replica", "start_replica.model", "demo-r1"),
        ("start_replica", "start_replica.gpus[0]", "demo-r1"),
        ("stop_replica", "stop_replica.replica_id", None),
        ("?", "not JSON", None),
    ]
    assert supervisor.replicas() == [] and "error" not in outcome, "nothing started, and the stream goes on"
    await pipe.peer_says({"type": "heartbeat"})
    await trio.sleep(BEAT)
    assert "error" not in outcome


async def test_the_agent_sends_its_inventory_again_when_it_changed(clock: Clock, agent: Agent) -> None:
    await trio.sleep(BEAT * 2)
    assert len(agent.pipe.of_type("inventory")) == 1, "an inventory that did not change is not sent again"
    storage = ({"path": "/models", "fabric": "ib-a", "shared": True, "models": [], "not_weights": [], "error": ""},)
    agent.link.inventory = NodeInfo("n1", cpus=4, storage=storage)  # what the next rescan found
    agent.link.mark()
    await trio.testing.wait_all_tasks_blocked()
    sent = agent.pipe.of_type("inventory")
    assert len(sent) == 2 and sent[-1]["inventory"]["storage"] == list(storage)


async def test_the_agent_observes_its_node_again_every_rescan(clock: Clock, tmp_path: Path) -> None:
    """The inventory carries what the agent was told (engine host, fabric) and the storage scan;
    a rescan that finds something else replaces it (and marks the stream), one that finds the
    same does not."""
    models = tmp_path / "models"
    models.mkdir()
    probe = FakeGpuProbe(INFO)
    config = service.AgentConfig(controls=["http://c"], tls=None, state_dir=tmp_path, node="n1", probe=probe,
                                 engine_host="10.0.0.7", fabric="ib-a", storage=(StorageDir(models, "lab"),))
    scanner = StorageScanner(config.storage)
    link = service._Link(await service._observe_once(config, scanner))
    first = link.inventory
    assert (first.node, first.address, first.fabric) == ("n1", "10.0.0.7", "ib-a")
    assert [(s["path"], s["fabric"], s["shared"], s["models"]) for s in first.storage] == [(str(models), "lab",
                                                                                             False, [])]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service._observe, config, scanner, link)
        await trio.sleep(T.storage_rescan_s * 1.5)
        assert link.inventory is first and not link.dirty.is_set(), "nothing changed: nothing to send"
        models.rmdir()  # the directory vanished: the report says so
        # The scan runs in a worker thread, which the mock clock cannot see: it may jump past the
        # next rescan while the thread still reads. So wait for the word, in bounded steps.
        for _ in range(200_000):  # each step costs microseconds of real time
            if link.dirty.is_set():
                break
            await trio.sleep(T.storage_rescan_s / 10)
        assert link.inventory.storage[0]["error"] and link.dirty.is_set()
        nursery.cancel_scope.cancel()


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)]
    return [error]
