"""`/v1/responses` and `/v1/messages` through the gateway to the real llama.cpp engine (xllamacpp) on the tiny
GGUF the suite writes (issue 23, points 1, 2 and 6): llama.cpp's own chat answers (whole and streamed, with
its extra fields and its own chunking) translated into answers that OpenAI's published schemas and
Anthropic's SDK types accept, event by event."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.gateway.router import Router
from tests.support.processes import free_port
from tests.integration.test_llamacpp_tiny import Engine, engines, spec, tiny  # noqa: F401 (a fixture)
from tests.integration.test_llamacpp_tiny import serve as serve_engine
from tests.integration.test_llamacpp_tokens import gateway
from tests.support.openai_spec import errors

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the llamacpp extra is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package (test extra) is missing"),
]


async def events(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The named server-sent events of a streamed answer, parsed."""
    found = []
    async with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                found.append((name, json.loads(line[5:])))
    return found


async def test_responses_and_messages_from_llama_cpp_match_their_schemas_whole_and_streamed(
        tmp_path: Path, engines: list[Engine], nursery: trio.Nursery) -> None:  # noqa: F811
    from anthropic.types import Message, RawMessageStreamEvent
    from pydantic import TypeAdapter

    port = free_port("127.0.0.1")
    weights = tiny(tmp_path)
    url = serve_engine(engines, spec(weights, port, args=("--ctx-size", "256")), port, tmp_path / "llama.log")
    async with gateway(nursery, "tiny", "chat", weights, url, Router()) as http:
        ask = {"model": "tiny", "input": "hello there", "instructions": "be brief", "max_output_tokens": 8}
        whole = await http.post("/v1/responses", json=ask)
        assert whole.status_code == 200, whole.text
        doc = whole.json()
        assert errors("Response", doc) == [] and doc["object"] == "response"
        assert doc["usage"]["input_tokens"] > 0 and doc["usage"]["output_tokens"] > 0
        streamed = await events(http, "/v1/responses", {**ask, "stream": True})
        assert [errors("ResponseStreamEvent", e) for _, e in streamed] == [[]] * len(streamed)
        assert [e["sequence_number"] for _, e in streamed] == list(range(len(streamed)))
        assert streamed[0][1]["type"] == "response.created"
        assert streamed[-1][1]["type"] in ("response.completed", "response.incomplete")
        text = "".join(e["delta"] for _, e in streamed if e["type"] == "response.output_text.delta")
        assert text == streamed[-1][1]["response"]["output"][0]["content"][0]["text"]

        ask = {"model": "tiny", "max_tokens": 8, "system": "be brief",
               "messages": [{"role": "user", "content": "hello there"}]}
        whole = await http.post("/v1/messages", json=ask, headers={"anthropic-version": "2023-06-01"})
        assert whole.status_code == 200, whole.text
        message = Message.model_validate(whole.json(), strict=True)
        assert message.usage.input_tokens > 0 and message.stop_reason in ("end_turn", "max_tokens")
        streamed = await events(http, "/v1/messages", {**ask, "stream": True})
        adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
        kinds = [adapter.validate_python(e).type for name, e in streamed if name != "ping"]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
        assert all(name == e["type"] for name, e in streamed)
