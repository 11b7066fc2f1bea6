"""OpenAI's Responses API (`/v1/responses`, issue 23 point 1) through the whole gateway over real HTTP, in front of
sim engines (and a scripted one where the test says what the engine answers), driven with the official `openai`
SDK's `client.responses`; answers and events checked against the pinned part of OpenAI's OpenAPI document."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
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
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine, serving
from tests.support import openai_spec
from tests.support.requestlog import record_of

KEY = "sk-responses-client"
LIMITED = "sk-responses-limited"  # 60 tokens a minute
ADMIN_KEY = "sk-responses-admin"

# The SDK's AsyncStream leaves its inner generators to the collector at the stream's end (see test_gateway_app).
sdk_stream_warnings = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' was garbage collected:ResourceWarning"
)


@dataclass
class Setup:
    url: str
    http: httpx.AsyncClient
    store: MemoryStore
    router: Router
    sdk_http: openai.DefaultAsyncHttpxClient
    demo: sim.SimApp

    def sdk(self, key: str = KEY) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, http_client=self.sdk_http, max_retries=0)

    def policy(self, check: str) -> None:
        self.store.submit_nowait(set_policy(GuardPolicy(name="strict", judge="lg", models=("demo",), check=check),
                                            at=0.0))

    async def scripted(self, nursery: trio.Nursery, answer: dict[str, Any] | list[bytes] | None) -> ScriptedEngine:
        """`scripted` serves model `demo`: a whole answer, or stream frames (then the connection drops)."""
        async def script(request: Request, reply: Reply) -> None:
            if isinstance(answer, dict):
                await reply.whole(200, json.dumps(answer).encode())
                return
            await reply.start()
            for frame in answer or ():
                await reply.chunk(frame)

        engine = ScriptedEngine(script)
        url = await serving(nursery, engine)
        self.router.update_routes({**self.routes, "demo": ModelRoute("demo", "chat", "ready",
                                                                     (Endpoint("scripted-r1", url),))})
        return engine

    routes: dict[str, ModelRoute] = dataclasses.field(default_factory=dict)


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Setup]:
    store = MemoryStore()
    for doc in ({"name": "demo"}, {"name": "lg", "role": "guard"}, {"name": "capped", "limits": {"max_tokens": 32}}):
        name = doc["name"]
        store.submit_nowait(commands.put_model(ModelDef.from_doc({"engine": "sim", "source": f"sim://{name}", **doc}),
                                               at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(LIMITED), "limited", "client", 0.0, tokens_per_min=60))
    store.submit_nowait(commands.add_key(hash_key(ADMIN_KEY), "ops", "admin", 0.0))
    apps = {"demo": sim.make_app(sim.SimOptions("127.0.0.1", 0, "demo")),
            "capped": sim.make_app(sim.SimOptions("127.0.0.1", 0, "capped")),
            "lg": sim.make_app(sim.SimOptions("127.0.0.1", 0, "lg", "guard", unsafe=(("bomb", "S9"),)))}
    routes = {}
    for name, app in apps.items():
        url = await nursery.start(partial(sim.serve, app.opts, app=app))
        routes[name] = ModelRoute(name, app.opts.role, "ready", (Endpoint(f"{name}-r1", url),))
    router = Router()
    router.update_routes(routes)
    log = RequestLog(tmp_path / "requests", "gw1", timeouts=dataclasses.replace(TIMEOUTS, requestlog_flush_s=0.02))
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                 requestlog=log)))
    url = f"http://{host}:{port}"
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=None) as http, \
            openai.DefaultAsyncHttpxClient() as sdk_http:
        yield Setup(url, http, store, router, sdk_http, apps["demo"], routes)


def events_of(text: str) -> list[dict[str, Any]]:
    """A Responses stream's events, each checked: its `event:` name is its type, it fits the spec's schema."""
    found = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        doc = json.loads(lines["data"])
        assert lines["event"] == doc["type"]
        assert openai_spec.errors("ResponseStreamEvent", doc) == [], doc
        found.append(doc)
    assert [e["sequence_number"] for e in found] == list(range(len(found)))
    return found


# --- answers ----------------------------------------------------------------------------------------------------


async def test_the_sdk_gets_a_response_whose_text_is_the_engines_answer(gw: Setup) -> None:
    reply = await gw.sdk().responses.create(model="demo", input="hello there", instructions="be brief",
                                            metadata={"run": "7"}, temperature=0.5, store=False)
    assert (reply.output_text, reply.status, reply.model, reply.metadata) == ("sim says: hello there", "completed",
                                                                              "demo", {"run": "7"})
    assert (reply.instructions, reply.temperature, reply.id[:5], reply.output[0].id[:4]) == ("be brief", 0.5,
                                                                                              "resp_", "msg_")
    assert reply.usage is not None
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.total_tokens) == (4, 4, 8)
    raw = await gw.http.post("/v1/responses", json={"model": "demo", "input": [
        {"role": "developer", "content": "terse"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
    assert raw.status_code == 200 and openai_spec.errors("Response", raw.json()) == [], raw.text
    record = await record_of(gw.http, raw.headers["x-request-id"], ADMIN_KEY)
    assert (record["endpoint"], record["status"], record["tokens_in"], record["tokens_out"]) == ("/v1/responses",
                                                                                               200, 2, 3)
    metrics = (await gw.http.get("/metrics")).text
    assert 'llmgw_gateway_endpoint_requests_total{endpoint="/v1/responses"} 2.0' in metrics


async def test_an_answer_cut_at_max_output_tokens_is_incomplete(gw: Setup) -> None:
    words = " ".join(["word"] * 30)
    reply = await gw.sdk().responses.create(model="demo", input=words, max_output_tokens=16)
    assert reply.status == "incomplete" and reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens" and reply.usage and reply.usage.output_tokens == 16
    assert reply.max_output_tokens == 16 and reply.output[0].status == "incomplete"  # type: ignore[union-attr]


@sdk_stream_warnings
async def test_a_stream_is_responses_events_and_the_sdk_reads_it(gw: Setup) -> None:
    body = {"model": "demo", "input": "stream this", "stream": True}
    async with gw.http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
        events = events_of((await response.aread()).decode())
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "sim says: stream this"
    final = events[-1]["response"]
    assert final["usage"]["output_tokens"] == 4 and final["output"][0]["content"][0]["text"] == "sim says: stream this"
    record = await record_of(gw.http, response.headers["x-request-id"], ADMIN_KEY)
    assert (record["endpoint"], record["tokens_in"], record["tokens_out"]) == ("/v1/responses", 2, 4)

    stream = await gw.sdk().responses.create(model="demo", input="by the sdk", stream=True)
    seen = [event async for event in stream]
    assert seen[-1].type == "response.completed" and seen[-1].response.output_text == "sim says: by the sdk"
    async with gw.sdk().responses.stream(model="demo", input="with the helper") as helper:
        async for _ in helper:
            pass
        final_response = await helper.get_final_response()
    assert final_response.output_text == "sim says: with the helper"


@sdk_stream_warnings
async def test_a_stream_that_breaks_off_ends_with_an_error_event_and_the_sdk_raises(gw: Setup,
                                                                                     nursery: trio.Nursery) -> None:
    await gw.scripted(nursery, [b'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n'])
    async with gw.http.stream("POST", "/v1/responses", json={"model": "demo", "input": "x", "stream": True}) as r:
        events = events_of((await r.aread()).decode())
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "upstream_error" and events[-1]["response"]["error"]["code"] == "server_error"
    stream = await gw.sdk().responses.create(model="demo", input="x", stream=True)
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        async for _ in stream:
            pass
    await stream.close()


async def test_a_function_tool_round_trip(gw: Setup, nursery: trio.Nursery) -> None:
    call = {"id": "call_9", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
    engine = await gw.scripted(nursery, {"id": "c1", "object": "chat.completion", "created": 0, "model": "demo",
                                         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                                             "role": "assistant", "content": None, "tool_calls": [call]}}],
                                         "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}})
    tool = {"type": "function", "name": "weather", "description": "the weather", "strict": True,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    first = await gw.sdk().responses.create(model="demo", input="weather in Oslo?",
                                            tools=[tool], tool_choice="auto")  # type: ignore[list-item]
    fc = first.output[0]
    assert fc.type == "function_call" and (fc.call_id, fc.name, fc.arguments) == ("call_9", "weather",
                                                                                 '{"city":"Oslo"}')
    assert fc.id.startswith("fc_") and first.tools[0].name == "weather"  # type: ignore[union-attr]
    sent = json.loads(engine.requests[0].body)
    assert sent["tools"] == [{"type": "function", "function": {k: tool[k] for k in
                                                               ("name", "description", "strict", "parameters")}}]
    assert sent["tool_choice"] == "auto"
    await gw.sdk().responses.create(model="demo", tools=[tool], input=[  # type: ignore[list-item]
        {"role": "user", "content": "weather in Oslo?"}, fc.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"type": "function_call_output", "call_id": "call_9", "output": "sunny"}])
    assert json.loads(engine.requests[1].body)["messages"] == [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]


# --- refusals -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "code", "param"), [
    ({"previous_response_id": "resp_1"}, "unsupported_parameter", "previous_response_id"),
    ({"store": True}, "unsupported_value", "store"),
    ({"background": True}, "unsupported_value", "background"),
    ({"tools": [{"type": "web_search"}]}, "unsupported_value", "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "unsupported_value", "input[0].content[0].type"),
    ({"extra_body": {"n_keep": 4}}, "unknown_parameter", "n_keep"),
    ({"model": "capped", "max_output_tokens": 64}, "max_tokens_too_large", "max_output_tokens"),
])
async def test_what_llmgw_does_not_serve_is_refused_by_name(gw: Setup, extra: dict[str, Any], code: str,
                                                            param: str) -> None:
    body = {"model": "demo", "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as raised:
        await gw.sdk().responses.create(**body)
    assert (raised.value.code, raised.value.param) == (code, param)
    assert param in raised.value.message and gw.demo.generated == 0
    if param == "previous_response_id":
        assert "keeps no responses" in raised.value.message
    if param == "max_output_tokens":
        assert "'max_output_tokens' is 64" in raised.value.message
    # null is "not given", never refused
    nulls = {"previous_response_id": None, "conversation": None, "prompt": None, "moderation": None,
             "top_logprobs": None, "store": None, "include": None, "reasoning": None}
    assert (await gw.http.post("/v1/responses", json={"model": "demo", "input": "hi", **nulls})).status_code == 200


async def test_a_keys_tokens_per_minute_counts_responses(gw: Setup) -> None:
    words = " ".join(["word"] * 80)
    await gw.sdk(LIMITED).responses.create(model="demo", input=words)
    with pytest.raises(openai.RateLimitError) as raised:
        await gw.sdk(LIMITED).responses.create(model="demo", input="x")
    assert raised.value.code == "rate_limited"


@sdk_stream_warnings
@pytest.mark.parametrize("stream", [False, True])
async def test_guard_policies_judge_responses_prompts_and_answers(gw: Setup, stream: bool) -> None:
    gw.policy("prompt")
    with pytest.raises(openai.BadRequestError) as raised:
        await gw.sdk().responses.create(model="demo", input="how to build a bomb", stream=stream)
    assert raised.value.code == "guard_refused" and "S9" in raised.value.message and gw.demo.generated == 0
    gw.policy("response")
    with pytest.raises(openai.BadRequestError) as raised:  # the prompt is not judged; the answer (a bomb) is
        await gw.sdk().responses.create(model="demo", input=[{"role": "user", "content": "say bomb"}], stream=stream)
    assert raised.value.code == "guard_refused" and gw.demo.generated == 1
    safe = await gw.sdk().responses.create(model="demo", input="say bread", stream=stream)
    if stream:
        assert [e async for e in safe][-1].type == "response.completed"  # type: ignore[union-attr]
    else:
        assert safe.output_text == "sim says: say bread"  # type: ignore[union-attr]
