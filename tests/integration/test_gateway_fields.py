"""OpenAI's richer request fields through the gateway to the sim engine, with the official `openai` SDK:
tools (whole and streamed), structured output, log probabilities, n choices, stop lists, token-id inputs;
every answer checked against the pinned OpenAPI schemas. And the engine table (gateway/capabilities.py): a
field the model's engine cannot honour is refused by name before any engine sees it, the gateway's own
fields never reach one, and a null optional field is never refused."""

from __future__ import annotations

import base64
import json
import random
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import openai
import pydantic
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
from llmgw.testing.scripted_engine import ScriptedEngine
from llmgw.testing.scripted_engine import serving as scripted
from tests.support.openai_spec import errors

KEY = "sk-test-fields"
sdk_stream_warnings = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' was garbage collected:ResourceWarning"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "unit", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@dataclass
class Setup:
    url: str
    http: httpx.AsyncClient
    engine: ScriptedEngine  # serves "recorded" (engine sim) and "lcpp" (engine llama.cpp): what reached it

    def sdk(self, http_client: openai.DefaultAsyncHttpxClient) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=KEY, http_client=http_client, max_retries=0)


ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok", "refusal": None}, "logprobs": None,
     "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


@pytest.fixture
async def gw(nursery: trio.Nursery) -> AsyncIterator[Setup]:
    store = MemoryStore()
    docs = [{"name": "demo", "engine": "sim", "source": "sim://demo", "role": "chat"},
            {"name": "demo-embed", "engine": "sim", "source": "sim://demo-embed", "role": "embedding"},
            {"name": "recorded", "engine": "sim", "source": "sim://recorded", "role": "chat"},
            {"name": "lcpp", "engine": "llama.cpp", "source": "/models/tiny.gguf", "role": "chat"},
            {"name": "vllm-embed", "engine": "vllm", "source": "hf://org/embed", "role": "embedding"},
            {"name": "parked", "engine": "sim", "source": "sim://parked", "role": "chat",
             "fallbacks": ["lcpp", "demo"]}]
    for doc in docs:
        store.submit_nowait(commands.put_model(ModelDef.from_doc(doc), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    engine = ScriptedEngine(lambda request, reply: reply.whole(200, ANSWER))
    scripted_url = await scripted(nursery, engine)

    async def sim_endpoint(model: str, role: str = "chat") -> Endpoint:
        url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, model, role)))
        return Endpoint(f"{model}-r1", url)

    routes = {
        "demo": ModelRoute("demo", "chat", "ready", (await sim_endpoint("demo"),)),
        "demo-embed": ModelRoute("demo-embed", "embedding", "ready", (await sim_endpoint("demo-embed", "embedding"),)),
        "recorded": ModelRoute("recorded", "chat", "ready", (Endpoint("recorded-r1", scripted_url),)),
        "lcpp": ModelRoute("lcpp", "chat", "ready", (Endpoint("lcpp-r1", scripted_url),)),
        "vllm-embed": ModelRoute("vllm-embed", "embedding", "ready", (Endpoint("vllm-r1", scripted_url),)),
        "parked": ModelRoute("parked", "chat", "parked", (), "5 failed starts"),
    }
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    url = f"http://{host}:{port}"
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {KEY}"}) as http:
        yield Setup(url, http, engine)


def valid(schema: str, doc: Any) -> Any:
    assert errors(schema, doc) == [], doc
    return doc


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


# --- tools ------------------------------------------------------------------------


async def test_a_tool_call_whole_in_openai_shape(gw: Setup) -> None:
    body = {"model": "demo", "messages": user("what is the weather in Paris"), "tools": [WEATHER, TIME],
            "tool_choice": "required"}
    answer = valid("CreateChatCompletionResponse", (await gw.http.post("/v1/chat/completions", json=body)).json())
    async with openai.DefaultAsyncHttpxClient() as http_client:
        reply = await gw.sdk(http_client).chat.completions.create(
            model="demo", messages=user("call get_time please"), tools=[WEATHER, TIME])  # type: ignore[list-item]
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and call["type"] == "function" and call["id"]
    assert set(arguments) == {"city", "unit", "days"} and arguments["unit"] in ("c", "f")
    assert 1 <= arguments["days"] <= 7
    # tool_choice auto (the SDK's default with tools): the tool the user names is called.
    assert reply.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in reply.choices[0].message.tool_calls or []  # type: ignore[union-attr]
            ] == ["get_time"]


