"""OpenAI's richer fields through the gateway to the real llama.cpp server (the tiny GGUF the suite writes):
what the table (gateway/capabilities.py) says it honours reaches it and comes back in OpenAI's shape, and
what it cannot do is refused by name before it is asked."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.capabilities import HONOURED
from llmgw.gateway.router import Router
from tests.support.processes import free_port
from llmgw.testing import MemoryStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the llamacpp extra is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package (test extra) is missing"),
]

KEY = "sk-test-llamacpp"


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.integration.test_llamacpp_tiny import Engine, spec, tiny

    where = tmp_path_factory.mktemp("llamacpp-fields")
    port = free_port("127.0.0.1")
    engine = Engine(spec(tiny(where), port, args=("--ctx-size", "512"), roots=(str(where),)), where / "engine.log")
    try:
        url = f"http://127.0.0.1:{port}"
        engine.wait_healthy(url)
        yield url
    finally:
        engine.stop()


@dataclass
class Setup:
    http: httpx.AsyncClient


@pytest.fixture
async def gw(nursery: trio.Nursery, engine_url: str) -> AsyncIterator[Setup]:
    store = MemoryStore()
    for name, role in (("tiny", "chat"), ("tiny-embed", "embedding")):
        doc = {"name": name, "engine": "llama.cpp", "source": "/models/tiny.gguf", "role": role}
        store.submit_nowait(commands.put_model(ModelDef.from_doc(doc), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    # The embedding model's route is the chat engine: a refusal by the gateway never reaches it.
    router.update_routes({name: ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", engine_url),))
                          for name, role in (("tiny", "chat"), ("tiny-embed", "embedding"))})
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"},
                                 timeout=30) as http:
        yield Setup(http)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0,
            **extra}


async def test_json_schema_logprobs_and_stop_reach_llama_cpp(gw: Setup) -> None:
    assert {"response_format", "logprobs", "top_logprobs", "stop"} <= HONOURED["llama.cpp"]["chat"]  # the table
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                logprobs=True, top_logprobs=2)
    answer = (await gw.http.post("/v1/chat/completions", json=body)).json()
    choice = answer["choices"][0]
    assert choice["message"]["content"].startswith("{")  # its grammar from the schema: JSON from a random model
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    for entry in content:
        assert isinstance(entry["logprob"], float) and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
    # A stop string cuts the answer where it first occurs (temperature 0: the same tokens each time).
    free = (await gw.http.post("/v1/chat/completions", json=chat())).json()["choices"][0]["message"]["content"]
    word = free.split()[1] if len(free.split()) > 1 else free[1:3]
    stopped = (await gw.http.post("/v1/chat/completions", json=chat(stop=[word, "\u2603"]))).json()["choices"][0]
    assert stopped["message"]["content"] == free[: free.index(word)] and stopped["finish_reason"] == "stop"


async def test_what_llama_cpp_cannot_do_is_refused_by_name(gw: Setup) -> None:
    for path, body, field in (("/v1/chat/completions", chat(n=2), "n"),
                              ("/v1/completions", {"model": "tiny", "prompt": "hi", "echo": True}, "echo"),
                              ("/v1/embeddings", {"model": "tiny-embed", "input": "hi", "dimensions": 8},
                               "dimensions")):
        response = await gw.http.post(path, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", field)
        assert "llama.cpp" in error["message"] and f"'{field}'" in error["message"]
    # Nulls and values that ask nothing pass to the engine.
    ok = await gw.http.post("/v1/chat/completions", json=chat(n=1, moderation=None, prompt_cache_retention=None))
    assert ok.status_code == 200 and json.loads(ok.text)["choices"][0]["message"]["content"] is not None
