"""Draining a node end to end (issue 25, point 1): a real control plane, two real agents running sim engine
processes, and the gateway's /v1 API under a client load. Both models run on node "a"; `POST
/api/v1/nodes/a/drain` moves them to "b" one at a time, each replacement ready before the old replica leaves
the routes, the old one stopped `drain_stop_grace_s` later: the load sees no failed request. `GET
/api/v1/nodes` says how far the drain is; a cordon places nothing new and uncordon ends it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from functools import partial
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
from llmgw.gateway.app import GatewayDeps
from llmgw.gateway.app import serve as gateway_serve
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-drain-test"
CLIENT = "sk-client-drain-test"
MODELS = [f"m{i}-{os.getpid()}" for i in (1, 2)]
GRACE_S = 2.0  # drain_stop_grace_s here: longer than any request of the load (~1 s)


async def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_a_drain_under_load_fails_no_request(tmp_path: Path, nursery: trio.Nursery) -> None:
    router = Router()
    # 40 tokens a second, and the sim echoes the prompt: a 40-word answer takes ~1 s (longer than the sim's own
    # 0.5 s grace on SIGTERM), so requests are in flight when a replica leaves.
    models = [ModelDef.from_doc({"name": m, "engine": "sim", "source": f"sim://{m}",
                                 "args": ["--tokens-per-s", "40", "--startup-delay", "0.5"]}) for m in MODELS]
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=free_port(),
                           seed=Seed(admin_key=ADMIN, client_key=CLIENT, models=models), sinks=[router],
                           demand=[router], timeouts=replace(TIMEOUTS, drain_stop_grace_s=GRACE_S))
    control: ControlHandle = await nursery.start(control_serve, config)
    ctx = control.context
    assert ctx is not None

    async def agent(name: str) -> None:
        probe = FakeGpuProbe(NodeInfo("x", hostname=f"host-{name}", cpus=4, engines=("sim",)))
        await nursery.start(agent_serve, AgentConfig(
            controls=[control.admin_url], tls=None, local_credential=ctx.local_credential("agent", name),
            state_dir=tmp_path / name, node=name, probe=probe))

    def nodes_of_placements() -> list[str]:
        return sorted(p.node for p in ctx.state().placements.values())

    def ready(model: str) -> bool:
        route = router.route(model)
        return route is not None and bool(route.endpoints)

    await agent("a")
    await wait_for(lambda: all(ready(m) for m in MODELS))
    assert nodes_of_placements() == ["a", "a"]
    await agent("b")
    await wait_for(lambda: "b" in control.hub.nodes)
    host, port = await nursery.start(partial(gateway_serve, "127.0.0.1", 0,
                                             GatewayDeps(router=router, state=control.store)))
    served: list[str] = []
    failed: list[str] = []
    stop_load = trio.Event()

    async def load(client: httpx.AsyncClient, worker: int) -> None:
        n = 0
        while not stop_load.is_set():
            model, stream = MODELS[(worker + n) % 2], (worker + n) % 3 == 0
            n += 1
            body = {"model": model, "messages": [{"role": "user", "content": f"hi {worker} {n} " + "word " * 40}],
                    "max_tokens": 40, "stream": stream}
            try:
                r = await client.post("/v1/chat/completions", json=body)
                text = r.text
                ok = r.status_code == 200 and (("[DONE]" in text) if stream else bool(r.json()["choices"]))
            except httpx.HTTPError as e:
                ok, text = False, repr(e)
            (served if ok else failed).append(f"{model} stream={stream}: {text[:200]}")

    async with httpx.AsyncClient(base_url=control.admin_url, headers={"authorization": f"Bearer {ADMIN}"},
                                 timeout=30) as admin, \
            httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {CLIENT}"},
                              timeout=30) as client:

        async def node_doc(name: str) -> dict[str, Any]:
            r = await admin.get("/api/v1/nodes")
            assert r.status_code == 200, r.text
            return next(n for n in r.json()["nodes"] if n["node"] == name)

        # A cordon on b first: nothing moves, and a drain of a has nowhere to go.
        r = await admin.post("/api/v1/nodes/b/cordon")
        assert r.status_code == 200 and r.json()["cordon"] == "cordon" and r.json()["changed"] is True, r.text
        assert (await admin.post("/api/v1/nodes/nowhere/drain")).status_code == 404

        async with trio.open_nursery() as load_nursery:
            for w in range(4):
                load_nursery.start_soon(load, client, w)
            await wait_for(lambda: len(served) >= 8)
            r = await admin.post("/api/v1/nodes/a/drain")
            assert r.status_code == 200 and r.json()["cordon"] == "drain", r.text
            with trio.fail_after(30):
                while "blocked: nowhere to go" not in str((await node_doc("a"))["drain"]):
                    await trio.sleep(0.05)
            doc = await node_doc("a")
            assert doc["drain"]["left"] == 2 and "cordoned" in doc["drain"]["blocked"], doc["drain"]
            assert nodes_of_placements() == ["a", "a"], "blocked: the replicas stay and serve"
            # b takes replicas again: the drain goes on, one model at a time.
            r = await admin.post("/api/v1/nodes/b/uncordon")
            assert r.status_code == 200 and r.json()["cordon"] == "none", r.text
            most_moving = 0
            with trio.fail_after(60):
                while True:
                    placements = list(ctx.state().placements.values())
                    starting = [p for p in placements if p.node == "b"
                                and (o := ctx.observed().replicas.get(p.replica_id)) is not None
                                and o.state != "ready"]
                    most_moving = max(most_moving, len(starting))
                    if all(p.node == "b" for p in placements) and len(placements) == 2 \
                            and not any(o.node == "a" for o in ctx.observed().replicas.values()):
                        break
                    await trio.sleep(0.05)
            doc = await node_doc("a")
            assert doc["cordon"] == "drain" and doc["drain"]["left"] == 0 and doc["drain"]["words"].startswith(
                "drained"), doc
            before = len(served)
            await wait_for(lambda: len(served) >= before + 8)  # the models serve from b
            stop_load.set()
        print(f"\ndrain under load: {len(served)} requests served, {len(failed)} failed "
              f"(4 clients, 2 models moved off node a, at most {most_moving} replacement starting at once)")
        assert failed == [], failed[:5]
        assert most_moving <= 1, "one move at a time"
        status = (await admin.get("/api/v1/status")).text
        assert "is drained" in status
        r = await admin.post("/api/v1/nodes/a/uncordon")
        assert r.status_code == 200 and r.json()["changed"] is True
        assert (await node_doc("a"))["cordon"] == "none"
