"""A replica's cold start as everyone sees it, with a real control plane, agent and sim engine process (one that
takes 3 s to listen, as a slow load would): the agent reports the replica `loading`, control puts that progress
on the route the gateway's router gets and on the admin API's model status; once the engine serves, both drop it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-activation-test"
MODEL = f"cold-{os.getpid()}"


async def wait_for(predicate: Callable[[], object], timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_a_loading_replica_is_reported_on_the_route_and_the_model_status(tmp_path: Path) -> None:
    router = Router()
    doc = {"name": MODEL, "engine": "sim", "source": "sim://demo", "args": ["--startup-delay", "3"]}
    seed = Seed(admin_key=ADMIN, models=[ModelDef.from_doc(doc)])
    control_cfg = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                                admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router],
                                demand=[router])
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, control_cfg)
        assert control.context is not None
        credential = control.context.local_credential("agent", "n1")
        await nursery.start(agent_serve, AgentConfig(controls=[control.admin_url], tls=None,
                                                     local_credential=credential, state_dir=tmp_path / "agent",
                                                     node="n1", probe=probe, stop_engines_on_exit=True))

        def loading() -> bool:
            route = router.route(MODEL)
            return route is not None and route.activation is not None and route.activation.phase == "loading"

        await wait_for(loading)
        [obs] = [r for r in control.hub.observed().replicas.values() if r.model == MODEL]
        assert (obs.state, obs.phase) == ("starting", "loading")  # the agent's word
        route = router.route(MODEL)
        assert route is not None and route.state == "starting" and route.activation is not None
        assert route.activation.since == obs.since and route.activation.bytes_total is None  # a sim reads none
        async with httpx.AsyncClient(base_url=control.admin_url, headers={"authorization": f"Bearer {ADMIN}"}) as http:
            shown = (await http.get(f"/api/v1/models/{MODEL}")).json()["model"]["status"]
            assert shown["activation"]["phase"] == "loading" and shown["activation"]["elapsed_s"] >= 0
            assert shown["activation"]["words"].startswith("loading the checkpoint (size unknown) for ")
            assert shown["window_s"] == 120.0

            def ready() -> bool:
                route = router.route(MODEL)
                return route is not None and route.state == "ready"

            await wait_for(ready)
            assert router.route(MODEL).activation is None  # type: ignore[union-attr]
            shown = (await http.get(f"/api/v1/models/{MODEL}")).json()["model"]["status"]
            assert shown["activation"] is None
        nursery.cancel_scope.cancel()
