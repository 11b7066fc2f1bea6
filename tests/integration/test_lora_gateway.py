"""LoRA adapters as models, through the whole system: a real control plane, an agent running sim engine
processes, and the gateway's /v1 API. An adapter defined through the admin API on a running base is listed in
/v1/models, loaded on the base's replica on demand (the request waits as for an activation) and answered by the
adapter; an engine that answers 200 to the load and does not list the adapter (`--lora-lie`) never makes it
routable, and a file the engine refuses neither: both refused at once, with why, which the operator sees too."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
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
from llmgw.gateway.app import GatewayDeps
from llmgw.gateway.app import serve as gateway_serve
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-lora-test"
CLIENT = "sk-client-lora-test"
BASE = f"base-{os.getpid()}"
LIAR = f"liar-{os.getpid()}"


async def wait_for(predicate: Callable[[], object], timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


def chat(model: str, text: str = "hello there") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


@pytest.fixture
async def world(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient,
                                                                              Router, Path]]:
    router = Router()
    models = [ModelDef.from_doc({"name": BASE, "engine": "sim", "source": "sim://base"}),
              ModelDef.from_doc({"name": LIAR, "engine": "sim", "source": "sim://liar", "args": ["--lora-lie"]})]
    seed = Seed(admin_key=ADMIN, client_key=CLIENT, models=models)
    control_cfg = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                                admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router],
                                demand=[router])
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    control: ControlHandle = await nursery.start(control_serve, control_cfg)
    assert control.context is not None
    credential = control.context.local_credential("agent", "n1")
    await nursery.start(agent_serve, AgentConfig(controls=[control.admin_url], tls=None, local_credential=credential,
                                                 state_dir=tmp_path / "agent", node="n1", probe=probe))
    host, port = await nursery.start(partial(gateway_serve, "127.0.0.1", 0,
                                             GatewayDeps(router=router, state=control.store)))
    lora = tmp_path / "lora"
    lora.mkdir()
    async with httpx.AsyncClient(base_url=control.admin_url, headers={"authorization": f"Bearer {ADMIN}"},
                                 timeout=30) as admin, \
            httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {CLIENT}"},
                              timeout=60) as client:
        assert (await admin.put("/api/v1/settings/models.weights_dirs", json=[str(lora)])).status_code == 200
        await wait_for(lambda: all((r := router.route(m)) is not None and r.state == "ready" for m in (BASE, LIAR)))
        yield admin, client, router, lora


async def define(admin: httpx.AsyncClient, name: str, base: str, source: Path) -> dict[str, Any]:
    r = await admin.post("/api/v1/models", json={"name": name, "base": base, "source": str(source)})
    assert r.status_code == 201, r.text
    model: dict[str, Any] = r.json()["model"]
    return model


async def test_an_adapter_is_listed_loaded_on_demand_and_answers_as_itself(world: Any) -> None:
    admin, client, router, lora = world
    (lora / "pirate.safetensors").write_bytes(b"adapter weights")
    shown = await define(admin, "pirate", BASE, lora / "pirate.safetensors")
    assert (shown["engine"], shown["role"], shown["base"]) == ("sim", "chat", BASE)  # from its base
    ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert "pirate" in ids and BASE in ids
    # Not loaded anywhere yet (or just being loaded): the request waits for it, then the adapter answers.
    r = await client.post("/v1/chat/completions", json=chat("pirate"))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "sim[pirate] says: hello there"
    # The base still answers as itself, on the same replica.
    r = await client.post("/v1/chat/completions", json=chat(BASE))
    assert r.json()["choices"][0]["message"]["content"] == "sim says: hello there"
    route = router.route("pirate")
    base_route = router.route(BASE)
    assert route.state == "ready" and route.base == BASE
    assert [e.replica_id for e in route.endpoints] == [e.replica_id for e in base_route.endpoints]
    status = (await admin.get("/api/v1/models/pirate")).json()["model"]["status"]
    assert list(status["adapter_on"].values()) == ["loaded"]
    assert (await admin.get(f"/api/v1/models/{BASE}")).json()["model"]["status"]["adapters"] == ["pirate"]


async def test_an_engine_that_says_loaded_but_does_not_list_it_never_makes_it_routable(world: Any) -> None:
    admin, client, router, lora = world
    (lora / "fib.safetensors").write_bytes(b"adapter weights")
    await define(admin, "fib", LIAR, lora / "fib.safetensors")
    r = await client.post("/v1/chat/completions", json=chat("fib"))
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "model_unplaceable"
    assert "loaded on no replica" in error["message"] and "does not list the adapter" in error["message"]
    assert router.route("fib").endpoints == ()
    status = (await admin.get("/api/v1/models/fib")).json()["model"]["status"]
    assert status["state"] == "unplaceable" and "does not list the adapter" in status["reason"]
    [state] = status["adapter_on"].values()
    assert state.startswith("failed: ") and "does not list" in state


async def test_a_file_the_engine_refuses_is_refused_with_the_engines_words(world: Any) -> None:
    admin, client, _, lora = world
    await define(admin, "ghost", BASE, lora / "no-such-file.safetensors")  # inside the allowed dir, not there
    r = await client.post("/v1/chat/completions", json=chat("ghost"))
    assert r.status_code == 503, r.text
    assert "No adapter found" in r.json()["error"]["message"]


async def test_an_adapter_outside_the_weights_dirs_or_of_an_unknown_base_is_not_stored(world: Any) -> None:
    admin, _, _, lora = world
    r = await admin.post("/api/v1/models", json={"name": "far", "base": BASE, "source": "/etc/passwd"})
    assert r.status_code == 400 and "outside the directories allowed" in r.json()["error"]["message"]
    for engine in ({"engine": "sim"}, {}):
        r = await admin.post("/api/v1/models", json={"name": "orphan", "base": "nobody", "source": str(lora / "x"),
                                                     **engine})
        assert r.status_code == 400 and r.json()["error"]["message"] == "base: 'nobody' is not a defined model"
