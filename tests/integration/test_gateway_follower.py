"""A remote gateway (`llmgw.gateway.follower`) in one trio run with a real control plane, an
agent and a sim engine process, over real sockets: it follows the leader's table (routes,
keys, models, `serving.stopped`), sends its demand back, serves from its last table while
no leader answers, says how old that table is, and re-attaches when control returns."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import pytest
import trio
from hypercorn.trio import serve as hyper_serve
from trio_websocket import WebSocketRequest, serve_websocket

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.gateway_stream import GatewayHub
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.follower import GatewayConfig, GatewayHandle
from llmgw.gateway.follower import serve as gateway_serve
from llmgw.testing import FakeGpuProbe, MemoryStore
from llmgw.trust.ca import Identity
from llmgw.wire import protocol
from llmgw.wire.asgi import hypercorn_config
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-admin-follower-test", "sk-client-follower-test"
# Heartbeats every 0.2 s and quick reconnects: real sockets need real time, so keep it short.
FAST = dataclasses.replace(TIMEOUTS, gateway_heartbeat_s=0.2, gateway_silence_s=2.0, gateway_reconnect_min_s=0.05,
                           gateway_reconnect_max_s=0.3, gateway_demand_report_s=0.05)
# An agent that does not come back within the test (it waits 30 s or more after losing control),
# so the restarted control knows no replica while the gateway re-attaches.
SLOW_AGENT = dataclasses.replace(FAST, agent_reconnect_min_s=60.0, agent_reconnect_max_s=60.0)
CHAT = "/v1/chat/completions"


def control_config(state: Path, raft_port: int, admin_port: int) -> ControlConfig:
    seed = Seed(admin_key=ADMIN, client_key=CLIENT,
                models=[ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"})])
    return ControlConfig(state_dir=state, raft_addr=f"127.0.0.1:{raft_port}", admin_host="127.0.0.1",
                         admin_port=admin_port, seed=seed, timeouts=FAST)


def gateway_config(*controls: str, credential: str | None) -> GatewayConfig:
    """A gateway with the in-memory credential of a control plane in this process (`Context.local_credential`);
    a fake member that checks none takes any."""
    return GatewayConfig(controls=list(controls), tls=None, local_credential=credential, listen_port=0,
                         name="gw-test", timeouts=FAST)


def local_machines(control: ControlHandle) -> dict[str, Identity]:
    """The machines' credentials `control` knows (`Context.local_machines`): a restarted control plane
    or a standby of this test is given the same, as every member of a group knows its machines."""
    assert control.context is not None
    return control.context.local_machines


async def until(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    with trio.fail_after(timeout):
        while not await check():
            await trio.sleep(0.02)


def chat(text: str) -> dict[str, Any]:
    return {"model": "demo", "messages": [{"role": "user", "content": text}]}


async def test_a_gateway_follows_the_leader_and_outlives_it(tmp_path: Path) -> None:
    raft_port, admin_port = free_port(), free_port()
    admin_url = f"http://127.0.0.1:{admin_port}"
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run_control(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await control_serve(control_config(tmp_path / "control", raft_port, admin_port),
                                    task_status=task_status)

        control: ControlHandle = await nursery.start(run_control)
        assert control.context is not None
        agent_credential = control.context.local_credential("agent", "n1")
        gateway_credential = control.context.local_credential("gateway", "gw-test")
        machines = dict(local_machines(control))
        await nursery.start(agent_serve, AgentConfig(controls=[admin_url], tls=None, local_credential=agent_credential,
                                                     state_dir=tmp_path / "agent", node="n1", probe=probe,
                                                     timeouts=SLOW_AGENT))
        gw: GatewayHandle = await nursery.start(gateway_serve, gateway_config(admin_url, credential=gateway_credential))
        async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"}) as http, \
                httpx.AsyncClient(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}) as api:

            async def health() -> dict[str, Any]:
                doc: dict[str, Any] = (await http.get("/health")).json()
                return doc

            # A request through the remote gateway is answered by the sim engine.
            async def demo_answers() -> bool:
                r = await http.post(CHAT, json=chat("through a remote gateway"))
                return r.status_code == 200
            await until(demo_answers, 30)
            r = await http.post(CHAT, json=chat("through a remote gateway"))
            assert r.json()["choices"][0]["message"]["content"] == "sim says: through a remote gateway"
            doc = await health()
            assert doc["status"] == "ok" and doc["leader"] == admin_url
            assert doc["table_age_s"] is not None and doc["table_age_s"] < 1.0
            assert control.gateways is not None and [g["name"] for g in control.gateways.gateways()] == ["gw-test"]

            # A model added through the admin API is listed by the gateway within a second.
            added = await api.post("/api/v1/models", json={"name": "lazy", "engine": "sim", "source": "sim://lazy",
                                                           "mode": "on-demand"})
            assert added.status_code == 201

            async def lazy_listed() -> bool:
                return "lazy" in [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
            await until(lazy_listed, 1.0)

            # The on-demand model starts because the gateway's demand reaches the leader.
            with trio.fail_after(30):
                r = await http.post(CHAT, json={**chat("wake up"), "model": "lazy"})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "sim says: wake up"

            # Control goes away: the gateway keeps serving from its table, and says how old it is.
            scope.cancel()

            async def detached() -> bool:
                return (await health())["leader"] is None
            await until(detached, 5)
            r = await http.post(CHAT, json=chat("no leader"))
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "sim says: no leader"
            before = (await health())["table_age_s"]
            await trio.sleep(0.5)
            after = (await health())["table_age_s"]
            assert before is not None and after >= before + 0.4, (before, after)

            # Control comes back: the gateway re-attaches and its table is fresh again. The agent has
            # not come back, and until it reports, the new leader's routes (no endpoints yet) are not
            # sent: the gateway keeps routing to the engine, which never stopped.
            scope = trio.CancelScope()
            control = await nursery.start(run_control)
            local_machines(control).update(machines)  # before it answers a stream: no await in between

            async def reattached() -> bool:
                doc = await health()
                return doc["leader"] == admin_url and doc["table_age_s"] is not None and doc["table_age_s"] < 1.0
            await until(reattached, 10)
            assert "n1" not in control.hub.replicas
            with trio.fail_after(2):
                r = await http.post(CHAT, json=chat("new leader"))
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "sim says: new leader"
            assert control.gateways is not None and control.gateways.gateways()[0]["connected"]

            # serving.stopped reaches the gateway: 503 system_stopped.
            assert (await api.put("/api/v1/settings/serving.stopped", json=True)).status_code == 200

            async def refused_stopped() -> bool:
                r = await http.post(CHAT, json=chat("stopped?"))
                return r.status_code == 503 and r.json()["error"]["code"] == "system_stopped"
            await until(refused_stopped, 1.0)
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
    store = StandbyStore(leader.admin_url)
    hub = AgentHub()
    gateways = GatewayHub(store, "standby")
    reconciler = Reconciler(store, hub, sinks=[gateways], demand=[gateways])
    app = make_app(Context(store=store, hub=hub, reconciler=reconciler, clock=lambda: 0.0, self_id="standby",
                           store_status=store.status, local_machines=local_machines(leader)))
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(lambda task_status: hyper_serve(
            app, hypercorn_config("127.0.0.1", 0, logger="test.standby", graceful_s=FAST.admin_shutdown_grace_s,
                              keep_alive_s=FAST.admin_keep_alive_s), task_status=task_status))
        task_status.started(bound[0])


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[ControlHandle]:
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(control_serve, control_config(tmp_path / "control", free_port(), 0))
        yield handle
        nursery.cancel_scope.cancel()


async def test_a_gateway_goes_where_a_standby_points_and_past_a_dead_url(leader: ControlHandle) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with trio.open_nursery() as nursery:
        standby_url = await nursery.start(serve_standby, leader)
        assert leader.context is not None
        credential = leader.context.local_credential("gateway", "gw-test")
        # Only the standby and a dead URL are given: the leader is found through the standby's pointer.
        gw: GatewayHandle = await nursery.start(gateway_serve, gateway_config(dead, standby_url, credential=credential))
        async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"}) as http:
            first = (await http.get("/v1/models")).json()
            assert first["error"]["code"] == "gateway_not_synced", "unknown is refused, not shown as empty"
            assert (await http.get("/health")).json() == {"status": "ok", "table_age_s": None, "leader": None}

            async def synced() -> bool:
                return (await http.get("/health")).json()["leader"] == leader.admin_url
            await until(synced, 10)
            assert [m["id"] for m in (await http.get("/v1/models")).json()["data"]] == ["demo"]
        nursery.cancel_scope.cancel()


async def test_a_leader_that_goes_quiet_is_left_and_its_table_kept(tmp_path: Path) -> None:
    """A stopped (SIGSTOP) or cut-off leader closes nothing: the gateway notices the silence
    (`gateway_silence_s`), leaves it, and keeps answering from the table it had."""
    quiet = dataclasses.replace(FAST, gateway_silence_s=0.5)
    sessions: list[int] = []

    async def mute_leader(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()  # hello
        await ws.send_message(protocol.dumps({"type": "welcome", "leader": "mute"}))
        if not sessions:
            await ws.send_message(protocol.dumps(protocol.table_message(1, "mute", store_with_keys().snapshot(), {})))
        sessions.append(1)
        await trio.sleep_forever()  # then silence, the connection open

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, mute_leader, "127.0.0.1", 0, None)
        url = f"http://127.0.0.1:{server.port}"
        cfg = dataclasses.replace(gateway_config(url, credential=None), timeouts=quiet)
        gw: GatewayHandle = await nursery.start(gateway_serve, cfg)
        async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"}) as http:
            async def followed() -> bool:
                return (await http.get("/health")).json()["leader"] == url
            await until(followed, 5)
            with trio.fail_after(3):
                while len(sessions) < 2:  # it left the silent stream and came back
                    await trio.sleep(0.02)
            assert (await http.get("/v1/models")).json()["data"][0]["id"] == "demo", "the table is kept"
            assert (await http.get("/health")).json()["table_age_s"] >= quiet.gateway_silence_s
        nursery.cancel_scope.cancel()


def store_with_keys() -> MemoryStore:
    s = MemoryStore()
    s.submit_nowait(commands.add_key(hash_key(CLIENT), "client", "client", 0.0))
    s.submit_nowait(commands.put_model(ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"}), 0.0))
    return s
