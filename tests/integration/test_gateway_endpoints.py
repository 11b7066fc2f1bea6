"""Every endpoint of the `/v1` API goes through the one request path (issue 23, point 4): a key's request limit
refuses its next request whatever the endpoint, and each request is in the request log under its path with
its key and the engine's usage, in the usage rollups, and in the metrics by endpoint — streamed requests too."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
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
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from tests.support.requestlog import record_of

ADMIN = "sk-endpoints-admin"
CHAT = [{"role": "user", "content": "count these four words"}]
# (path, body, whether the engine reports usage): one request of each kind, streamed where the API streams.
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("/v1/chat/completions", {"model": "demo", "messages": CHAT}, True),
    ("/v1/chat/completions", {"model": "demo", "messages": CHAT, "stream": True}, True),
    ("/v1/completions", {"model": "demo", "prompt": "count these four words"}, True),
    ("/v1/completions", {"model": "demo", "prompt": "count these four words", "stream": True}, True),
    ("/v1/embeddings", {"model": "emb", "input": "count these four words"}, True),
    ("/v1/responses", {"model": "demo", "input": "count these four words"}, True),
    ("/v1/responses", {"model": "demo", "input": "count these four words", "stream": True}, True),
    ("/v1/messages", {"model": "demo", "max_tokens": 16, "messages": CHAT}, True),
    ("/v1/messages", {"model": "demo", "max_tokens": 16, "messages": CHAT, "stream": True}, True),
    ("/v1/rerank", {"model": "rr", "query": "four words", "documents": ["four words", "other"]}, True),
    ("/v1/tokenize", {"model": "demo", "prompt": "count these four words"}, False),
    ("/v1/detokenize", {"model": "demo", "tokens": [1]}, False),
]


@dataclass
class Setup:
    url: str
    store: MemoryStore
    log: RequestLog


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Setup]:
    store = MemoryStore()
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "ops", "admin", 0.0))
    router = Router()
    routes = {}
    for name, role in (("demo", "chat"), ("emb", "embedding"), ("rr", "rerank")):
        store.submit_nowait(commands.put_model(ModelDef.from_doc(
            {"name": name, "engine": "sim", "source": f"sim://{name}", "role": role}), at=0.0))
        app = sim.make_app(sim.SimOptions("127.0.0.1", 0, name, role))
        url = await nursery.start(partial(sim.serve, app.opts, app=app))
        routes[name] = ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", url),))
    router.update_routes(routes)
    log = RequestLog(tmp_path / "requests", "gw1", timeouts=dataclasses.replace(TIMEOUTS, requestlog_flush_s=0.02))
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                requestlog=log)))
    yield Setup(f"http://{host}:{port}", store, log)


@pytest.mark.parametrize("path,body,usage", CASES, ids=[f"{p}{'-stream' if b.get('stream') else ''}"
                                                         for p, b, _ in CASES])
async def test_each_endpoint_is_limited_logged_rolled_up_and_counted(gw: Setup, path: str, body: dict[str, Any],
                                                                     usage: bool) -> None:
    secret = "sk-endpoint-one-request"
    gw.store.submit_nowait(commands.add_key(hash_key(secret), "one", "client", 0.0, key_id="key_one",
                                            requests_per_min=1))
    headers = {"authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=30) as http:
        first = await http.post(path, json=body)
        assert first.status_code == 200, first.text
        await first.aread()
        second = await http.post(path, json=body)  # the key's one request a minute is used, whatever the endpoint
        assert second.status_code == 429, second.text
        assert "rate_limit" in second.text

        with trio.fail_after(10):
            record = await record_of(http, first.headers["x-request-id"], ADMIN)
            refused = await record_of(http, second.headers["x-request-id"], ADMIN)
        assert (record["endpoint"], record["key"], record["status"]) == (path, "key_one", 200)
        assert (refused["endpoint"], refused["status"], refused["error"]) == (path, 429, "rate_limited")
        if usage:  # the engine's usage, read from its answer (streamed: its final chunk) before any translation
            assert record["tokens_in"] and record["tokens_in"] > 0, record
        else:  # tokenize and detokenize have no usage: unknown, never 0
            assert record["tokens_in"] is None and record["tokens_out"] is None, record
        batch = gw.log.rollups.batch()
        assert batch is not None
        [row] = [r for r in batch["rows"] if r["key"] == "key_one"]  # the refused one was never the key's
        assert row["requests"] == 1 and (row["tokens_in"] > 0) is usage, row
        assert sum(r["refusals"] for r in batch["rows"]) == 1
        metrics = (await http.get("/metrics")).text
        assert f'llmgw_gateway_endpoint_requests_total{{endpoint="{path}"}} 2.0' in metrics
