"""Fast wake through the whole system (issue 25 point 4): a real control plane, an agent running sim engine
processes on one (fake) GPU, and the gateway's /v1 API. An idle on-demand model with `sleep_level` sleeps (its
engine told `POST /sleep`, its placement kept), a request wakes it (`POST /wake_up`, the same replica: no cold
start) and is answered; another model that wants the GPU evicts the asleep replica, whose engine is stopped."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.app import GatewayDeps
from llmgw.gateway.app import serve as gateway_serve
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from llmgw.testing.builders import node
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-wake-test"
CLIENT = "sk-client-wake-test"
IDLE_S = 1.0
TIMEOUTS_HERE = dataclasses.replace(TIMEOUTS, reconcile_tick_s=0.1)


def gpu_sim(name: str, *args: str, **extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", "mode": "on-demand",
                              "idle_timeout_s": IDLE_S, "profile": {"gpus": 1}, "args": list(args), **extra})


async def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "wake up"}]}


async def test_an_idle_model_sleeps_a_request_wakes_it_and_an_eviction_stops_it(tmp_path: Path) -> None:
    router = Router()
    seed = Seed(admin_key=ADMIN, client_key=CLIENT, models=[gpu_sim("other")])
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router],
                           demand=[router], timeouts=TIMEOUTS_HERE)
    probe = FakeGpuProbe(node("x").gpus(1).engines("sim").build())
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        assert control.context is not None
        await nursery.start(agent_serve, AgentConfig(
            controls=[control.admin_url], tls=None, local_credential=control.context.local_credential("agent", "n1"),
            state_dir=tmp_path / "agent", node="n1", probe=probe))
        host, port = await nursery.start(partial(gateway_serve, "127.0.0.1", 0,
                                                 GatewayDeps(router=router, state=control.store)))

        def placements(model: str) -> list[Any]:
            return [p for p in control.store.snapshot().placements.values() if p.model == model]

        def reported(rid: str) -> str:
            obs = control.hub.observed().replicas.get(rid)
            return obs.state if obs is not None else ""

        # `sleep_level` is a field of store level 3: defined once the new group has raised its level.
        await wait_for(lambda: control.store.snapshot().store_level >= 3)
        # A cold start of `lazy` takes 1 s (`--startup-delay`), a wake 0.05 s (`--wake-delay`).
        lazy = gpu_sim("lazy", "--startup-delay", "1", "--wake-delay", "0.05", sleep_level=1)
        async with httpx.AsyncClient(base_url=control.admin_url, headers={"authorization": f"Bearer {ADMIN}"}) as admin:
            r = await admin.post("/api/v1/models", json=lazy.to_doc())
            assert r.status_code == 201, r.text
            refused = await admin.post("/api/v1/models", json={**lazy.to_doc(), "name": "cpp", "engine": "llama.cpp",
                                                               "source": "/models/x.gguf"})
            assert refused.status_code == 400 and "engine llama.cpp cannot sleep" in refused.text, refused.text
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=60,
                                     headers={"authorization": f"Bearer {CLIENT}"}) as client:
            # A cold start: the request waits for it, then is answered.
            started = trio.current_time()
            r = await client.post("/v1/chat/completions", json=chat("lazy"))
            cold_s = trio.current_time() - started
            assert r.status_code == 200, r.text
            [first] = placements("lazy")
            assert cold_s >= 1.0

            # Idle past its timeout: asleep, not stopped; the placement (and its GPU) kept.
            await wait_for(lambda: reported(first.replica_id) == "sleeping")
            [kept] = placements("lazy")
            assert kept.replica_id == first.replica_id and kept.asleep and kept.gpus == first.gpus
            assert router.route("lazy").endpoints == ()  # nothing routed to a sleeping engine

            # A request wakes the same replica (no cold start) and is answered.
            started = trio.current_time()
            r = await client.post("/v1/chat/completions", json=chat("lazy"))
            wake_s = trio.current_time() - started
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "sim says: wake up"
            [woken] = placements("lazy")
            assert woken.replica_id == first.replica_id and not woken.asleep
            assert wake_s < cold_s / 2, (wake_s, cold_s)

            # Asleep again; then another model wants the only GPU: the asleep replica is evicted (its engine
            # stopped, its placement gone) and the other model answers.
            await wait_for(lambda: reported(first.replica_id) == "sleeping")
            r = await client.post("/v1/chat/completions", json=chat("other"))
            assert r.status_code == 200, r.text
            assert placements("lazy") == []
            await wait_for(lambda: reported(first.replica_id) == "")  # the agent stopped and forgot it
            assert router.route("lazy").state == "absent"
        nursery.cancel_scope.cancel()
