"""One request log record's timings and outcome, exact (issue 9, point 8): a stream whose engine sends its first
chunk after 2 s and ends after 5 s is logged with time to first token 2,000 ms and latency 5,000 ms; a refusal
with its status and error code and no time to first token. Through the whole gateway with a state dir, read back
through the gateway's own query route (what control's fan-out asks). pytest-trio's autojump MockClock."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.wire import logquery
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine
from llmgw.testing.scripted_engine import serving as scripted
from tests.support.requestlog import record_of

KEY, ADMIN, VIEWER = "sk-record-client", "sk-record-admin", "sk-record-viewer"
FIRST_S, LAST_S = 2.0, 5.0
USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def frame(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


async def paced(request: Request, reply: Reply) -> None:
    await reply.start()
    await trio.sleep(FIRST_S)
    await reply.chunk(frame({"choices": [{"index": 0, "delta": {"content": "one"}}]}))
    await trio.sleep(LAST_S - FIRST_S)
    await reply.chunk(frame({"choices": [{"index": 0, "delta": {"content": "two"}}]}))
    await reply.chunk(frame({"choices": [], "usage": USAGE}))
    await reply.chunk(b"data: [DONE]\n\n")
    await reply.end()


async def test_a_streams_record_has_its_time_to_first_token_and_a_refusals_its_code(
        tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": "demo", "engine": "sim",
                                                               "source": "sim://demo"}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "client", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "ops", "admin", 0.0))
    store.submit_nowait(commands.add_key(hash_key(VIEWER), "watch", "viewer", 0.0))
    router = Router()
    router.update_routes({"demo": ModelRoute("demo", "chat", "ready",
                                             (Endpoint("demo-r1", await scripted(nursery, ScriptedEngine(paced))),))})
    log = RequestLog(tmp_path / "requests", "gw-rec")
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                requestlog=log)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=None) as http:
        auth = {"authorization": f"Bearer {KEY}"}
        body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=auth) as response:
            assert response.status_code == 200
            await response.aread()
        streamed = response.headers["x-request-id"]
        refused = await http.post("/v1/chat/completions", headers=auth,
                                  json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
        assert refused.status_code == 404

        record = await record_of(http, streamed, ADMIN)
        assert (record["status"], record["error"], record["model"], record["replica"]) == (200, "", "demo", "demo-r1")
        assert record["ttft_ms"] == pytest.approx(FIRST_S * 1000, abs=50)
        assert record["latency_ms"] == pytest.approx(LAST_S * 1000, abs=50)
        assert (record["tokens_in"], record["tokens_out"]) == (7, 2)  # from the engine's final chunk
        assert record["key"] and record["guard_rule"] == ""

        no = await record_of(http, refused.headers["x-request-id"], ADMIN)
        assert (no["status"], no["error"], no["model"], no["ttft_ms"]) == (404, "model_not_found", "", None)

        # The log is read with an admin or a viewer key (the console's viewers), never a client key.
        one = f"{logquery.PATH}/{streamed}"
        assert (await http.get(one, headers={"authorization": f"Bearer {VIEWER}"})).status_code == 200
        assert (await http.get(one, headers=auth)).status_code == 401
