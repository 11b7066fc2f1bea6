"""`/v1/tokenize` and `/v1/detokenize` through the gateway to the real llama.cpp engine (xllamacpp) on the tiny
GGUF the suite writes (issue 23, point 3): the gateway's body mapped to llama.cpp's `/tokenize` `{content,
add_special}` and `/detokenize` and back, a round trip; an id outside the vocabulary a 400 that no circuit breaker
counts; what llama.cpp cannot do refused by name."""

from __future__ import annotations

import importlib.util
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
from llmgw.net import free_port
from llmgw.testing import MemoryStore
from tests.integration.test_llamacpp_tiny import Engine, engines, spec, tiny  # noqa: F401 (a fixture)
from tests.integration.test_llamacpp_tiny import serve as serve_engine
from tests.support.tiny_gguf import N_VOCAB

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the llamacpp extra is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package (test extra) is missing"),
]

KEY = "sk-llama-tokens"


async def test_tokenize_and_detokenize_round_trip_through_the_gateway_to_llama_cpp(
        tmp_path: Path, engines: list[Engine], nursery: trio.Nursery) -> None:  # noqa: F811
    port = free_port("127.0.0.1")
    url = serve_engine(engines, spec(tiny(tmp_path), port, args=("--ctx-size", "256")), port, tmp_path / "tok.log")
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc(
        {"name": "tiny", "engine": "llama.cpp", "source": str(tmp_path / "llama.gguf")}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    router.update_routes({"tiny": ModelRoute("tiny", "chat", "ready", (Endpoint("tiny-r1", url),))})
    host, gw_port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{gw_port}", headers={"authorization": f"Bearer {KEY}"},
                                 timeout=30) as http:
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
