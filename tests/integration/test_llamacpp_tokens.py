"""`/v1/rerank`, `/v1/tokenize` and `/v1/detokenize` through the gateway to the real llama.cpp engine (xllamacpp)
on the tiny GGUFs the suite writes (issue 23, point 3): the gateway's body mapped to llama.cpp's `/tokenize`
`{content, add_special}` and `/detokenize` and back, a round trip; an id outside the vocabulary a 400 that no
circuit breaker counts; what llama.cpp cannot do refused by name; a tiny BERT cross-encoder started with role
rerank (`--reranking`: rank pooling) reranking in the gateway's shape."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from tests.support.processes import free_port
from llmgw.testing import MemoryStore
from tests.integration.test_llamacpp_tiny import Engine, engines, spec, tiny  # noqa: F401 (a fixture)
from tests.integration.test_llamacpp_tiny import serve as serve_engine
from tests.support.tiny_gguf import N_VOCAB, write_tiny_reranker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the llamacpp extra is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package (test extra) is missing"),
]

KEY = "sk-llama-tokens"


@asynccontextmanager
async def gateway(nursery: trio.Nursery, name: str, role: str, weights: str, url: str,
                  router: Router) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in front of one llama.cpp replica serving `weights` as `name`."""
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc(
        {"name": name, "engine": "llama.cpp", "source": weights, "role": role}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router.update_routes({name: ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", url),))})
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"},
                                 timeout=30) as http:
        yield http


async def test_tokenize_and_detokenize_round_trip_through_the_gateway_to_llama_cpp(
        tmp_path: Path, engines: list[Engine], nursery: trio.Nursery) -> None:  # noqa: F811
    port = free_port("127.0.0.1")
    weights = tiny(tmp_path)
    url = serve_engine(engines, spec(weights, port, args=("--ctx-size", "256")), port, tmp_path / "tok.log")
    router = Router()
    async with gateway(nursery, "tiny", "chat", weights, url, router) as http:
        text = "hello tiny world"
        answer = (await http.post("/v1/tokenize", json={"model": "tiny", "prompt": text})).json()
        assert set(answer) == {"tokens", "count"} and answer["count"] == len(answer["tokens"]) > 3
        assert answer["tokens"][0] == 1  # the tiny vocabulary's <s>: special tokens added unless asked not to
        plain = (await http.post("/v1/tokenize", json={"model": "tiny", "prompt": text,
                                                       "add_special_tokens": False})).json()
        assert plain["tokens"] == answer["tokens"][1:] and all(0 <= t < N_VOCAB for t in plain["tokens"])
        back = await http.post("/v1/detokenize", json={"model": "tiny", "tokens": plain["tokens"]})
        assert back.status_code == 200 and back.json()["prompt"].strip() == text

        for _ in range(6):  # more than the breaker's failures in a row: none is counted
            outside = await http.post("/v1/detokenize", json={"model": "tiny", "tokens": [N_VOCAB + 7]})
            error = outside.json()["error"]
            assert (outside.status_code, error["code"], error["param"]) == (400, "invalid_value", "tokens"), error
            assert str(N_VOCAB + 7) in error["message"] and f"0 to {N_VOCAB - 1}" in error["message"]
        assert router.breaker_report() == {}

        chat = await http.post("/v1/tokenize", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        assert (chat.status_code, chat.json()["error"]["code"]) == (400, "unsupported_parameter")
        rerank = await http.post("/v1/rerank", json={"model": "tiny", "query": "q", "documents": ["d"]})
        assert (rerank.status_code, rerank.json()["error"]["code"]) == (400, "unsupported_endpoint")


async def test_a_tiny_cross_encoder_reranks_through_the_gateway(tmp_path: Path, engines: list[Engine],  # noqa: F811
                                                                 nursery: trio.Nursery) -> None:
    port = free_port("127.0.0.1")
    weights = str(write_tiny_reranker(tmp_path / "reranker.gguf"))
    url = serve_engine(engines, spec(weights, port, role="rerank", args=("--ctx-size", "512")), port,
                       tmp_path / "rerank.log")
    async with gateway(nursery, "tiny", "rerank", weights, url, Router()) as http:
        documents = ["the world", {"text": "a cluster node"}, "hello", "time to go"]
        response = await http.post("/v1/rerank", json={"model": "tiny", "query": "hello world",
                                                       "documents": documents, "return_documents": True})
        assert response.status_code == 200, response.text
        answer = response.json()
        results = answer["results"]
        assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) > 1  # random weights: some spread
        texts = [d if isinstance(d, str) else d["text"] for d in documents]
        assert all(r["document"] == {"text": texts[r["index"]]} for r in results)
        assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
        top = (await http.post("/v1/rerank", json={"model": "tiny", "query": "hello world", "documents": documents,
                                                   "top_n": 1})).json()
        assert top["results"] == [{k: v for k, v in results[0].items() if k != "document"}]
        tokens = (await http.post("/v1/tokenize", json={"model": "tiny", "prompt": "hello world"})).json()["tokens"]
        assert tokens[0] == 2 and tokens[-1] == 3  # its [CLS] and [SEP]
        chat = await http.post("/v1/chat/completions", json={"model": "tiny", "messages": [
            {"role": "user", "content": "hi"}]})
        assert (chat.status_code, chat.json()["error"]["code"]) == (400, "model_not_supported")
