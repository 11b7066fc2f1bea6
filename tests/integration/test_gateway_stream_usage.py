"""A stream's tokens are counted from the engine's final usage chunk even when the client did not ask for it
(issue 9, points 1 and 5): a key's tokens/min is charged for a stream, so a stream cannot slip past a token limit.
Through the whole gateway in front of a sim engine; the client sees no usage chunk it did not ask for."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

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
from llmgw.testing import MemoryStore

KEY = "sk-stream-usage-client"
TOKENS_PER_MIN = 60


@pytest.fixture
async def http(nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": "demo", "engine": "sim",
                                                               "source": "sim://demo"}), 0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "client", "client", 0.0, tokens_per_min=TOKENS_PER_MIN))
    url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, "demo", "chat", 0)))
    router = Router()
    router.update_routes({"demo": ModelRoute("demo", "chat", "ready", (Endpoint("demo-r1", url),))})
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


async def test_a_stream_the_client_took_without_usage_is_still_charged_to_its_key(http: httpx.AsyncClient) -> None:
    words = " ".join(["word"] * 80)  # well over the key's minute of tokens, in and out
    body = {"model": "demo", "messages": [{"role": "user", "content": words}], "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        text = (await response.aread()).decode()
    assert text.rstrip().endswith("data: [DONE]")
    # No usage chunk it did not ask for (the other chunks may say `"usage":null`, as OpenAI's do once asked).
    assert '"usage":{' not in text.replace(" ", ""), text
    second = await http.post("/v1/chat/completions", json=body)
    assert second.status_code == 429, second.text  # the stream's tokens were charged: the key is in debt
    assert second.json()["error"]["code"] == "rate_limited" and int(second.headers["retry-after"]) >= 1
