"""An agent and a control plane in one trio run, over the real WebSocket, with
real sim engine processes: engines keep serving while control is away, and a
control plane that comes back adopts them instead of restarting them."""

from __future__ import annotations

import dataclasses
import json
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

ADMIN = "sk-admin-agent-test"
# The failing model's five starts wait 0.1, 0.2, 0.4, 0.4 s between them, not 1, 2, 4, 8 s.
FAST_RETRIES = dataclasses.replace(TIMEOUTS, start_backoff_first_s=0.1, start_backoff_max_s=0.4)


def control_config(state: Path, raft_port: int, admin_port: int, router: Router) -> ControlConfig:
    seed = Seed(admin_key=ADMIN, models=[
        ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"}),
        ModelDef.from_doc({"name": "broken", "engine": "sim", "source": "sim://broken", "args": ["--fail-start"]}),
    ])
    return ControlConfig(state_dir=state, raft_addr=f"127.0.0.1:{raft_port}", admin_host="127.0.0.1",
                         admin_port=admin_port, seed=seed, sinks=[router], demand=[router], timeouts=FAST_RETRIES)


async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_engines_survive_a_control_restart(tmp_path: Path) -> None:
    router = Router()
    raft_port, admin_port = free_port(), free_port()
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        control_scope = trio.CancelScope()

        async def run_control(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with control_scope:
                await control_serve(control_config(tmp_path / "control", raft_port, admin_port, router),
                                    task_status=task_status)

        control: ControlHandle = await nursery.start(run_control)
        assert control.context is not None
        # The agent's credential (`Context.local_credential`) is in the control plane's memory only: the
        # restarted control plane below is given the same, before it answers a stream.
        agent_cfg = AgentConfig(controls=[control.admin_url], tls=None,
                                local_credential=control.context.local_credential("agent", "n1"),
                                state_dir=tmp_path / "agent", node="n1", probe=probe)
        machines = dict(control.context.local_machines)
        await nursery.start(agent_serve, agent_cfg)
        assert control.hub.nodes["n1"].hostname == "test-node", "the inventory comes from the GpuProbe seam"

        def ready_url() -> str | None:
            route = router.route("demo")
            return route.endpoints[0].url if route and route.endpoints else None

        await wait_for(lambda: ready_url() is not None)
        url = ready_url()
        route = router.route("demo")
        assert route is not None
        replica_id = route.endpoints[0].replica_id
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/health")).status_code == 200

            # The failing model is retried with backoff, then parked with the engine's own words.
            await wait_for(lambda: control.store.snapshot().model_health("broken").parked, timeout=40)
            health = control.store.snapshot().model_health("broken")
            assert health.failures_in_row == 5 and "fail" in health.last_error.lower()
            # The engine's own last lines travel agent -> control -> the model's health (what `ctl model
            # show` and the API print), with its exit status.
            assert "simulated start failure of model broken (--fail-start)" in health.last_error, health.last_error
            assert "status 3" in health.last_error, health.last_error
            async with httpx.AsyncClient(base_url=control.admin_url,
                                         headers={"authorization": f"Bearer {ADMIN}"}) as admin:
                shown = (await admin.get("/api/v1/models/broken")).json()
            assert "simulated start failure of model broken" in json.dumps(shown), shown

            control_scope.cancel()  # the control plane goes away...
            await trio.sleep(1.0)
            assert (await http.get(f"{url}/health")).status_code == 200, "engines keep serving without control"

            control = await nursery.start(run_control_again := _runner(tmp_path, raft_port, admin_port, router))
            assert control.context is not None
            control.context.local_machines.update(machines)  # no await since it started: no stream came yet
            await wait_for(lambda: "n1" in control.hub.nodes)
            await wait_for(lambda: any(r.state == "ready" for r in control.hub.observed().replicas.values()))
            replicas = control.hub.observed().replicas
            assert set(replicas) == {replica_id}, "the same replica, adopted, not a new one"
            assert replicas[replica_id].url == url
            assert (await http.get(f"{url}/health")).status_code == 200
            assert control.store.snapshot().model_health("broken").parked, "parking survives the restart"
            del run_control_again
        nursery.cancel_scope.cancel()


def _runner(tmp_path: Path, raft_port: int, admin_port: int, router: Router) -> Any:
    async def run(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await control_serve(control_config(tmp_path / "control", raft_port, admin_port, router),
                            task_status=task_status)
    return run
