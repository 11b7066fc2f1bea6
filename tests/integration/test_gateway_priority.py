"""Priority classes through the whole gateway (issue 22, point 2): a model whose replica has one slot
(`limits.concurrency_per_replica = 1`), an engine that takes 1 s per answer; a bulk key floods it, an
interactive key and a default key each send one: they are served before the flood's waiters. A header asking
above the key's class is refused before anything is sent; a class past its bound is refused naming the class;
the request log has each request's class and queue time; /metrics has the queue by class.
pytest-trio's autojump MockClock: the times are exact."""

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
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine
from llmgw.testing.scripted_engine import serving as scripted
from tests.support.requestlog import record_of

BULK, INTERACTIVE, PLAIN, ADMIN = "sk-prio-bulk", "sk-prio-interactive", "sk-prio-default", "sk-prio-admin"
SERVICE_S = 1.0


async def one_second(request: Request, reply: Reply) -> None:
    await trio.sleep(SERVICE_S)
    await reply.whole(200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                                       "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                 "total_tokens": 2}}).encode())


def label(request: Request) -> str:
    return str(json.loads(request.body)["messages"][0]["content"])


async def test_classes_first_then_keys_by_turns_refusals_say_which_limit_and_the_log_has_class_and_wait(
        tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({
        "name": "one", "engine": "sim", "source": "sim://one", "limits": {"concurrency_per_replica": 1}}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(BULK), "batch", "client", 0.0, priority="bulk"))
    store.submit_nowait(commands.add_key(hash_key(INTERACTIVE), "chat ui", "client", 0.0, priority="interactive"))
    store.submit_nowait(commands.add_key(hash_key(PLAIN), "other", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "ops", "admin", 0.0))
    engine = ScriptedEngine(one_second)
    router = Router()
    router.update_routes({"one": ModelRoute("one", "chat", "ready",
                                            (Endpoint("one-r1", await scripted(nursery, engine)),))})
    log = RequestLog(tmp_path / "requests", "gw-prio")
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                requestlog=log)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=None) as http:
        answers: dict[str, httpx.Response] = {}

        async def ask(key: str, text: str, priority: str | None = None) -> None:
            headers = {"authorization": f"Bearer {key}"}
            if priority is not None:
                headers["x-llmgw-priority"] = priority
            answers[text] = await http.post("/v1/chat/completions", headers=headers, json={
                "model": "one", "messages": [{"role": "user", "content": text}]})

        # Asking above the key's class (or for no class at all) is refused before anything is sent.
        await ask(BULK, "too high", "interactive")
        await ask(INTERACTIVE, "unknown", "urgent")
        assert answers["too high"].status_code == 403, answers["too high"].text
        error = answers["too high"].json()["error"]
        assert error["code"] == "priority_not_allowed" and "'bulk'" in error["message"]
        assert answers["unknown"].status_code == 400 and answers["unknown"].json()["error"]["code"] == "invalid_priority"
        assert engine.requests == []

        async with trio.open_nursery() as clients:
            for i in range(5):  # the flood: one in the slot, four waiting
                clients.start_soon(ask, BULK, f"bulk{i}")
                await trio.sleep(0.01)
            clients.start_soon(ask, PLAIN, "default")
            await trio.sleep(0.01)
            clients.start_soon(ask, INTERACTIVE, "interactive")
            await trio.sleep(0.01)
            clients.start_soon(ask, INTERACTIVE, "lowered", "bulk")  # the header lowers its own class
            await trio.sleep(0.01)
            metrics = (await http.get("/metrics")).text
            assert 'llmgw_gateway_queue_waiting{class="bulk"} 5.0' in metrics
            assert 'llmgw_gateway_queue_waiting{class="interactive"} 1.0' in metrics
        assert [label(r) for r in engine.requests] == ["bulk0", "interactive", "default", "bulk1", "lowered",
                                                        "bulk2", "bulk3", "bulk4"]
        assert all(a.status_code == 200 for a in answers.values() if a.request.headers.get("x-llmgw-priority") in
                   (None, "bulk"))

        first = await record_of(http, answers["bulk0"].headers["x-request-id"], ADMIN)
        assert (first["priority"], first["queue_ms"]) == ("bulk", 0.0)
        served = await record_of(http, answers["interactive"].headers["x-request-id"], ADMIN)
        assert served["priority"] == "interactive"
        assert served["queue_ms"] == pytest.approx(1000 * SERVICE_S - 70, abs=20)  # until bulk0 ended
        lowered = await record_of(http, answers["lowered"].headers["x-request-id"], ADMIN)
        assert lowered["priority"] == "bulk" and lowered["queue_ms"] == pytest.approx(4000 - 80, abs=20)
        refused = await record_of(http, answers["too high"].headers["x-request-id"], ADMIN)
        assert (refused["error"], refused["queue_ms"]) == ("priority_not_allowed", None)
        metrics = (await http.get("/metrics")).text
        assert 'llmgw_gateway_queue_wait_seconds_count{class="interactive"} 1.0' in metrics
        assert 'llmgw_gateway_queue_wait_seconds_count{class="bulk"} 6.0' in metrics

        # A class past its own bound is refused at once, naming the class; the others still wait.
        store.submit_nowait(commands.put_setting("gateway.queue_per_class", {"bulk": 1}, 1.0))
        async with trio.open_nursery() as clients:
            clients.start_soon(ask, BULK, "holds")
            await trio.sleep(0.01)
            clients.start_soon(ask, BULK, "waits")
            await trio.sleep(0.01)
            clients.start_soon(ask, PLAIN, "also waits")
            await trio.sleep(0.01)
            await ask(BULK, "refused")
        assert answers["refused"].status_code == 503
        error = answers["refused"].json()["error"]
        assert error["code"] == "overloaded" and "priority class bulk" in error["message"]
        assert "1 requests of class bulk waiting" in error["message"]
        assert [answers[t].status_code for t in ("holds", "waits", "also waits")] == [200, 200, 200]
