"""Node approval end to end (issue 25, point 2): a real control plane and two real agents over the
WebSocket stream, with a sim engine process. Turning `nodes.require_approval` on approves the node
already there; a node that connects after it is pending, listed with its inventory by
`GET /api/v1/nodes`, and gets nothing placed (the model says "waiting for approval") until
`POST /api/v1/nodes/{name}/approve`; then the model's replica starts on it and serves. After a restart
of the control plane (a new term, the agents reconnecting) both nodes are still approved."""

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
from llmgw.domain.observed import NodeInfo
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-approval-test"
GIB = 1 << 30


async def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_a_new_node_waits_for_approval_then_takes_the_replica(tmp_path: Path) -> None:
    router = Router()
    seed = Seed(admin_key=ADMIN, models=[ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"})])
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router], demand=[router])
    async with trio.open_nursery() as nursery:
        control_scope = trio.CancelScope()

        async def run_control(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with control_scope:
                await control_serve(config, task_status=task_status)

        control: ControlHandle = await nursery.start(run_control)
        ctx = control.context
        assert ctx is not None

        async def agent(name: str, engines: tuple[str, ...]) -> None:
            probe = FakeGpuProbe(NodeInfo("x", hostname=f"host-{name}", cpus=4, memory_total=16 * GIB, engines=engines))
            await nursery.start(agent_serve, AgentConfig(
                controls=[control.admin_url], tls=None, local_credential=ctx.local_credential("agent", name),
                state_dir=tmp_path / name, node=name, probe=probe))

        async with httpx.AsyncClient(base_url=control.admin_url,
                                     headers={"authorization": f"Bearer {ADMIN}"}) as admin:
            # "old" was there before approval was required (no sim engine: demo never goes there).
            await agent("old", ())
            await wait_for(lambda: "old" in control.hub.nodes)
            r = await admin.put("/api/v1/settings/nodes.require_approval", json=True)
            assert r.status_code == 200, r.text
            assert "old" in ctx.state().approved_nodes, "a node known when the setting is turned on is approved"

            await agent("new", ("sim",))
            await wait_for(lambda: "new" in control.hub.nodes)

            async def node_doc(name: str) -> dict[str, Any]:
                r = await admin.get("/api/v1/nodes")
                assert r.status_code == 200, r.text
                return next(n for n in r.json()["nodes"] if n["node"] == name)

            async def demo_reason() -> str:
                r = await admin.get("/api/v1/models/demo")
                assert r.status_code == 200, r.text
                return str(r.json())

            new = await node_doc("new")
            assert new["state"] == "connected" and new["approval"] == "pending"
            assert new["engines"] == ["sim"] and new["memory_total"] == 16 * GIB and new["gpus"] == []
            assert new["hostname"] == "host-new" and new["cpus"] == 4
            assert (await node_doc("old"))["approval"] == "approved"
            # The reconciler has looked at the fleet with "new" in it: the model says why it waits.
            with trio.fail_after(30):
                while "waiting for approval" not in await demo_reason():
                    await trio.sleep(0.05)
            assert not ctx.state().placements, "nothing is placed on a pending node"
            assert router.route("demo") is None or not router.route("demo").endpoints  # type: ignore[union-attr]

            r = await admin.post("/api/v1/nodes/nowhere/approve")
            assert r.status_code == 404 and r.json()["error"]["code"] == "node_not_found"
            r = await admin.post("/api/v1/nodes/new/approve")
            assert r.status_code == 200 and r.json()["approved"] == "new" and r.json()["already"] is False, r.text
            assert (await node_doc("new"))["approval"] == "approved"

            def ready_on_new() -> bool:
                route = router.route("demo")
                return bool(route and route.endpoints) and all(
                    p.node == "new" for p in ctx.state().placements.values())

            await wait_for(ready_on_new)
            r = await admin.post("/api/v1/nodes/new/approve")
            assert r.status_code == 200 and r.json()["already"] is True
            placed = dict(ctx.state().placements)

        # A new term (the control plane restarts from its state; the agents reconnect): nobody is asked again.
        machines = dict(ctx.local_machines)
        control_scope.cancel()
        await wait_for(lambda: control_scope.cancelled_caught)
        control = await nursery.start(lambda task_status: control_serve(config, task_status=task_status))
        ctx = control.context
        assert ctx is not None
        ctx.local_machines.update(machines)  # the in-process agents' credentials, as before the restart
        await wait_for(lambda: {"old", "new"} <= set(control.hub.nodes))
        async with httpx.AsyncClient(base_url=control.admin_url,
                                     headers={"authorization": f"Bearer {ADMIN}"}) as admin:
            r = await admin.get("/api/v1/nodes")
            assert {n["node"]: n["approval"] for n in r.json()["nodes"]} == {"old": "approved", "new": "approved"}
            assert "waiting for approval" not in (await admin.get("/api/v1/status")).text
        assert dict(ctx.state().placements) == placed, "the replica stays where it was"
        nursery.cancel_scope.cancel()