@sdk_stream_warnings
async def test_a_tool_call_streamed_as_openai_does_and_assembled_by_the_sdk(gw: Setup) -> None:
    body = {"model": "demo", "messages": user("weather in Oslo"), "tools": [WEATHER], "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    async with gw.http.stream("POST", "/v1/chat/completions", json=body) as response:
        frames = [json.loads(line[6:]) async for line in response.aiter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    for frame in frames:
        valid("CreateChatCompletionStreamResponse", frame)
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"]
    assert len(calls) > 2 and all(set(c) == {"index", "function"} for c in calls[1:])
    whole = json.loads("".join(c["function"]["arguments"] for c in calls))
    assert [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1] == "tool_calls"
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        async with client.chat.completions.stream(
                model="demo", messages=user("weather in Oslo"), tools=[WEATHER],  # type: ignore[list-item]
                tool_choice={"type": "function", "function": {"name": "get_weather"}}) as stream:
            final = await stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == whole  # type: ignore[union-attr]


# --- structured output, logprobs, n, stop ----------------------------------------------


class Weather(pydantic.BaseModel):
    city: str
    days: int
    windy: bool
    tags: list[str]


async def test_json_schema_answers_parse_with_the_sdk(gw: Setup) -> None:
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        parsed = await client.chat.completions.parse(model="demo", messages=user("forecast"),
                                                     response_format=Weather)
        loose = await client.chat.completions.create(model="demo", messages=user("anything"),
                                                      response_format={"type": "json_object"})
    assert isinstance(parsed.choices[0].message.parsed, Weather)
    assert isinstance(json.loads(loose.choices[0].message.content or ""), dict)
    valid("CreateChatCompletionResponse", loose.model_dump(mode="json", exclude_unset=True))


async def test_logprobs_n_and_stop_lists(gw: Setup) -> None:
    body = {"model": "demo", "messages": user("one two three four"), "logprobs": True, "top_logprobs": 2, "n": 3}
    answer = valid("CreateChatCompletionResponse", (await gw.http.post("/v1/chat/completions", json=body)).json())
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    content = answer["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == answer["choices"][0]["message"]["content"]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"] for e in content)
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        stopped = await client.chat.completions.create(model="demo", messages=user("alpha beta gamma"),
                                                       stop=["gamma", "zeta"])
        legacy = await client.completions.create(model="demo", prompt="red green blue", logprobs=2, n=2,
                                                 stop=[" green"], echo=True)
    assert stopped.choices[0].message.content == "sim says: alpha beta "
    assert stopped.choices[0].finish_reason == "stop"
    assert [c.text for c in legacy.choices] == ["red green bluesim says: red"] * 2
    legacy_doc = valid("CreateCompletionResponse", legacy.model_dump(mode="json", exclude_unset=True))
    logprobs = legacy_doc["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["sim", " says:", " red"] and len(logprobs["top_logprobs"][0]) == 2


async def test_token_id_inputs_as_the_spec_allows(gw: Setup) -> None:
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        nested = await client.embeddings.create(model="demo-embed", input=[[1, 2, 3], [4, 5]])
        flat = await client.embeddings.create(model="demo-embed", input=[1, 2, 3])
        completion = await client.completions.create(model="demo", prompt=[7, 8])
    assert len(nested.data) == 2 and nested.data[0].embedding == flat.data[0].embedding
    assert nested.usage.prompt_tokens == 5
    assert completion.choices[0].text == "sim says: 7 8"
    mixed = await gw.http.post("/v1/embeddings", json={"model": "demo-embed", "input": [[1, 2], "x"]})
    assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "input"


# --- the engine table ---------------------------------------------------------------


async def test_a_field_the_engine_cannot_honour_is_refused_by_name(gw: Setup) -> None:
    cases = [("/v1/chat/completions", {"model": "lcpp", "messages": user("hi"), "n": 2}, "n"),
             ("/v1/chat/completions", {"model": "lcpp", "messages": user("hi"), "prediction": {
                 "type": "content", "content": "x"}}, "prediction"),
             ("/v1/completions", {"model": "lcpp", "prompt": "hi", "echo": True}, "echo"),
             ("/v1/embeddings", {"model": "demo-embed", "input": "hi", "user": "u", "dimensions": 4}, None),
             ("/v1/chat/completions", {"model": "demo", "messages": user("hi"), "moderation": {"model": "m"}},
              "moderation"),
             ("/v1/chat/completions", {"model": "demo", "messages": user("hi"), "store": True}, "store")]
    for path, body, field in cases:
        response = await gw.http.post(path, json=body)
        if field is None:
            assert response.status_code == 200, response.text
            continue
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", field)
        assert f"'{field}'" in error["message"]
        if body["model"] == "lcpp":
            assert "'lcpp'" in error["message"] and "llama.cpp" in error["message"]
    assert gw.engine.requests == []
    # What asks for nothing more than the default passes: n 1, echo false, nulls.
    ok = {"model": "lcpp", "messages": user("hi"), "n": 1, "logprobs": False, "moderation": None, "audio": None,
          "prompt_cache_retention": None, "prompt_cache_options": None, "web_search_options": None}
    assert (await gw.http.post("/v1/chat/completions", json=ok)).status_code == 200


async def test_the_gateways_own_fields_never_reach_the_engine(gw: Setup) -> None:
    body = {"model": "recorded", "messages": user("hi"), "user": "u1", "safety_identifier": "s",
            "metadata": {"k": "v"}, "store": False, "service_tier": "auto", "prompt_cache_key": "conv-7",
            "prompt_cache_retention": "in_memory", "temperature": 0.5}
    assert (await gw.http.post("/v1/chat/completions", json=body)).status_code == 200
    plain = {"model": "recorded", "messages": user("hi"), "temperature": 0.5}
    assert (await gw.http.post("/v1/chat/completions", json=plain)).status_code == 200
    sent = [json.loads(r.body) for r in gw.engine.requests]
    assert sent == [plain, plain]
    refused = await gw.http.post("/v1/chat/completions", json={**body, "service_tier": "flex"})
    assert refused.json()["error"]["param"] == "service_tier"


async def test_a_fallback_whose_engine_would_refuse_is_passed_over(gw: Setup) -> None:
    body = {"model": "parked", "messages": user("hi"), "n": 2}
    response = await gw.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.headers["x-llmgw-model"] == "demo"  # not lcpp (llama.cpp)
    assert len(response.json()["choices"]) == 2 and gw.engine.requests == []
    response = await gw.http.post("/v1/chat/completions", json={**body, "n": 1})
    assert response.headers["x-llmgw-model"] == "lcpp"  # n 1 asks nothing: the first fallback serves


# Values of each field, typed as the spec says, many asking for something, some odd (an engine's to refuse).
POOL: dict[str, list[Any]] = {
    "n": [1, 2, 3], "logprobs": [True, False], "top_logprobs": [0, 2, 5], "seed": [0, -7, 2**40],
    "stop": ["x", ["says", "zz"], [], [""]], "temperature": [0, 1.5], "top_p": [0.5], "max_tokens": [1, 3, 50],
    "max_completion_tokens": [2], "frequency_penalty": [0, 1.0], "presence_penalty": [0, -1.0],
    "logit_bias": [{}, {"5": -100}],
    "response_format": [{"type": "text"}, {"type": "json_object"}, {"type": "json_schema"}, {"type": "nope"},
                        {"type": "json_schema",
                         "json_schema": {"name": "w", "schema": WEATHER["function"]["parameters"]}}],
    "tools": [[WEATHER, TIME], [], [{"type": "function"}]], "tool_choice": ["auto", "none", "required", {
        "type": "function", "function": {"name": "get_time"}}, {"x": 1}, "sometimes"],
    "parallel_tool_calls": [True, False], "stream": [True, False], "stream_options": [{"include_usage": True}],
    "user": ["u"], "metadata": [{"a": "b"}], "store": [False, True], "service_tier": ["auto", "flex"],
    "prompt_cache_key": ["k"], "moderation": [{"model": "m"}], "audio": [{"voice": "alloy"}],
    "modalities": [["text"], ["text", "audio"]], "verbosity": ["low", "medium"], "reasoning_effort": ["low"],
    "prediction": [{"type": "content", "content": "x"}], "web_search_options": [{}], "functions": [[]],
    "function_call": ["none", "auto"], "safety_identifier": ["s"], "prompt_cache_retention": ["in_memory", "24h"],
    "prompt_cache_options": [{"ttl": "30m"}],
}


POOL_COMPLETION: dict[str, list[Any]] = {
    "prompt": ["say words", ["one", "two"], [1, 2, 3], [[4, 5], [6]]], "n": [1, 2], "best_of": [1, 2],
    "logprobs": [0, 2, 5], "echo": [True, False], "suffix": ["", "end"], "stop": ["o", ["says"]],
    "max_tokens": [1, 40], "seed": [3], "temperature": [0.1], "logit_bias": [{}, {"1": 1}], "user": ["u"],
    "stream": [True, False], "stream_options": [{"include_usage": True}], "frequency_penalty": [0, 0.5],
}
POOL_EMBEDDING: dict[str, list[Any]] = {
    "input": ["text", ["a", "b"], [1, 2], [[1], [2, 3]]], "dimensions": [3, 16], "user": ["u"],
    "encoding_format": ["float", "base64"],
}
KINDS = {"chat": ("/v1/chat/completions", {"model": "demo", "messages": user("call get_time or say words")}, POOL,
                  "CreateChatCompletionResponse", "CreateChatCompletionStreamResponse"),
         "completion": ("/v1/completions", {"model": "demo", "prompt": "say words"}, POOL_COMPLETION,
                        "CreateCompletionResponse", "CreateCompletionResponse"),
         "embedding": ("/v1/embeddings", {"model": "demo-embed", "input": "words"}, POOL_EMBEDDING,
                       "CreateEmbeddingResponse", "")}


@sdk_stream_warnings
async def test_any_subset_of_fields_gets_an_answer_in_openai_shape_never_a_5xx(gw: Setup) -> None:
    rng = random.Random(23)
    seen: set[tuple[str, int]] = set()
    for _ in range(240):
        kind = rng.choice(sorted(KINDS))
        path, base, pool, whole, chunk = KINDS[kind]
        fields = sorted(pool)
        extra = {f: rng.choice([None, *pool[f]]) for f in rng.sample(fields, rng.randint(0, min(8, len(fields))))}
        extra = {f: v for f, v in extra.items() if v is not None or f not in base}  # the required stay given
        body = {**base, **extra}
        if extra.get("stream"):
            async with gw.http.stream("POST", path, json=body) as response:
                text = (await response.aread()).decode()
            seen.add((kind, response.status_code))
            if response.status_code == 200:
                frames = [json.loads(line[6:]) for line in text.splitlines()
                          if line.startswith("data: ") and line != "data: [DONE]"]
                if kind == "completion":  # no chunk schema in the spec: OpenAI's chunks have nulls until the end
                    for frame in frames:
                        if frame.get("usage", 0) is None:
                            del frame["usage"]
                        for choice in frame["choices"]:
                            choice["finish_reason"] = choice["finish_reason"] or "length"
                assert frames and all(valid(chunk, f) for f in frames)
                continue
        else:
            response = await gw.http.post(path, json=body)
            seen.add((kind, response.status_code))
            if response.status_code == 200:
                answer = response.json()
                if body.get("encoding_format") == "base64":  # a string, which the spec's schema does not say
                    for item in answer["data"]:
                        raw = base64.b64decode(item["embedding"])
                        item["embedding"] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
                valid(whole, answer)
                continue
        assert response.status_code == 400, (body, response.text)
        error = valid("ErrorResponse", response.json())["error"]
        field = (error["param"] or "").split(".")[0].split("[")[0]
        assert field in extra, (body, error)
        assert extra[field] is not None  # a null is never refused
    assert {status for _, status in seen} == {200, 400} and {kind for kind, _ in seen} == set(KINDS)
