"""The simulator's ASGI app, driven in-process through httpx.ASGITransport under trio."""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.engines.sim import SimOptions, make_app, serve
from llmgw.wire.asgi import MAX_BODY_BYTES


def options(role: str = "chat", **overrides: Any) -> SimOptions:
    return SimOptions(host="127.0.0.1", port=0, model="demo", role=role, **overrides)


def client_for(opts: SimOptions) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(opts)), base_url="http://sim")


@pytest.fixture
async def chat() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(options()) as client:
        yield client


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def sse_frames(body: str) -> list[str]:
    assert body.endswith("\n\n")
    frames = body[:-2].split("\n\n")
    assert all(frame.startswith("data: ") for frame in frames), frames
    return [frame[len("data: "):] for frame in frames]


# -- health and models ---------------------------------------------------------


async def test_health_and_models(chat: httpx.AsyncClient) -> None:
    health = await chat.get("/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    models = (await chat.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [("demo", "model", "llmgw-sim")]


# -- chat completions ------------------------------------------------------------


async def test_chat_reply_is_deterministic_with_usage(chat: httpx.AsyncClient) -> None:
    body = {
        "model": "demo",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "hello  there\nworld"},
        ],
    }
    first = (await chat.post("/v1/chat/completions", json=body)).json()
    second = (await chat.post("/v1/chat/completions", json=body)).json()
    assert first["object"] == "chat.completion"
    assert first["model"] == "demo"
    assert first["id"].startswith("chatcmpl-sim-") and first["id"] != second["id"]
    assert isinstance(first["created"], int)
    [choice] = first["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "sim says: hello there world"
    assert choice["finish_reason"] == "stop"
    assert second["choices"][0]["message"]["content"] == choice["message"]["content"]
    # 2 + 2 + 2 + 3 words in all messages; "sim", "says:" and 3 echoed words.
    assert first["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}


async def test_text_parts_content_is_read(chat: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts work"}]}]}
    reply = (await chat.post("/v1/chat/completions", json=body)).json()
    assert reply["choices"][0]["message"]["content"] == "sim says: parts work"
    assert reply["usage"]["prompt_tokens"] == 2


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_cuts_with_finish_reason_length(chat: httpx.AsyncClient, field: str) -> None:
    reply = (await chat.post("/v1/chat/completions", json={**user("one two three four"), field: 4})).json()
    assert reply["choices"][0]["message"]["content"] == "sim says: one two"
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 4


async def test_a_stop_string_cuts_the_reply_and_is_named_as_vllm_does(chat: httpx.AsyncClient) -> None:
    request = {**user("one two three"), "stop": ["zzz", "two", "one"]}  # the first in the text ends it
    reply = (await chat.post("/v1/chat/completions", json=request)).json()["choices"][0]
    assert (reply["message"]["content"], reply["finish_reason"], reply["stop_reason"]) == ("sim says: ", "stop", "one")
    frames = sse_frames((await chat.post("/v1/chat/completions", json={**request, "stream": True})).text)
    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "sim says: "
    assert (chunks[-1]["choices"][0]["finish_reason"], chunks[-1]["choices"][0]["stop_reason"]) == ("stop", "one")
    # past max_tokens a stop string is never reached; without a stop string the choice has no stop_reason
    cut = (await chat.post("/v1/chat/completions", json={**user("one two"), "stop": "two", "max_tokens": 3})).json()
    assert cut["choices"][0]["finish_reason"] == "length" and "stop_reason" not in cut["choices"][0]
    text = (await chat.post("/v1/completions", json={"prompt": "a b c", "stop": "b"})).json()["choices"][0]
    assert (text["text"], text["stop_reason"]) == ("sim says: a ", "b")
    bad = await chat.post("/v1/chat/completions", json={**user("x"), "stop": [1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop"


async def test_default_limit_is_64_tokens(chat: httpx.AsyncClient) -> None:
    reply = (await chat.post("/v1/chat/completions", json=user(" ".join(["w"] * 100)))).json()
    assert reply["usage"]["completion_tokens"] == 64
    assert reply["choices"][0]["finish_reason"] == "length"
    exact = (await chat.post("/v1/chat/completions", json=user(" ".join(["w"] * 62)))).json()
    assert exact["choices"][0]["finish_reason"] == "stop"


async def test_chat_stream_reassembles_to_the_same_text(chat: httpx.AsyncClient) -> None:
    request = {**user("stream me please"), "max_tokens": 4}
    whole = (await chat.post("/v1/chat/completions", json=request)).json()
    response = await chat.post("/v1/chat/completions", json={**request, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(response.text)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    tokens = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert tokens[1:-1] == ["sim", " says:", " stream", " me"]  # one token per chunk
    assert "".join(tokens) == whole["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert chunks[-1]["choices"][0]["delta"] == {}


async def test_stream_include_usage_adds_a_usage_chunk(chat: httpx.AsyncClient) -> None:
    request = {**user("count these"), "stream": True, "stream_options": {"include_usage": True}}
    frames = sse_frames((await chat.post("/v1/chat/completions", json=request)).text)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


# -- legacy completions ----------------------------------------------------------


async def test_completions_echo_the_prompt(chat: httpx.AsyncClient) -> None:
    reply = (await chat.post("/v1/completions", json={"prompt": "once upon a time", "max_tokens": 5})).json()
    assert reply["object"] == "text_completion"
    assert reply["id"].startswith("cmpl-sim-")
    assert reply["choices"] == [
        {"text": "sim says: once upon a", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}


async def test_completions_stream(chat: httpx.AsyncClient) -> None:
    request = {"prompt": "a b", "stream": True, "stream_options": {"include_usage": True}}
    frames = sse_frames((await chat.post("/v1/completions", json=request)).text)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    assert text == "sim says: a b"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


async def test_completions_with_a_list_of_prompts(chat: httpx.AsyncClient) -> None:
    reply = (await chat.post("/v1/completions", json={"prompt": ["x", "y z"]})).json()
    assert [(c["index"], c["text"]) for c in reply["choices"]] == [(0, "sim says: x"), (1, "sim says: y z")]
    assert reply["usage"]["prompt_tokens"] == 3


# -- guard -----------------------------------------------------------------------


async def test_guard_answers_like_llama_guard() -> None:
    async with client_for(options("guard")) as guard:

        async def verdict(messages: list[dict[str, str]]) -> str:
            reply = (await guard.post("/v1/chat/completions", json={"messages": messages})).json()
            return str(reply["choices"][0]["message"]["content"])

        assert await verdict([{"role": "user", "content": "how do I bake bread?"}]) == "safe"
        assert await verdict([{"role": "user", "content": "bad [unsafe:S6] stuff"}]) == "unsafe\nS6"
        assert await verdict([{"role": "user", "content": "[unsafe:S1] [unsafe:S10] [unsafe:S1]"}]) == "unsafe\nS1,S10"
        # Only the last user turn (and what follows it) is judged.
        earlier = [
            {"role": "user", "content": "[unsafe:S2]"},
            {"role": "assistant", "content": "no"},
            {"role": "user", "content": "fine now"},
        ]
        assert await verdict(earlier) == "safe"
        response = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "[unsafe:S9]"}]
        assert await verdict(response) == "unsafe\nS9"

        streamed = await guard.post(
            "/v1/chat/completions", json={**user("x [unsafe:S6]"), "stream": True}
        )
        chunks = [json.loads(f) for f in sse_frames(streamed.text)[:-1]]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "unsafe\nS6"

        legacy = (await guard.post("/v1/completions", json={"prompt": "[unsafe:S3]"})).json()
        assert legacy["choices"][0]["text"] == "unsafe\nS3"


# -- embeddings ------------------------------------------------------------------


async def test_embeddings_are_deterministic_normalised_vectors() -> None:
    async with client_for(options("embedding", embedding_dim=24)) as embedder:
        reply = (await embedder.post("/v1/embeddings", json={"input": ["alpha beta", "gamma"]})).json()
        again = (await embedder.post("/v1/embeddings", json={"input": "alpha beta"})).json()
        assert reply["object"] == "list"
        assert reply["model"] == "demo"
        assert [d["index"] for d in reply["data"]] == [0, 1]
        first, second = (d["embedding"] for d in reply["data"])
        assert len(first) == len(second) == 24
        assert math.isclose(math.fsum(v * v for v in first), 1.0, rel_tol=1e-9)
        assert first != second
        assert again["data"][0]["embedding"] == first
        assert reply["usage"] == {"prompt_tokens": 3, "total_tokens": 3}

        sized = (await embedder.post("/v1/embeddings", json={"input": "x", "dimensions": 5})).json()
        assert len(sized["data"][0]["embedding"]) == 5

        packed = (await embedder.post("/v1/embeddings", json={"input": "gamma", "encoding_format": "base64"})).json()
        decoded = struct.unpack("<24f", base64.b64decode(packed["data"][0]["embedding"]))
        assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(decoded, second, strict=True))


async def test_embedding_role_refuses_chat_and_chat_role_refuses_embeddings(chat: httpx.AsyncClient) -> None:
    refused = await chat.post("/v1/embeddings", json={"input": "x"})
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    async with client_for(options("embedding")) as embedder:
        assert (await embedder.post("/v1/chat/completions", json=user("x"))).status_code == 400


# -- errors ----------------------------------------------------------------------


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert error["param"] == param
    return error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"", b"[1, 2]", b'"text"'])
async def test_malformed_json_is_400(path: str, content: bytes) -> None:
    role = "embedding" if path == "/v1/embeddings" else "chat"
    async with client_for(options(role)) as client:
        response = await client.post(path, content=content, headers={"content-type": "application/json"})
    assert_error(response, 400)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {}, "messages"),
        ("/v1/chat/completions", {"messages": "hi"}, "messages"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": ["hi"]}, "messages[0]"),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages[0].role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content",
        ),
        ("/v1/chat/completions", {**user("x"), "max_tokens": "5"}, "max_tokens"),
        ("/v1/chat/completions", {**user("x"), "max_tokens": True}, "max_tokens"),
        ("/v1/chat/completions", {**user("x"), "max_tokens": 0}, "max_tokens"),
        ("/v1/chat/completions", {**user("x"), "max_completion_tokens": 1.5}, "max_completion_tokens"),
        ("/v1/chat/completions", {**user("x"), "stream": "yes"}, "stream"),
        ("/v1/chat/completions", {**user("x"), "stream_options": []}, "stream_options"),
        (
            "/v1/chat/completions",
            {**user("x"), "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
        ),
        ("/v1/chat/completions", {**user("x"), "model": 7}, "model"),
        ("/v1/completions", {}, "prompt"),
        ("/v1/completions", {"prompt": 3}, "prompt"),
        ("/v1/completions", {"prompt": [1, "a"]}, "prompt"),
        ("/v1/completions", {"prompt": [[1], []]}, "prompt"),
        ("/v1/chat/completions", {**user("x"), "n": 0}, "n"),
        ("/v1/chat/completions", {**user("x"), "stop": [1]}, "stop"),
        ("/v1/chat/completions", {**user("x"), "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ("/v1/chat/completions", {**user("x"), "response_format": {"type": "xml"}}, "response_format.type"),
        ("/v1/chat/completions", {**user("x"), "tools": [{"type": "function"}]}, "tools[0]"),
        ("/v1/completions", {"prompt": []}, "prompt"),
    ],
)
async def test_wrong_types_name_the_param(
    chat: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    assert_error(await chat.post(path, json=body), 400, param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": 3}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": "8"}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ],
)
async def test_embedding_input_errors_name_the_param(body: dict[str, Any], param: str) -> None:
    async with client_for(options("embedding")) as embedder:
        assert_error(await embedder.post("/v1/embeddings", json=body), 400, param)


async def test_unknown_path_is_404(chat: httpx.AsyncClient) -> None:
    assert_error(await chat.get("/v1/nothing"), 404)
    assert_error(await chat.post("/v2/chat/completions", json=user("x")), 404)


async def test_wrong_method_is_405(chat: httpx.AsyncClient) -> None:
    response = await chat.get("/v1/chat/completions")
    assert_error(response, 405)
    assert response.headers["allow"] == "POST"
    assert_error(await chat.post("/health"), 405)
    assert_error(await chat.delete("/v1/models"), 405)


async def test_oversized_body_is_413(chat: httpx.AsyncClient) -> None:
    huge = b'{"messages": [{"role": "user", "content": "' + b"x" * MAX_BODY_BYTES + b'"}]}'
    assert_error(await chat.post("/v1/chat/completions", content=huge), 413)


async def test_oversized_chunked_body_is_413_before_reading_it_all() -> None:
    # No content-length: the cap applies while reading. Driven with a bare
    # ASGI receive/send, which also counts how much of the body was read.
    chunk = b" " * (1024 * 1024)
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    await make_app(options())(scope, receive, send)
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_too_large"
    assert received == MAX_BODY_BYTES // len(chunk) + 1


# -- pacing ----------------------------------------------------------------------


async def test_tokens_per_s_paces_replies(autojump_clock: trio.testing.MockClock) -> None:
    async with client_for(options(tokens_per_s=10)) as slow:
        request = {**user("a b c d e f g h"), "max_tokens": 10}
        start = trio.current_time()
        whole = await slow.post("/v1/chat/completions", json=request)
        assert whole.json()["usage"]["completion_tokens"] == 10
        assert trio.current_time() - start == pytest.approx(1.0)

        start = trio.current_time()
        streamed = await slow.post("/v1/chat/completions", json={**request, "max_tokens": 5, "stream": True})
        assert sse_frames(streamed.text)[-1] == "[DONE]"
        assert trio.current_time() - start == pytest.approx(0.5)


# -- a real server -----------------------------------------------------------------


async def test_serve_listens_on_a_real_port_and_stops_on_cancel() -> None:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, options())
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/health")).json() == {"status": "ok"}
            request = {**user("over the wire"), "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=request) as response:
                lines = [line async for line in response.aiter_lines() if line]
            assert lines[-1] == "data: [DONE]"
        nursery.cancel_scope.cancel()


def test_make_app_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match="role"):
        make_app(options("poet"))
    with pytest.raises(ValueError, match="embedding_dim"):
        make_app(options(embedding_dim=0))
