"""An agent's stream cut without being closed (SIGSTOP of the peer's process), each way: the
other end takes its peer for gone within three heartbeat intervals; a stopped agent's node
is lost after its grace period and can then be forgotten (it reappears when it comes back);
a stopped control is left for the leader search while the engines keep serving; and a control
that sends malformed commands gets `rejected` answers and harms nothing that runs."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import WebSocketConnection, WebSocketRequest, serve_websocket

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import SILENT_BEATS, TIMEOUTS
from llmgw.testing import FakeGpuProbe
from llmgw.trust.files import MachineFiles
from llmgw.trust.join import JoinRequest, ensure_credentials
from llmgw.trust.join import client_context as machine_context
from llmgw.trust.tls import client_context as tls_client_context
from llmgw.wire import protocol
from tests.support.processes import free_port
from tests.support.trust import ajoin_token, test_ca_root

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-stream-faults"
BEAT = 0.4  # stream_heartbeat_s: a silent peer is gone after 3 × 0.4 s
SLACK = 0.8  # scheduling on a loaded machine: a silence is noticed at most this much late
CLOSE = 0.2  # agent_stream_close_s: what a stream to a silent peer may still cost to close
FAST = dataclasses.replace(TIMEOUTS, stream_heartbeat_s=BEAT, lost_node_grace_s=1.0, agent_connect_s=1.0,
                           agent_reconnect_min_s=0.05, agent_reconnect_max_s=0.3, agent_stream_close_s=CLOSE)
# The same, for a process (`llmgw control`, `llmgw agent` read LLMGW_TIMEOUTS).
FAST_ENV = {"LLMGW_TIMEOUTS": f"stream_heartbeat_s={BEAT},lost_node_grace_s=1,agent_connect_s=1,"
                              f"agent_reconnect_min_s=0.05,agent_reconnect_max_s=0.3"}
PROBE = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "llmgw", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **FAST_ENV, **env})


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_for(what: str, probe: Any, timeout: float = 20.0) -> Any:
    with trio.move_on_after(timeout):
        while True:
            value = await probe()
            if value:
                return value
            await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def api_client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[ControlHandle]:
    """A control plane in this process serving TLS as `llmgw control` does (its CA under the tests' root)."""
    cfg = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=0, seed=Seed(admin_key=ADMIN), timeouts=FAST, tls=True, ca_root=test_ca_root())
    async with trio.open_nursery() as nursery:
        yield await nursery.start(control_serve, cfg)
        nursery.cancel_scope.cancel()


async def test_a_stopped_agent_is_gone_within_three_intervals_then_lost_then_forgotten(
        tmp_path: Path, control: ControlHandle) -> None:
    models = tmp_path / "models"
    models.mkdir()
    token = await ajoin_token(control.admin_url, ADMIN, "agent", "n1")  # the agent process joins with it, once
    agent = start(["agent", "--stop-engines-on-exit", "--control", control.admin_url, "--state-dir", str(tmp_path / "agent"), "--node", "n1",
                   "--engine-host", "127.0.0.1", "--fabric", "lab", "--storage", f"{models}:lab-nfs:shared",
                   "--join-token", token], {}, tmp_path / "agent.log")
    hub = control.hub
    try:
        async with api_client(control.admin_url) as api:
            async def listed() -> dict[str, Any]:
                return {n["node"]: n for n in (await api.get("/api/v1/nodes")).json()["nodes"]}

            async def connected() -> bool:
                return (await listed()).get("n1", {}).get("state") == "connected"

            await wait_for("the agent's node", connected)
            node = (await listed())["n1"]
            assert (node["address"], node["fabric"]) == ("127.0.0.1", "lab")
            assert [(s["path"], s["fabric"], s["shared"]) for s in node["storage"]] == [(str(models), "lab-nfs", True)]
            refused = await api.delete("/api/v1/nodes/n1")
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "node_not_lost"
            assert "connected" in refused.json()["error"]["message"]
            unknown = await api.delete("/api/v1/nodes/nobody")
            assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "node_not_found"

            await trio.sleep(BEAT * 4)  # beating agents stay, however long
            assert "n1" in hub.links
            agent.send_signal(signal.SIGSTOP)  # the connection stays open: only silence tells
            stopped = time.monotonic()
            while "n1" in hub.links:
                await trio.sleep(0.01)
            gone_after = time.monotonic() - stopped
            assert (SILENT_BEATS - 1) * BEAT - 0.1 < gone_after <= SILENT_BEATS * BEAT + SLACK, gone_after

            node = (await listed())["n1"]
            assert node["state"] == "disconnected" and node["grace_s"] == 1.0 and node["gpus"] is None
            early = await api.delete("/api/v1/nodes/n1")
            assert early.status_code == 409 and "grace period" in early.json()["error"]["message"]

            async def lost() -> bool:
                return (await listed())["n1"]["state"] == "lost"

            await wait_for("the node lost", lost, timeout=5)
            assert (await listed())["n1"]["gone_for_s"] >= 1.0
            forgot = await api.delete("/api/v1/nodes/n1")
            assert forgot.status_code == 200 and forgot.json() == {"forgotten": "n1", "removed_placements": []}
            assert "n1" not in await listed()

            agent.send_signal(signal.SIGCONT)  # a forgotten node that comes back simply reappears
            await wait_for("the node back", connected)
    finally:
        stop(agent)


class CapturedWarnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record.getMessage()))


@pytest.fixture
def agent_warnings() -> Iterator[CapturedWarnings]:
    handler, logger = CapturedWarnings(), logging.getLogger("llmgw.agent")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def test_a_stopped_control_is_left_within_three_intervals_and_engines_keep_serving(
        tmp_path: Path, agent_warnings: CapturedWarnings) -> None:
    admin_port = free_port()
    admin_url = f"https://127.0.0.1:{admin_port}"  # `llmgw control` serves TLS, its CA made at its first start
    control = start(["control", "--state-dir", str(tmp_path / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
                     "--admin-addr", f"127.0.0.1:{admin_port}"], {"LLMGW_ADMIN_KEY": ADMIN}, tmp_path / "control.log")
    bundle = MachineFiles.of(tmp_path / "control").ca  # the cluster's CA, as the control plane keeps it

    async def ca_written() -> bool:
        return bundle.is_file()

    try:
        await wait_for("the cluster's CA", ca_written, timeout=30)
        async with httpx.AsyncClient(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5,
                                     verify=tls_client_context(bundle)) as api, trio.open_nursery() as nursery:
            async def control_up() -> bool:
                try:
                    return (await api.get("/health")).json().get("leader") is True
                except httpx.HTTPError:
                    return False

            await wait_for("the control plane", control_up, timeout=30)
            # The agent joins once with a token and from then on speaks with its certificate alone.
            made = await api.post("/api/v1/trust/tokens", json={"role": "agent", "name": "n1"})
            assert made.status_code == 201, made.text
            files = await ensure_credentials(MachineFiles.of(tmp_path / "agent"), [admin_url],
                                             JoinRequest("agent", "n1", made.json()["token"], ca_file=bundle))
            config = AgentConfig(controls=[admin_url], tls=machine_context(files), state_dir=tmp_path / "agent",
                                 node="n1", probe=PROBE, timeouts=FAST)
            with trio.fail_after(20):
                await nursery.start(agent_serve, config)
            r = await api.post("/api/v1/models", json={"name": "demo", "engine": "sim", "source": "sim://demo"})
            assert r.status_code == 201, r.text

            async def ready_replica() -> dict[str, Any] | None:
                replicas = (await api.get("/api/v1/models/demo")).json()["model"]["status"]["replicas"]
                return next((rep for rep in replicas if rep["state"] == "ready"), None)

            replica = await wait_for("a ready replica", ready_replica, timeout=30)
            control.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            left = None
            with trio.move_on_after(SILENT_BEATS * BEAT + SLACK + 2):
                while left is None:
                    left = next((at for at, text in agent_warnings.records
                                 if at >= stopped and "lost the leader" in text and "no word" in text), None)
                    await trio.sleep(0.01)
            assert left is not None, agent_warnings.records
            # Taken for gone after 3 intervals; the stream's close (bounded) comes before the log line.
            assert (SILENT_BEATS - 1) * BEAT - 0.1 < left - stopped <= SILENT_BEATS * BEAT + CLOSE + SLACK, \
                left - stopped
            async with httpx.AsyncClient(timeout=2) as http:
                assert (await http.get(f"{replica['url']}/health")).status_code == 200, "the engine keeps serving"

            control.send_signal(signal.SIGCONT)  # the agent finds it again, and it adopts the engine

            async def adopted() -> bool:
                again = await ready_replica()
                nodes = (await api.get("/api/v1/nodes")).json()["nodes"]
                return bool(again and again["replica_id"] == replica["replica_id"]
                            and [n["state"] for n in nodes] == ["connected"])

            await wait_for("the replica adopted", adopted, timeout=20)
            nursery.cancel_scope.cancel()
    finally:
        stop(control)


async def test_malformed_commands_are_rejected_and_the_running_engine_is_untouched(tmp_path: Path) -> None:
    model = {"name": "demo", "engine": "sim", "source": "sim://demo"}
    seen: list[dict[str, Any]] = []
    verdict: dict[str, Any] = {}

    async def report(ws: WebSocketConnection, predicate: Any) -> dict[str, Any]:
        while True:
            message = protocol.loads(await ws.get_message())
            seen.append(message)
            if predicate(message):
                return message

    def ready(message: dict[str, Any]) -> bool:
        return message["type"] == "replicas" and any(r["state"] == "ready" for r in message["replicas"])

    async def bad_control(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()  # hello
        await ws.get_message()  # inventory
        await ws.send_message(protocol.dumps({"type": "welcome", "node": "n1", "leader": "bad"}))
        await ws.send_message(protocol.dumps({"type": "start_replica", "replica_id": "demo-r1", "model": model,
                                              "gpus": []}))
        with trio.fail_after(30):
            verdict["url"] = (await report(ws, ready))["replicas"][0]["url"]
        for bad in ({"type": "start_replica", "model": model, "gpus": []},
                    {"type": "start_replica", "replica_id": "../../../tmp/x", "model": model, "gpus": []},
                    {"type": "stop_replica", "replica_id": 42},
                    {"type": "start_replica", "replica_id": "demo-r2", "model": {"engine": "sim"}, "gpus": [0]}):
            await ws.send_message(protocol.dumps(bad))
        await ws.send_message("not json at all")
        with trio.fail_after(10):
            for _ in range(5):
                verdict.setdefault("rejected", []).append(await report(ws, lambda m: m["type"] == "rejected"))
            await ws.send_message(protocol.dumps({"type": "heartbeat"}))
            verdict["after"] = await report(ws, lambda m: m["type"] in ("replicas", "heartbeat"))
        verdict["done"] = True
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, bad_control, "127.0.0.1", 0, None)
        # This fake control checks no credential; a machine in a control plane's process sends one like it.
        config = AgentConfig(controls=[f"http://127.0.0.1:{server.port}"], tls=None,
                             local_credential="llmgw-local-fake", state_dir=tmp_path / "agent", node="n1",
                             probe=PROBE, timeouts=FAST)
        nursery.start_soon(agent_serve, config)
        with trio.fail_after(45):
            while "done" not in verdict:
                await trio.sleep(0.05)
        reasons = [(r["message_type"], r["reason"].split(":")[0]) for r in verdict["rejected"]]
        assert reasons == [("start_replica", "start_replica.replica_id"), ("start_replica", "start_replica.replica_id"),
                           ("stop_replica", "stop_replica.replica_id"), ("start_replica", "start_replica.model"),
                           ("?", "not JSON")]
        async with httpx.AsyncClient(timeout=2) as http:
            assert (await http.get(f"{verdict['url']}/health")).status_code == 200, "the engine keeps serving"
        assert verdict["after"]["type"] in ("replicas", "heartbeat"), "the agent carries on"
        nursery.cancel_scope.cancel()
