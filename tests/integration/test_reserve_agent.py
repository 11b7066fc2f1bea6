"""Per-node budgets end to end (issue 25, point 3): an agent started with `--reserve` reports it over its stream,
the leader places around it, and the status capacity counts the reserved device apart. A real control plane and
agent in one trio run (the agent's inventory from a fake GPU probe; the sim engine ignores the devices)."""

from __future__ import annotations

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
from llmgw.domain.reserve import parse_reserve
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from llmgw.testing.builders import node
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-reserve-test"


async def test_the_leader_places_around_what_an_agent_reserves(tmp_path: Path) -> None:
    router = Router()
    seed = Seed(admin_key=ADMIN, models=[ModelDef.from_doc(
        {"name": "g", "engine": "sim", "source": "sim://g", "replicas": {"min": 2, "max": 2}, "profile": {"gpus": 1}})])
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router], demand=[router])
    probe = FakeGpuProbe(node("x").gpus(2).engines("sim").build())
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        assert control.context is not None
        agent = AgentConfig(controls=[control.admin_url], tls=None,
                            local_credential=control.context.local_credential("agent", "n1"),
                            state_dir=tmp_path / "agent", node="n1", probe=probe, reserve=parse_reserve(["gpu=0"]))
        await nursery.start(agent_serve, agent)
        assert control.hub.nodes["n1"].reserved_gpus == (0,), "the reserve travels with the inventory"
        async with httpx.AsyncClient(base_url=control.admin_url, headers={"authorization": f"Bearer {ADMIN}"}) as c:
            status: dict[str, Any] = {}
            with trio.fail_after(20):
                while not any(p.model == "g" for p in control.store.snapshot().placements.values()):
                    await trio.sleep(0.05)
                while not (status := (await c.get("/api/v1/status")).json()).get("capacity"):
                    await trio.sleep(0.05)
        placed = [p.gpus for p in control.store.snapshot().placements.values() if p.model == "g"]
        assert placed == [(1,)], "one replica on the unreserved GPU; the second has nowhere to go"
        (row,) = status["capacity"]
        assert (row["used"], row["free"], row["reserved"], row["total"]) == (1, 0, 1, 2)
        nursery.cancel_scope.cancel()
