"""Tools for a llama.cpp model whose chat template calls none (the tiny GGUF the suite writes): llama.cpp would
answer in text, the tools ignored, even with tool_choice "required". The agent reads its /props once it is ready
and reports the replica's `tool_calls`; the fact reaches every gateway's routing table, and a request that asks
for tools is refused by name (400 `unsupported_parameter`, param `tools`) instead of silently ignored. A model
whose endpoint calls tools, or does not say, is passed as before; a fallback that cannot call them is passed
over."""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute, NodeInfo
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps
from llmgw.gateway.app import serve as gateway_serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from tests.support.one_node import one_node, wait_for

ADMIN = "sk-admin-llamacpp-tools"
CLIENT = "sk-client-llamacpp-tools"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}

no_xllamacpp = pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None,
                                  reason="the llamacpp extra is not installed")
no_gguf = pytest.mark.skipif(importlib.util.find_spec("gguf") is None,
                             reason="the gguf package (test extra) is missing")


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "weather in Paris?"}], "max_tokens": 8,
            "temperature": 0, **extra}


def refused_by_name(r: httpx.Response, model: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", "tools"), error
    assert f"model {model!r}" in error["message"] and "chat template" in error["message"], error


@pytest.mark.slow
@no_xllamacpp
@no_gguf
async def test_a_llamacpp_template_without_tools_is_reported_and_tools_refused_by_name(tmp_path: Path) -> None:
    from tests.support.tiny_gguf import write_tiny_llama

    weights = write_tiny_llama(tmp_path / "tiny.gguf")
    base = ModelDef.from_doc({"name": "tiny", "engine": "llama.cpp", "source": str(weights),
                              "args": ["--ctx-size", "512"], "profile": {"cpu": True, "memory_gib": 0.01}})
    node = NodeInfo("x", hostname="test-node", cpus=2, memory_total=8 << 30, engines=("llama.cpp",))
    async with one_node(tmp_path, [base], admin_key=ADMIN, client_key=CLIENT, node=node) as cluster:
        router = cluster.router
        async with httpx.AsyncClient(base_url=cluster.gateway_url, headers={"authorization": f"Bearer {CLIENT}"},
                                     timeout=120) as client:
            await wait_for(lambda: (r := router.route("tiny")) is not None and r.state == "ready")
            # The agent read llama.cpp's /props before it called the replica ready: the route says it at once.
            assert [e.tool_calls for e in router.route("tiny").endpoints] == [False]  # type: ignore[union-attr]
            for choice in ("required", "auto", None):
                body = chat("tiny", tools=[WEATHER], **({"tool_choice": choice} if choice else {}))
                refused_by_name(await client.post("/v1/chat/completions", json=body), "tiny")
            r = await client.post("/v1/responses", json={"model": "tiny", "input": "weather in Paris?",
                                                         "tools": [{"type": "function", **WEATHER["function"]}]})
            refused_by_name(r, "tiny")
            # No tools asked (none, or turned off): answered as before.
            for extra in ({}, {"tools": [WEATHER], "tool_choice": "none"}, {"tools": []}):
                r = await client.post("/v1/chat/completions", json=chat("tiny", **extra))
                assert r.status_code == 200, (extra, r.text)


async def test_tools_pass_where_an_endpoint_calls_them_or_does_not_say(nursery: trio.Nursery) -> None:
    """Scripted routes to a sim engine (which calls tools) under llama.cpp definitions: what the endpoints say
    decides, including a fallback, and a model that was starting when the request came."""
    store = MemoryStore()
    for name, extra in (("calls", {}), ("unknown", {}), ("plain", {"fallbacks": ["calls"]}),
                        ("plain-only", {"fallbacks": ["plain"]}),
                        ("cold", {"mode": "on-demand", "activation_window_s": 30})):
        store.submit_nowait(commands.put_model(ModelDef.from_doc(
            {"name": name, "engine": "llama.cpp", "source": f"/models/{name}.gguf", **extra}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(CLIENT), "test", "client", 0.0))
    url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, "calls", "chat", 0)))
    says = {"calls": True, "unknown": None, "plain": False, "plain-only": False}
    routes = {name: ModelRoute(name, "chat", "ready", (Endpoint(f"{name}-r1", url, tool_calls=calls),))
              for name, calls in says.items()}
    routes["cold"] = ModelRoute("cold", "chat", "starting")
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(gateway_serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {CLIENT}"},
                                 timeout=30) as client:
        for model in ("calls", "unknown"):
            r = await client.post("/v1/chat/completions", json=chat(model, tools=[WEATHER], tool_choice="required"))
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        # `plain` calls no tools: refused by its own name, its fallback is not taken for a refusal of the
        # request itself; a fallback that cannot call them is passed over.
        refused_by_name(await client.post("/v1/chat/completions", json=chat("plain", tools=[WEATHER])), "plain")
        routes["plain-only"] = ModelRoute("plain-only", "chat", "parked", (), "parked for the test")
        router.update_routes(routes)
        r = await client.post("/v1/chat/completions", json=chat("plain-only", tools=[WEATHER]))
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_parked", r.text  # `plain` passed over
        assert (await client.post("/v1/chat/completions", json=chat("plain-only"))).status_code == 200  # taken
        # A model that becomes ready while the request waits: refused once its endpoint says it calls none.
        async with trio.open_nursery() as waiting:
            answers: list[httpx.Response] = []

            async def ask() -> None:
                answers.append(await client.post("/v1/chat/completions", json=chat("cold", tools=[WEATHER])))

            waiting.start_soon(ask)
            await wait_for(lambda: router.outstanding().get("cold"), timeout=10)
            routes["cold"] = ModelRoute("cold", "chat", "ready", (Endpoint("cold-r1", url, tool_calls=False),))
            router.update_routes(routes)
        refused_by_name(answers[0], "cold")
