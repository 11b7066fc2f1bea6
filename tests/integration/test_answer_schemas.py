"""Every /v1 answer through the gateway validates against OpenAI's published schemas (the pinned part of its
OpenAPI document, tests/fixtures/openai/schemas.json): chat, completions (whole, and every streamed chunk),
embeddings (float and base64), the model list and one model, and error bodies (400, 401, 404, 429, 503, and an
engine's own refusal), from the sim engine and from the real llama.cpp engine on the tiny GGUF the suite writes.

llama.cpp leaves out `choices[].logprobs`, `message.refusal` and `logprobs.refusal`: the gateway adds them
(llmgw/gateway/normalise.py), and these tests fail without it."""

from __future__ import annotations

import base64
import importlib.util
import json
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from tests.support.processes import free_port
from llmgw.testing import MemoryStore
from tests.support.openai_spec import chunk_errors, errors

KEY = "sk-schema-client"
LIMITED = "sk-schema-one-a-minute"
LLAMA = importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec("gguf") is not None
ENGINES = ["sim", pytest.param("llama.cpp", marks=[
    pytest.mark.slow, pytest.mark.skipif(not LLAMA, reason="the llamacpp extra or the gguf package is missing")])]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two llama.cpp engines on the tiny GGUF, started once for the module: a chat one and an embedding one."""
    if not LLAMA:
        yield {}
        return
    from tests.integration.test_llamacpp_tiny import Engine, spec, tiny

    base = tmp_path_factory.mktemp("llama")
    weights = tiny(base)
    started: list[Engine] = []
    urls: dict[str, str] = {}
    try:
        for role, args in (("chat", ("--ctx-size", "256")), ("embedding", ("--pooling", "mean", "--ctx-size", "256"))):
            port = free_port("127.0.0.1")
            engine = Engine(spec(weights, port, role=role, args=args, roots=(str(base),)), base / f"{role}.log")
            started.append(engine)
            urls[role] = f"http://127.0.0.1:{port}"
            engine.wait_healthy(urls[role])
        yield urls
    finally:
        for engine in started:
            engine.stop()


@dataclass
class World:
    http: httpx.AsyncClient
    store: MemoryStore


def _model(name: str, role: str = "chat") -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", "role": role})


@pytest.fixture
async def world(nursery: trio.Nursery, llama: dict[str, str]) -> AsyncIterator[World]:
    store = MemoryStore()
    for model in (_model("sim"), _model("sim-embed", "embedding"), _model("parked")):
        store.submit_nowait(commands.put_model(model, at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "client", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(LIMITED), "limited", "client", 0.0, requests_per_min=1))
    routes = {"parked": ModelRoute("parked", "chat", "parked", (), "5 failed starts")}
    for name, role in (("sim", "chat"), ("sim-embed", "embedding")):
        url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, name, role, 0)))
        routes[name] = ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", url),))
    if llama:
        for name, role in (("llama.cpp", "chat"), ("llama.cpp-embed", "embedding")):
            store.submit_nowait(commands.put_model(ModelDef.from_doc(
                {"name": name, "engine": "llama.cpp", "source": "/models/tiny.gguf", "role": role}), at=0.0))
            routes[name] = ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", llama[role]),))
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"},
                                 timeout=30) as http:
        yield World(http, store)


def problems(name: str, doc: Any) -> str:
    found = errors(name, doc)
    return "" if not found else f"{name}: {found}\n{json.dumps(doc)[:1500]}"


async def chunks(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[Any]:
    async with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        text = (await response.aread()).decode()
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert events[-1] == "[DONE]", text
    return [json.loads(e) for e in events[:-1]]


CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}
ASKS = [{}, {"logprobs": True, "top_logprobs": 2}, {"stream_options": {"include_usage": True}}]


@pytest.mark.parametrize("engine", ENGINES)
async def test_chat_answers_and_chunks_match_the_schemas(world: World, engine: str) -> None:
    for asks in ASKS:
        body = {"model": engine, **CHAT, **asks}
        if "stream_options" not in asks:
            response = await world.http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert not problems("CreateChatCompletionResponse", response.json())
        streamed = await chunks(world.http, "/v1/chat/completions", body)
        assert len(streamed) >= 2
        for chunk in streamed:
            assert not problems("CreateChatCompletionStreamResponse", chunk)
        assert any("usage" in c for c in streamed) == ("stream_options" in asks)


@pytest.mark.parametrize("engine", ENGINES)
async def test_completion_answers_and_chunks_match_the_schema(world: World, engine: str) -> None:
    for asks in ({}, {"logprobs": 2}, {"stream_options": {"include_usage": True}}):
        body = {"model": engine, "prompt": "hello", "max_tokens": 3, "temperature": 0, **asks}
        if "stream_options" not in asks:
            response = await world.http.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            assert not problems("CreateCompletionResponse", response.json())
            if engine == "llama.cpp" and "logprobs" in asks:  # its chat-shaped logprobs, and OpenAI's shape beside
                logprobs = response.json()["choices"][0]["logprobs"]
                assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["content"]) == 3
        # OpenAI documents a completion's chunks with the whole answer's schema (finish_reason null until the last).
        for chunk in await chunks(world.http, "/v1/completions", body):
            assert chunk_errors("CreateCompletionResponse", chunk) == [], chunk


@pytest.mark.parametrize("engine", ENGINES)
async def test_embeddings_float_and_base64_match_the_schema(world: World, engine: str) -> None:
    body = {"model": f"{engine}-embed", "input": ["hello world", "the cluster"]}
    floats = (await world.http.post("/v1/embeddings", json=body)).json()
    assert not problems("CreateEmbeddingResponse", floats)
    answer = (await world.http.post("/v1/embeddings", json={**body, "encoding_format": "base64"})).json()
    # The schema describes the floats only; OpenAI's base64 answer is the same document with each vector
    # as little-endian float32 bytes: decoded, it must be the same document.
    for item in answer["data"]:
        raw = base64.b64decode(item["embedding"])
        item["embedding"] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert not problems("CreateEmbeddingResponse", answer)
    assert [len(i["embedding"]) for i in answer["data"]] == [len(i["embedding"]) for i in floats["data"]]


async def test_the_model_list_and_one_model_match_the_schemas(world: World) -> None:
    listed = (await world.http.get("/v1/models")).json()
    assert not problems("ListModelsResponse", listed) and {m["id"] for m in listed["data"]} >= {"sim", "sim-embed"}
    assert not problems("Model", (await world.http.get("/v1/models/sim")).json())


async def test_error_bodies_match_the_schema(world: World) -> None:
    http = world.http
    answers = {
        400: await http.post("/v1/chat/completions", json={"model": "sim", **CHAT, "max_tokens": "four"}),
        401: await http.post("/v1/chat/completions", json={"model": "sim", **CHAT}, headers={"authorization": ""}),
        404: await http.post("/v1/chat/completions", json={"model": "no-such-model", **CHAT}),
        503: await http.post("/v1/chat/completions", json={"model": "parked", **CHAT}),
    }
    limited = {"authorization": f"Bearer {LIMITED}"}
    for _ in range(2):
        answers[429] = await http.post("/v1/chat/completions", json={"model": "sim", **CHAT}, headers=limited)
    answers[405] = await http.get("/v1/chat/completions")
    for status, response in answers.items():
        assert response.status_code == status, response.text
        assert not problems("ErrorResponse", response.json())


@pytest.mark.slow
@pytest.mark.skipif(not LLAMA, reason="the llamacpp extra or the gguf package is missing")
async def test_an_engines_own_refusal_matches_the_schema(world: World) -> None:
    # Beyond the tiny model's context (256): llama.cpp's own 400, in its own shape, relayed in OpenAI's.
    body = {"model": "llama.cpp", "messages": [{"role": "user", "content": "hello " * 400}], "max_tokens": 2}
    response = await world.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert not problems("ErrorResponse", response.json())
