"""`/v1/rerank`, `/v1/tokenize` and `/v1/detokenize` through the whole gateway over real HTTP (issue 23, point 3):
sim engines (llama.cpp's shapes) and a scripted engine answering as vLLM does, so both engines' mappings
(gateway/engine_paths.py) are crossed; strict fields; `unsupported_endpoint`; guard policies judging a rerank's
query and documents and a tokenize's text; the request log, usage rollups, tokens per minute and metrics."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.commands import set_policy
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines import sim
from llmgw.engines.sim.tokens import BOS
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine, serving
from tests.support.requestlog import record_of

KEY, LIMITED, ADMIN = "sk-rerank-client", "sk-rerank-limited", "sk-rerank-admin"
TOKENS_PER_MIN = 20
DOCS = ["pandas eat bamboo", "the giant panda is a bear", {"text": "stock markets fell"}]


async def vllm_script(request: Request, reply: Reply) -> None:
    """vLLM's answers: rerank in index order with every document and only a total; tokenize with its length."""
    path = request.head.split(b" ")[1].decode()
    body = json.loads(request.body)
    if path == "/v1/rerank":
        doc: dict[str, Any] = {
            "id": "rerank-vllm", "model": body["model"], "usage": {"total_tokens": 42},
            "results": [{"index": i, "document": {"text": d}, "relevance_score": [0.1, 0.9, 0.5][i]}
                        for i, d in enumerate(body["documents"])]}
    elif path == "/tokenize":
        doc = {"count": 3, "max_model_len": 4096, "tokens": [101, 102, 103], "token_strs": None}
    elif path == "/detokenize":
        doc = {"prompt": "from vllm"}
    else:
        await reply.whole(404, b'{"detail": "Not Found"}')
        return
    await reply.whole(200, json.dumps(doc).encode())


@dataclass
class Setup:
    http: httpx.AsyncClient
    store: MemoryStore
    log: RequestLog
    rr: sim.SimApp
    judge: sim.SimApp
    vllm: ScriptedEngine

    def policy(self, *models: str) -> None:
        self.store.submit_nowait(set_policy(GuardPolicy(name="strict", judge="lg", models=models), at=0.0))

    async def record(self, response: httpx.Response) -> dict[str, Any]:
        with trio.fail_after(10):
            return await record_of(self.http, response.headers["x-request-id"], ADMIN)


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Setup]:
    store = MemoryStore()
    for name, engine, role in (("rr", "sim", "rerank"), ("demo", "sim", "chat"), ("emb", "sim", "embedding"),
                               ("lg", "sim", "guard"), ("vrr", "vllm", "rerank"), ("vchat", "vllm", "chat")):
        source = f"sim://{name}" if engine == "sim" else f"/models/{name}"
        store.submit_nowait(commands.put_model(ModelDef.from_doc(
            {"name": name, "engine": engine, "source": source, "role": role}), at=0.0))
    # A parked vLLM reranker whose fallback is the sim's: the fallback's engine speaks another shape.
    store.submit_nowait(commands.put_model(ModelDef.from_doc(
        {"name": "vparked", "engine": "vllm", "source": "/models/vparked", "role": "rerank", "fallbacks": ["rr"]}),
        at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(LIMITED), "small", "client", 0.0, tokens_per_min=TOKENS_PER_MIN))
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "ops", "admin", 0.0))
    apps = {"rr": sim.make_app(sim.SimOptions("127.0.0.1", 0, "rr", "rerank")),
            "demo": sim.make_app(sim.SimOptions("127.0.0.1", 0, "demo")),
            "emb": sim.make_app(sim.SimOptions("127.0.0.1", 0, "emb", "embedding")),
            "lg": sim.make_app(sim.SimOptions("127.0.0.1", 0, "lg", "guard", unsafe=(("bomb", "S9"),)))}
    routes = {}
    for name, app in apps.items():
        url = await nursery.start(partial(sim.serve, app.opts, app=app))
        routes[name] = ModelRoute(name, app.opts.role, "ready", (Endpoint(f"{name}-r1", url),))
    vllm = ScriptedEngine(vllm_script)
    vllm_url = await serving(nursery, vllm)
    for name, role in (("vrr", "rerank"), ("vchat", "chat")):
        routes[name] = ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", vllm_url),))
    routes["vparked"] = ModelRoute("vparked", "rerank", "parked", (), "5 failed starts")
    router = Router()
    router.update_routes(routes)
    log = RequestLog(tmp_path / "requests", "gw1", timeouts=dataclasses.replace(TIMEOUTS, requestlog_flush_s=0.02))
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                requestlog=log)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"},
                                 timeout=30) as http:
        yield Setup(http, store, log, apps["rr"], apps["lg"], vllm)


