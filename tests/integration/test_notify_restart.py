"""A restart of the control plane with a webhook set, as an operator with a pager lives it: a real control
plane (`serve`: Raft store, reconciler, admin API, notifier), a real agent running real sim engines, a
webhook receiver on loopback. The control plane and its agent stop (`llmgw up` stops); the control plane
starts again on its state, its agent a second later. Not one event is posted for the models that come back ready within
the agents' grace to report (before, each was posted `model_down`, "waiting for node n1 to reconnect")."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.domain.trust import hash_token
from tests.support.processes import free_port
from llmgw.startup import CannotStart
from llmgw.testing import FakeGpuProbe
from llmgw.testing.webhooks import WebhookReceiver
from llmgw.trust.ca import Identity
from tests.support.faults import cpu_node

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-notify-restart"
MODELS = ("chat-a", "chat-b", "chat-c")
TIMEOUTS_HERE = dataclasses.replace(TIMEOUTS, notify_check_s=0.1, notify_resolve_hold_s=0.3, agent_report_grace_s=3.0,
                                    agent_reconnect_max_s=0.2, stream_heartbeat_s=0.5, reconcile_tick_s=0.5)


async def _ready(api: httpx.AsyncClient) -> dict[str, Any]:
    while True:
        doc: dict[str, Any] = (await api.get("/api/v1/status")).json()
        if all(m["ready"] == 1 for m in doc["models"] if m["name"] in MODELS):
            return doc
        await trio.sleep(0.05)


async def test_a_control_plane_restart_posts_nothing_for_models_back_ready_within_the_grace(tmp_path: Path) -> None:
    cfg = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=free_port(), seed=Seed(admin_key=ADMIN), timeouts=TIMEOUTS_HERE)
    receiver = WebhookReceiver()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(receiver.serve)
            control, stopped = trio.CancelScope(), trio.Event()

            async def run_control(task_status: trio.TaskStatus[ControlHandle] = trio.TASK_STATUS_IGNORED) -> None:
                try:
                    with control:
                        await control_serve(cfg, task_status=task_status)
                finally:
                    stopped.set()

            handle: ControlHandle = await nursery.start(run_control)
            assert handle.context is not None
            secret = handle.context.local_credential("agent", "n1")
            agent = AgentConfig(controls=[handle.admin_url], tls=None, local_credential=secret,
                                state_dir=tmp_path / "agent", node="n1",
                                probe=FakeGpuProbe(cpu_node("n1", ("sim",))), timeouts=TIMEOUTS_HERE)
            agent_scope = trio.CancelScope()

            async def run_agent(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                with agent_scope:
                    await agent_serve(agent, task_status=task_status)

            await nursery.start(run_agent)
            async with httpx.AsyncClient(base_url=handle.admin_url, timeout=10,
                                         headers={"Authorization": f"Bearer {ADMIN}"}) as api:
                assert (await api.put("/api/v1/settings/notify.webhooks", json=[url + "/pager"])).is_success
                for name in MODELS:
                    r = await api.post("/api/v1/models", json={"name": name, "engine": "sim", "source": f"sim://{name}",
                                                               "mode": "always", "activation_window_s": 0.5})
                    assert r.status_code == 201, r.text
                await _ready(api)
                await trio.sleep(0.5)  # their activation windows pass: a restart is no cold start of theirs

                control.cancel()  # `llmgw up` stops: its control plane and its agent
                agent_scope.cancel()
                await stopped.wait()
                while True:  # its Raft thread lets go of the port a moment after it stopped
                    control, stopped = trio.CancelScope(), trio.Event()
                    try:
                        again: ControlHandle = await nursery.start(run_control)
                        break
                    except CannotStart as e:
                        assert "Address already in use" in str(e)
                        await trio.sleep(0.1)
                assert again.context is not None and again.admin_url == handle.admin_url
                # The agent's in-process credential, known to this process's new control plane as to the old.
                again.context.local_machines[hash_token(secret)] = Identity("agent", "n1", "local", math.inf, "local")
                started = trio.current_time()
                await trio.sleep(1.0)  # the agent starts a second after the control plane (a leader change: finds it)
                agent_scope = trio.CancelScope()
                await nursery.start(run_agent)
                doc = await _ready(api)
                assert trio.current_time() - started < TIMEOUTS_HERE.agent_report_grace_s  # the case: back in time
                # The grace passes and a few checks after it: still nothing posted.
                while any(w.startswith("waiting for agents to report") for w in doc["warnings"]):
                    await trio.sleep(0.1)
                    doc = (await api.get("/api/v1/status")).json()
                await trio.sleep(5 * TIMEOUTS_HERE.notify_check_s)
                assert doc["conditions"] == []
                assert receiver.events() == [], receiver.events()
                hooks = (await api.get("/api/v1/notify/status")).json()["webhooks"]
                assert [h["deliveries"] for h in hooks] == [[]]  # the webhook is configured, and was never called
            nursery.cancel_scope.cancel()
