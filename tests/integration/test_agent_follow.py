"""An agent given every control URL finds the leader: it follows a standby's pointer
(`leader_url` in the refusal), goes past a dead URL at once, leaves a leader that steps down or
goes silent, and the leader lists it with its last contact. One trio run, real sockets."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import trio
from hypercorn.trio import serve as hyper_serve
from trio_websocket import WebSocketRequest, open_websocket_url, serve_websocket

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.testing import FakeGpuProbe, MemoryStore
from llmgw.wire import protocol
from llmgw.wire.asgi import hypercorn_config
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-agent-follow"
# Reconnects that take no backoff worth waiting for; a leader that goes quiet is left within 0.5 s.
FAST = dataclasses.replace(TIMEOUTS, agent_reconnect_min_s=0.05, agent_reconnect_max_s=0.2, agent_connect_s=0.5,
                           stream_heartbeat_s=0.15)
PROBE = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))


def agent_config(tmp_path: Path, leader: ControlHandle, *controls: str) -> AgentConfig:
    """Agent n1 with its in-memory credential from `leader` (`Context.local_credential`), which the standby
    of this test knows too; a fake member checks none."""
    assert leader.context is not None
    credential = leader.context.local_credential("agent", "n1")
    return AgentConfig(controls=list(controls), tls=None, local_credential=credential,
                       state_dir=tmp_path / "agent", node="n1", probe=PROBE, timeouts=FAST)


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[ControlHandle]:
    cfg = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=0, seed=Seed(admin_key=ADMIN), timeouts=FAST)
    async with trio.open_nursery() as nursery:
        yield await nursery.start(control_serve, cfg)
        nursery.cancel_scope.cancel()


class StandbyStore(MemoryStore):
    """A member that does not lead and knows who does."""

    def __init__(self, leader_url: str) -> None:
        super().__init__()
        self.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
        self.leader_url = leader_url

    def is_leader(self) -> bool:
        return False

    def status(self) -> dict[str, Any]:
        return {"leader": "10.9.9.9:7000", "leader_url": self.leader_url}


async def serve_standby(leader: ControlHandle, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A standby that knows the leader's machines (as every member of a group does)."""
    assert leader.context is not None
    store = StandbyStore(leader.admin_url)
    hub = AgentHub()
    app = make_app(Context(store=store, hub=hub, reconciler=Reconciler(store, hub), clock=lambda: 0.0,
                           self_id="standby", store_status=store.status,
                           local_machines=leader.context.local_machines))
    config = hypercorn_config("127.0.0.1", 0, logger="test.standby", graceful_s=FAST.admin_shutdown_grace_s,
                              keep_alive_s=FAST.admin_keep_alive_s)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(lambda task_status: hyper_serve(app, config, task_status=task_status))
        task_status.started(bound[0])


async def test_an_agent_goes_where_a_standby_points_and_past_a_dead_url(tmp_path: Path, leader: ControlHandle) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with trio.open_nursery() as nursery:
        standby = await nursery.start(serve_standby, leader)
        # Only a dead URL and the standby: the leader is found through the standby's pointer.
        with trio.fail_after(10):
            await nursery.start(agent_serve, agent_config(tmp_path, leader, dead, standby))
        assert "n1" in leader.hub.links
        with trio.fail_after(5):
            while leader.hub.replicas.get("n1") is None:
                await trio.sleep(0.02)
        listed = {a["node"]: a for a in leader.hub.agents()}
        assert listed["n1"]["connected"] is True and listed["n1"]["replicas"] == 0
        assert listed["n1"]["last_contact"] is not None
        nursery.cancel_scope.cancel()


async def test_an_agent_leaves_a_leader_that_steps_down_or_goes_silent(tmp_path: Path,
                                                                       leader: ControlHandle) -> None:
    """The first stream is welcomed and then refused ("no longer leads", pointing at the leader);
    the second is welcomed and then silent, the connection open. The agent ends up with the leader."""
    sessions: list[str] = []

    async def fickle(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()  # hello
        await ws.get_message()  # inventory
        await ws.send_message(protocol.dumps({"type": "welcome", "node": "n1", "leader": "fickle"}))
        sessions.append("steps down" if not sessions else "silent")
        if sessions[-1] == "steps down":
            await ws.send_message(protocol.dumps({"type": "refused", "reason": "this member no longer leads"}))
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, fickle, "127.0.0.1", 0, None)
        fickle_url = f"http://127.0.0.1:{server.port}"
        # The leader comes last: the agent reaches it only by leaving the other twice.
        nursery.start_soon(agent_serve, agent_config(tmp_path, leader, fickle_url, fickle_url,
                                                                    leader.admin_url))
        with trio.fail_after(10):
            while "n1" not in leader.hub.links:
                await trio.sleep(0.02)
        assert sessions == ["steps down", "silent"]
        # The leader's heartbeats keep it there: no stream is dropped for silence while it lives.
        connected_at = leader.hub.connected_at["n1"]
        await trio.sleep(FAST.stream_silence_s * 4)
        assert leader.hub.connected_at["n1"] == connected_at and "n1" in leader.hub.links
        nursery.cancel_scope.cancel()


async def test_a_leader_drops_an_agent_that_goes_silent(leader: ControlHandle) -> None:
    """A machine that vanishes closes no connection: the leader drops the stream of an agent
    that said nothing for `stream_silence_s`, so its replicas leave the routes."""
    assert leader.context is not None
    url = leader.admin_url.replace("http://", "ws://") + protocol.STREAM_PATH
    credential = leader.context.local_credential("agent", "mute")
    async with open_websocket_url(url, extra_headers=[(b"authorization", f"Bearer {credential}".encode())]) as ws:
        await ws.send_message(protocol.dumps({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": "mute"}))
        await ws.send_message(protocol.dumps({"type": "inventory", "inventory": PROBE.inventory("mute").to_doc()}))
        assert protocol.loads(await ws.get_message())["type"] == "welcome"
        assert "mute" in leader.hub.links
        with trio.fail_after(FAST.stream_silence_s * 10):
            while "mute" not in leader.hub.lost:
                await trio.sleep(0.02)
        assert "mute" not in leader.hub.links
        assert [a["connected"] for a in leader.hub.agents() if a["node"] == "mute"] == [False]