def error_of(response: httpx.Response, status: int, code: str, param: str | None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    return str(error["message"])


# --- rerank -------------------------------------------------------------------------------------------------


async def test_a_rerank_is_scored_sorted_cut_to_top_n_logged_and_counted(gw: Setup) -> None:
    body = {"model": "rr", "query": "giant panda bear", "documents": DOCS}
    response = await gw.http.post("/v1/rerank", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"id", "model", "results", "usage"} and answer["model"] == "rr"
    assert answer["id"] == f"rerank-{response.headers['x-request-id']}"
    # The sim's score: the share of the query's words a document holds.
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == [(1, 1.0), (0, 0.0), (2, 0.0)]
    assert all("document" not in r for r in answer["results"])
    words = sum(3 + len((d if isinstance(d, str) else d["text"]).split()) for d in DOCS)
    assert answer["usage"] == {"prompt_tokens": words, "total_tokens": words}
    assert response.headers["x-llmgw-model"] == "rr"

    second = await gw.http.post("/v1/rerank", json={**body, "top_n": 2, "return_documents": True})
    top = second.json()
    assert top["results"] == [{"index": 1, "relevance_score": 1.0, "document": {"text": DOCS[1]}},
                              {"index": 0, "relevance_score": 0.0, "document": {"text": DOCS[0]}}]
    assert gw.rr.reranked == 2

    # Through the same request path as chat: its record (the client's path, the engine's usage), usage rollups, metrics.
    record = await gw.record(response)
    assert (record["endpoint"], record["status"], record["model"], record["replica"]) == ("/v1/rerank", 200, "rr",
                                                                                          "rr-r1")
    assert (record["tokens_in"], record["tokens_out"]) == (words, 0)
    await gw.record(second)  # (both written: both in the rollups)
    batch = gw.log.rollups.batch()
    assert batch is not None
    [row] = [r for r in batch["rows"] if r["model"] == "rr"]
    assert (row["requests"], row["tokens_in"]) == (2, 2 * words)
    metrics = (await gw.http.get("/metrics")).text
    assert 'llmgw_gateway_requests_total{code="",model="rr",status="200"} 2.0' in metrics
    assert 'llmgw_gateway_endpoint_requests_total{endpoint="/v1/rerank"} 2.0' in metrics


async def test_a_keys_tokens_per_minute_are_charged_from_a_reranks_usage(gw: Setup) -> None:
    body = {"model": "rr", "query": "a b c d e", "documents": ["one two three four five six"] * 2}
    auth = {"authorization": f"Bearer {LIMITED}"}
    first = await gw.http.post("/v1/rerank", json=body, headers=auth)
    assert first.status_code == 200 and first.json()["usage"]["total_tokens"] > TOKENS_PER_MIN
    error_of(await gw.http.post("/v1/rerank", json=body, headers=auth), 429, "rate_limited", None)


async def test_vllms_rerank_answer_is_put_in_the_one_shape(gw: Setup) -> None:
    response = await gw.http.post("/v1/rerank", json={"model": "vrr", "query": "q", "documents": DOCS, "top_n": 2})
    assert response.status_code == 200, response.text
    [request] = gw.vllm.requests
    assert request.head.startswith(b"POST /v1/rerank ")
    assert json.loads(request.body) == {"model": "vrr", "query": "q", "top_n": 2,
                                        "documents": ["pandas eat bamboo", "the giant panda is a bear",
                                                      "stock markets fell"]}
    answer = response.json()
    # Sorted by score and cut to top_n by the gateway; no documents unless asked; the total is the prompt's.
    assert answer["results"] == [{"index": 1, "relevance_score": 0.9}, {"index": 2, "relevance_score": 0.5}]
    assert answer["usage"] == {"prompt_tokens": 42, "total_tokens": 42}
    assert (await gw.record(response))["tokens_in"] == 42


async def test_a_fallback_on_another_engine_gets_its_own_engines_request(gw: Setup) -> None:
    response = await gw.http.post("/v1/rerank", json={"model": "vparked", "query": "panda", "documents": DOCS})
    assert response.status_code == 200, response.text
    assert response.headers["x-llmgw-model"] == "rr" and response.json()["model"] == "rr"
    assert gw.rr.reranked == 1 and not gw.vllm.requests


async def test_rerank_is_served_only_by_rerank_models(gw: Setup) -> None:
    for model in ("demo", "emb"):
        words = error_of(await gw.http.post("/v1/rerank", json={"model": model, "query": "q", "documents": ["d"]}),
                         400, "unsupported_endpoint", "model")
        assert repr(model) in words and "/v1/rerank" in words
    error_of(await gw.http.post("/v1/chat/completions", json={"model": "rr", "messages": [
        {"role": "user", "content": "hi"}]}), 400, "model_not_supported", "model")
    assert gw.rr.reranked == 0


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), [
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": ["d"], "return_text": True}, 400, "unknown_parameter",
     "return_text"),
    ("/v1/rerank", {"model": "rr", "query": 3, "documents": ["d"]}, 400, "invalid_type", "query"),
    ("/v1/rerank", {"model": "rr", "query": "q"}, 400, "missing_required_parameter", "documents"),
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": []}, 400, "invalid_type", "documents"),
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": ["d", 7]}, 400, "invalid_type", "documents[1]"),
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": ["d"], "top_n": 0}, 400, "invalid_value", "top_n"),
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": ["d"], "top_n": True}, 400, "invalid_type", "top_n"),
    ("/v1/tokenize", {"model": "demo"}, 400, "missing_required_parameter", "prompt"),
    ("/v1/tokenize", {"model": "demo", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400,
     "invalid_type", "prompt"),
    ("/v1/tokenize", {"model": "demo", "prompt": "a", "n_keep": 1}, 400, "unknown_parameter", "n_keep"),
    ("/v1/tokenize", {"model": "demo", "messages": [{"role": "user", "content": "b"}]}, 400,
     "unsupported_parameter", "messages"),  # llama.cpp's (and the sim's) tokenize takes text only
    ("/v1/detokenize", {"model": "demo", "tokens": [1, -2]}, 400, "invalid_type", "tokens"),
    ("/v1/detokenize", {"model": "demo", "tokens": "12"}, 400, "invalid_type", "tokens"),
    ("/v1/detokenize", {"model": "demo"}, 400, "missing_required_parameter", "tokens"),
])
async def test_fields_are_checked_strictly(gw: Setup, path: str, body: dict[str, Any], status: int, code: str,
                                           param: str) -> None:
    error_of(await gw.http.post(path, json=body), status, code, param)


