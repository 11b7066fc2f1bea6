"""A model whose engine serves a moment and dies, over and over (the sim's `--exit-after`), parks:
an agent and a control plane in one trio run, over the real WebSocket, with real sim engine
processes; the reason says the failures were flaps."""

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
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-flapping-test"
# Retries after 0.1, 0.2, 0.4 s; a replica must serve 20 s for its readiness to break the row.
TIMEOUTS_HERE = dataclasses.replace(TIMEOUTS, start_backoff_first_s=0.1, start_backoff_max_s=0.4,
                                    stable_ready_s=20.0)


async def test_an_engine_that_serves_a_moment_and_dies_parks_its_model(tmp_path: Path) -> None:
    router = Router()
    seed = Seed(admin_key=ADMIN, models=[ModelDef.from_doc(
        {"name": "flappy", "engine": "sim", "source": "sim://flappy", "args": ["--exit-after", "0.3"]})])
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router],
                           demand=[router], timeouts=TIMEOUTS_HERE)
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        assert control.context is not None
        await nursery.start(agent_serve, AgentConfig(
            controls=[control.admin_url], tls=None, local_credential=control.context.local_credential("agent", "n1"),
            state_dir=tmp_path / "agent", node="n1", probe=probe))
        served = 0

        def parked() -> bool:
            nonlocal served
            served += sum(1 for r in control.hub.observed().replicas.values() if r.state == "ready")
            return control.store.snapshot().model_health("flappy").parked

        with trio.fail_after(60):
            while not parked():
                await trio.sleep(0.05)
        health = control.store.snapshot().model_health("flappy")
        assert health.failures_in_row == 5 and health.flaps == 5, health
        assert 0.3 <= health.flap_ready_s < 20, health
        assert served, "its replicas were ready, each for a moment"
        async with httpx.AsyncClient(base_url=control.admin_url,
                                     headers={"authorization": f"Bearer {ADMIN}"}) as admin:
            shown: Any = (await admin.get("/api/v1/models/flappy")).json()
        status = shown["model"]["status"]
        reason = status["reason"]
        assert reason.startswith("parked after 5 failed starts in a row (ready for 0."), reason
        assert "then failed: 5 times): engine exited with status 4 while serving" in reason, reason
        assert "(--exit-after)" in reason, reason
        assert (status["flaps"], status["failures_in_row"]) == (5, 5), status
        nursery.cancel_scope.cancel()
