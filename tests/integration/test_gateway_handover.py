"""A remote gateway restarted in place, in one trio run with a real control plane, an agent and a sim engine
process, over real sockets: the operator's `POST /api/v1/gateways/NAME/restart` reaches the gateway over its
stream, the gateway drains, sends the usage it has not had counted, and hands its listening socket over
(`Handover.fd`); a client that connects in between waits and is answered by the next gateway, which adopts
that socket; the leader lists the new program (a new start, following again) and counts every request; the
refusals name their reasons."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlHandle
from llmgw.control.service import serve as control_serve
from llmgw.domain.observed import NodeInfo
from llmgw.gateway.app import Handover
from llmgw.gateway.follower import GatewayHandle
from llmgw.gateway.follower import serve as gateway_serve
from llmgw.testing import FakeGpuProbe
from tests.integration.test_gateway_follower import (ADMIN, CHAT, CLIENT, FAST, chat, control_config, gateway_config,
                                                     until)
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

QUICK = dataclasses.replace(FAST, gateway_drain_idle_s=0.5)


async def test_a_gateway_asked_to_restart_drains_and_its_socket_serves_the_next_one(tmp_path: Path) -> None:
    raft_port, admin_port = free_port(), free_port()
    admin_url = f"http://127.0.0.1:{admin_port}"
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, control_config(tmp_path / "control", raft_port,
                                                                                   admin_port))
        assert control.context is not None
        await nursery.start(agent_serve, AgentConfig(controls=[admin_url], tls=None, state_dir=tmp_path / "agent",
                                                     local_credential=control.context.local_credential("agent", "n1"),
                                                     node="n1", probe=probe, timeouts=FAST))
        credential = control.context.local_credential("gateway", "gw-test")
        first = dataclasses.replace(gateway_config(admin_url, credential=credential), handover=Handover(),
                                    timeouts=QUICK)
        fixed = dataclasses.replace(gateway_config(admin_url, credential=control.context.local_credential(
            "gateway", "gw-fixed")), name="gw-fixed")  # no handover: inside another process
        ended = trio.Event()

        async def run_first(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            await gateway_serve(first, task_status=task_status)
            ended.set()

        gw: GatewayHandle = await nursery.start(run_first)
        await nursery.start(gateway_serve, fixed)
        async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"},
                                     timeout=60) as http, \
                httpx.AsyncClient(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}) as api:

            sent = [0]  # chat requests through the gateway: each one counted in the usage, restart or not

            async def answers() -> bool:
                sent[0] += 1
                return (await http.post(CHAT, json=chat("before"))).status_code == 200

            async def listed() -> dict[str, dict[str, Any]]:
                return {g["name"]: g for g in (await api.get("/api/v1/gateways")).json()["gateways"]}

            await until(answers, 30)

            async def both_follow() -> bool:
                return len(await listed()) == 2
            await until(both_follow, 30)
            before = (await listed())["gw-test"]
            assert before["restartable"] and before["connected"] and isinstance(before["started_at"], float)

            for _ in range(3):  # just before: their usage is not sent yet (every usage_report_s)
                assert await answers()
            asked = await api.post("/api/v1/gateways/gw-test/restart")
            assert asked.status_code == 200, asked.text
            assert asked.json()["restarting"] == "gw-test"
            with trio.fail_after(30):
                await ended.wait()  # drained: the role returned, as `llmgw gateway` then runs itself again
            assert first.handover is not None and first.handover.fd is not None
            late: list[httpx.Response] = []

            async def late_client() -> None:  # connects while nobody accepts: waits in the kernel's queue
                async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"},
                                             timeout=60) as fresh:
                    late.append(await fresh.post(CHAT, json=chat("while it restarts")))

            nursery.start_soon(late_client)
            await trio.sleep(0.2)
            assert not late
            again = dataclasses.replace(first, handover=Handover(inherited=first.handover.fd))
            again.started_at = first.started_at + 1.0
            second: GatewayHandle = await nursery.start(gateway_serve, again)
            assert second.url == gw.url  # the same socket, the same port

            async def late_answered() -> bool:
                return bool(late)
            await until(late_answered, 30)
            assert late[0].status_code == 200, late[0].text
            assert (await http.post(CHAT, json=chat("after"))).status_code == 200
            sent[0] += 2

            async def all_counted() -> bool:  # the first program's last usage went to the leader before its exec
                totals = (await api.get("/api/v1/usage")).json()["totals"]
                return bool(totals["requests"] == sent[0])
            await until(all_counted, 30)

            async def following_again() -> bool:
                g = (await listed()).get("gw-test")
                return g is not None and g["connected"] and g["started_at"] == again.started_at
            await until(following_again, 30)

            r = await api.post("/api/v1/gateways/gw-fixed/restart")
            assert r.status_code == 409 and r.json()["error"]["code"] == "cannot_restart", r.text
            r = await api.post("/api/v1/gateways/nobody/restart")
            assert r.status_code == 404 and r.json()["error"]["code"] == "gateway_not_found", r.text
        nursery.cancel_scope.cancel()