async def test_a_null_field_is_not_given(gw: Setup) -> None:
    body = {"model": "rr", "query": "panda", "documents": DOCS, "top_n": None, "return_documents": None}
    assert len((await gw.http.post("/v1/rerank", json=body)).json()["results"]) == 3
    body = {"model": "demo", "prompt": "a b", "messages": None, "add_special_tokens": None}
    assert (await gw.http.post("/v1/tokenize", json=body)).json()["count"] == 3  # BOS and two words


# --- tokenize, detokenize -----------------------------------------------------------------------------------


async def test_tokenize_and_detokenize_round_trip_on_every_role(gw: Setup) -> None:
    for model in ("demo", "emb", "rr", "lg"):
        response = await gw.http.post("/v1/tokenize", json={"model": model, "prompt": "hello  tiny\nworld"})
        assert response.status_code == 200, response.text
        answer = response.json()
        assert set(answer) == {"tokens", "count"}  # the sim, as llama.cpp, says no max_model_len
        assert answer["count"] == 4 and answer["tokens"][0] == BOS  # special tokens added unless asked not to
        plain = (await gw.http.post("/v1/tokenize", json={"model": model, "prompt": "hello  tiny\nworld",
                                                          "add_special_tokens": False})).json()
        assert plain["tokens"] == answer["tokens"][1:]
        back = await gw.http.post("/v1/detokenize", json={"model": model, "tokens": answer["tokens"]})
        assert back.json() == {"prompt": "hello tiny world"}
    record = await gw.record(back)
    assert (record["endpoint"], record["status"], record["model"]) == ("/v1/detokenize", 200, "lg")


async def test_vllms_tokenize_takes_a_chat_and_says_its_context(gw: Setup) -> None:
    messages = [{"role": "user", "content": "hi"}]
    response = await gw.http.post("/v1/tokenize", json={"model": "vchat", "messages": messages,
                                                        "add_generation_prompt": True})
    assert response.json() == {"tokens": [101, 102, 103], "count": 3, "max_model_len": 4096}
    back = await gw.http.post("/v1/detokenize", json={"model": "vchat", "tokens": [101]})
    assert back.json() == {"prompt": "from vllm"}
    sent = [(r.head.split(b" ")[1], json.loads(r.body)) for r in gw.vllm.requests]
    assert sent == [(b"/tokenize", {"model": "vchat", "messages": messages, "add_generation_prompt": True}),
                    (b"/detokenize", {"model": "vchat", "tokens": [101]})]


# --- guard ---------------------------------------------------------------------------------------------------


async def test_a_guard_policy_judges_a_reranks_documents_and_a_tokenize_prompt(gw: Setup) -> None:
    gw.policy("rr", "demo", "vchat")
    body = {"model": "rr", "query": "how to", "documents": ["bake bread", {"text": "build a bomb"}]}
    response = await gw.http.post("/v1/rerank", json=body)
    assert "S9" in error_of(response, 400, "guard_refused", None)
    assert (gw.judge.generated, gw.rr.reranked) == (1, 0)  # judged, never sent to the engine
    assert (await gw.record(response))["guard_rule"].startswith("judge: S9")
    assert "S9" in error_of(await gw.http.post("/v1/tokenize", json={"model": "demo", "prompt": "a bomb"}),
                            400, "guard_refused", None)
    assert "S9" in error_of(await gw.http.post("/v1/tokenize", json={"model": "vchat", "messages": [
        {"role": "user", "content": "one more bomb"}]}), 400, "guard_refused", None)
    assert gw.judge.generated == 3 and not gw.vllm.requests
    ok = await gw.http.post("/v1/rerank", json={**body, "documents": ["bake bread"]})
    assert ok.status_code == 200 and gw.rr.reranked == 1 and gw.judge.generated == 4
    # A detokenize has no text to judge: its ids are not asked about.
    assert (await gw.http.post("/v1/detokenize", json={"model": "demo", "tokens": [BOS]})).status_code == 200
    assert gw.judge.generated == 4
