"""A request for an on-demand model with no replica starts it at once, not at the next round of some loop
(issue 26, point 3): the reconciler is woken by the ask of `llmgw up`'s own router and of a remote gateway (which
sends the ask at once, not with its next demand report), and the agent probes a starting engine often in its first
seconds. Each test makes the loop it must not wait for an hour long, so without the wake the request would wait
an hour: the `fail_after` is a safety net, not a timing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.follower import GatewayConfig, GatewayHandle
from llmgw.gateway.follower import serve as gateway_serve
from llmgw.testing import FakeGpuProbe
from tests.support.one_node import one_node
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-admin-wake-test", "sk-client-wake-test"
HOUR = 3600.0
# The reconciler's tick and the agent's slow health probing an hour apart: only a wake, and the fast probing of
# an engine's first seconds, make a cold start finish within the test.
SLOW_LOOPS = dataclasses.replace(TIMEOUTS, reconcile_tick_s=HOUR, engine_health_poll_s=HOUR,
                                 reconcile_startup_quiet_s=0.01, agent_report_grace_s=0.01)
NODE = NodeInfo("x", hostname="wake-node", cpus=2, engines=("sim",))
LAZY = ModelDef.from_doc({"name": "lazy", "engine": "sim", "source": "sim://lazy", "mode": "on-demand"})


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "wake up"}]}


async def test_the_in_process_routers_ask_wakes_the_reconciler_and_the_agent_sees_the_engine_at_once(
        tmp_path: Path) -> None:
    async with one_node(tmp_path, [LAZY], admin_key=ADMIN, client_key=CLIENT, node=NODE,
                        timeouts=SLOW_LOOPS) as cluster:
        async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=None,
                                     headers={"Authorization": f"Bearer {CLIENT}"}) as http:
            with trio.fail_after(30):  # safety net: without the wake, an hour
                r = await http.post("/v1/chat/completions", json=chat("lazy"))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "sim says: wake up"


async def test_a_remote_gateway_sends_its_ask_at_once(tmp_path: Path) -> None:
    # Its demand report an hour apart too (its heartbeats, and the leader's patience with its silence, as long).
    slow = dataclasses.replace(SLOW_LOOPS, gateway_demand_report_s=HOUR, gateway_heartbeat_s=HOUR,
                               gateway_silence_s=4 * HOUR)
    admin_port = free_port()
    admin_url = f"http://127.0.0.1:{admin_port}"
    seed = Seed(admin_key=ADMIN, client_key=CLIENT, models=[LAZY])
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, ControlConfig(
            state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
            admin_port=admin_port, seed=seed, timeouts=slow))
        assert control.context is not None
        await nursery.start(agent_serve, AgentConfig(
            controls=[admin_url], tls=None, local_credential=control.context.local_credential("agent", "n1"),
            state_dir=tmp_path / "agent", node="n1", probe=FakeGpuProbe(NODE), timeouts=slow))
        gw: GatewayHandle = await nursery.start(gateway_serve, GatewayConfig(
            controls=[admin_url], tls=None, local_credential=control.context.local_credential("gateway", "gw-wake"),
            listen_port=0, name="gw-wake", timeouts=slow))
        async with httpx.AsyncClient(base_url=gw.url, timeout=None,
                                     headers={"Authorization": f"Bearer {CLIENT}"}) as http:
            with trio.fail_after(30):
                while "lazy" not in [m["id"] for m in (await http.get("/v1/models")).json().get("data", [])]:
                    await trio.sleep(0.05)  # the gateway follows the leader's table
                r = await http.post("/v1/chat/completions", json=chat("lazy"))
        assert r.status_code == 200, r.text
        nursery.cancel_scope.cancel()
