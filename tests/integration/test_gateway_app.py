"""The gateway's /v1 API (S4, S14) over real HTTP, in front of real sim engines on loopback.

Driven with httpx and with the official `openai` SDK, whose async client works under trio.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import openai
import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, parse_bind, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.flaky_engine import Engine, serving

KEY = "sk-test-client"
ADMIN_KEY = "sk-test-admin"
BODY_CAP = 256 * 1024

# The SDK's AsyncStream stops iterating its inner async generators at `[DONE]`
# without closing them; asyncio says nothing, trio warns when they are collected.
# The stream itself is complete and its response closed: only this warning is ignored.
sdk_stream_warnings = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' was garbage collected:ResourceWarning"
)


@dataclass
class Gateway:
    url: str  # http://host:port
    router: Router
    store: MemoryStore
    http: httpx.AsyncClient  # authenticated with KEY, base_url = url
    routes: dict[str, ModelRoute]

    def set_route(self, route: ModelRoute) -> None:
        self.routes[route.model] = route
        self.router.update_routes(self.routes)

    def sdk(self, http_client: openai.DefaultAsyncHttpxClient) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=KEY, http_client=http_client, max_retries=0)


def _model(name: str, role: str = "chat", **extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", "role": role, **extra})


async def _sim(nursery: trio.Nursery, model: str, role: str = "chat", tokens_per_s: float = 0) -> Endpoint:
    url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, model, role, tokens_per_s)))
    return Endpoint(f"{model}-r1", url)


@pytest.fixture
async def gw(nursery: trio.Nursery) -> AsyncIterator[Gateway]:
    store = MemoryStore()
    for model in (
        _model("demo"),
        _model("demo-embed", "embedding"),
        _model("slow"),
        _model("parked-one"),
        _model("nowhere"),
        _model("cold", mode="on-demand", activation_window_s=0.3),
        _model("cold-long", mode="on-demand", activation_window_s=60),
        _model("dead"),
    ):
        store.submit_nowait(commands.put_model(model, at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(ADMIN_KEY), "ops", "admin", 0.0))
    routes = {
        "demo": ModelRoute("demo", "chat", "ready", (await _sim(nursery, "demo"),)),
        "demo-embed": ModelRoute("demo-embed", "embedding", "ready", (await _sim(nursery, "demo-embed", "embedding"),)),
        "slow": ModelRoute("slow", "chat", "ready", (await _sim(nursery, "slow", tokens_per_s=5),)),
        "parked-one": ModelRoute("parked-one", "chat", "parked", (), "5 failed starts; last: CUDA out of memory"),
        "nowhere": ModelRoute("nowhere", "chat", "unplaceable", (), "needs 8 GPUs of class h100-80g; at most 4 free"),
        "cold": ModelRoute("cold", "chat", "starting"),
        "cold-long": ModelRoute("cold-long", "chat", "starting"),
        "dead": ModelRoute("dead", "chat", "ready", (Endpoint("dead-r1", f"http://127.0.0.1:{_closed_port()}"),)),
    }
    router = Router()
    router.update_routes(routes)
    deps = GatewayDeps(router=router, state=store, max_body_bytes=BODY_CAP)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps))
    url = f"http://{host}:{port}"
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {KEY}"}) as http:
        yield Gateway(url, router, store, http, routes)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def open_raw(gw: Gateway, path: str, body: dict[str, Any] | None) -> trio.SocketStream:
    """A request on a bare socket; `body` None sends a chunked head and leaves the body to the caller."""
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    content = b"" if body is None else json.dumps(body).encode()
    framing = "transfer-encoding: chunked" if body is None else f"content-length: {len(content)}"
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\n{framing}\r\n\r\n"
    )
    await stream.send_all(head.encode() + content)
    return stream


def chat(text: str = "hello there", model: str = "demo", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def assert_error(response: httpx.Response, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    types = {401: "authentication_error", 502: "server_error", 503: "service_unavailable", 504: "service_unavailable"}
    assert error["type"] == types.get(status, "invalid_request_error")
    assert re.fullmatch(r"req-[0-9a-f]{16}", response.headers["x-request-id"])
    return dict(error)


# --- happy paths ---------------------------------------------------------------------


async def test_health_needs_no_key(gw: Gateway) -> None:
    async with httpx.AsyncClient() as anonymous:
        response = await anonymous.get(gw.url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_models_list_with_sdk(gw: Gateway) -> None:
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        models = [m async for m in client.models.list()]
        one = await client.models.retrieve("demo-embed")
    assert {m.id for m in models} == set(gw.store.snapshot().models) == set(gw.routes)
    assert {m.owned_by for m in models} == {"llmgw"}
    assert one.id == "demo-embed"


async def test_chat_and_completions_with_sdk(gw: Gateway) -> None:
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        reply = await client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hello there"}]
        )
        completion = await client.completions.create(model="demo", prompt="once upon a time")
    assert reply.choices[0].message.content == "sim says: hello there"
    assert reply.usage is not None and reply.usage.completion_tokens == 4
    assert completion.choices[0].text == "sim says: once upon a time"


@sdk_stream_warnings
async def test_streaming_assembles_to_the_same_text_with_usage(gw: Gateway) -> None:
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        messages: Any = [{"role": "user", "content": "stream me some words please"}]
        whole = await client.chat.completions.create(model="demo", messages=messages)
        stream = await client.chat.completions.create(
            model="demo", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        parts, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        text_stream = await client.completions.create(model="demo", prompt="one two", stream=True)
        text = "".join([c.choices[0].text async for c in text_stream if c.choices])
    assert "".join(parts) == whole.choices[0].message.content == "sim says: stream me some words please"
    assert usage is not None and usage.total_tokens == whole.usage.total_tokens  # type: ignore[union-attr]
    assert text == "sim says: one two"


async def test_streaming_is_sse_through_httpx(gw: Gateway) -> None:
    async with gw.http.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "content-length" not in response.headers
        body = (await response.aread()).decode()
    assert body.rstrip().endswith("data: [DONE]")


async def test_embeddings_with_sdk(gw: Gateway) -> None:
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        result = await client.embeddings.create(model="demo-embed", input=["alpha", "beta"])
    assert [d.index for d in result.data] == [0, 1]
    assert len(result.data[0].embedding) == 16
    assert result.data[0].embedding != result.data[1].embedding


async def test_headers_request_id_and_one_date(gw: Gateway) -> None:
    first = await gw.http.post("/v1/chat/completions", json=chat())
    second = await gw.http.post("/v1/chat/completions", json=chat())
    for response in (first, second):
        assert response.status_code == 200
        assert re.fullmatch(r"req-[0-9a-f]{16}", response.headers["x-request-id"])
        assert len(response.headers.get_list("date")) == 1
        assert len(response.headers.get_list("server")) <= 1
        assert len(response.headers.get_list("content-length")) == 1
        assert "transfer-encoding" not in response.headers
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


async def test_admin_key_is_accepted(gw: Gateway) -> None:
    response = await gw.http.post("/v1/chat/completions", json=chat(), headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 200


async def test_upstream_errors_pass_through(gw: Gateway) -> None:
    response = await gw.http.post("/v1/chat/completions", json=chat(max_tokens=0))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"


async def test_one_log_line_per_request_without_prompt_or_key(gw: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.gateway")
    response = await gw.http.post("/v1/chat/completions", json=chat("purple elephant secret"))
    assert response.status_code == 200
    with trio.fail_after(2):  # the line is written once the response is out
        while not (lines := [r for r in caplog.records if r.name == "llmgw.gateway.access"]):
            await trio.sleep(0.01)
    await trio.sleep(0.05)
    assert len(lines) == 1
    message = lines[0].getMessage()
    assert "POST /v1/chat/completions" in message
    assert "model=demo replica=demo-r1 status=200 ms=" in message
    assert "purple" not in caplog.text and KEY not in caplog.text


# --- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer sk-wrong"}, {"authorization": f"Basic {KEY}"}, {"authorization": "Bearer"}],
)
async def test_bad_key_is_401(gw: Gateway, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=gw.url, headers=headers) as anonymous:
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            response = await anonymous.request(method, path, json=chat())
            assert_error(response, 401, "invalid_api_key")


async def test_sdk_raises_typed_errors(gw: Gateway) -> None:
    async with openai.DefaultAsyncHttpxClient() as http_client:
        client = gw.sdk(http_client)
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        bad = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-bad", http_client=http_client, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
    assert missing.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body", "code", "param"),
    [
        ("/v1/chat/completions", b"{not json", "invalid_json", None),
        ("/v1/chat/completions", b"\xff\xfe", "invalid_json", None),
        ("/v1/chat/completions", b"[1, 2]", "invalid_json", None),
        ("/v1/chat/completions", b"", "invalid_json", None),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "missing_required_parameter", "model"),
        ("/v1/chat/completions", chat(model=7), "invalid_type", "model"),  # type: ignore[arg-type]
        ("/v1/chat/completions", chat(model=""), "invalid_type", "model"),
        ("/v1/chat/completions", {"model": "demo"}, "missing_required_parameter", "messages"),
        ("/v1/chat/completions", {"model": "demo", "messages": "hi"}, "invalid_type", "messages"),
        ("/v1/chat/completions", {"model": "demo", "messages": []}, "invalid_type", "messages"),
        ("/v1/chat/completions", {"model": "demo", "messages": ["hi"]}, "invalid_type", "messages"),
        ("/v1/chat/completions", chat(stream="yes"), "invalid_type", "stream"),
        ("/v1/completions", {"model": "demo"}, "missing_required_parameter", "prompt"),
        ("/v1/completions", {"model": "demo", "prompt": 5}, "invalid_type", "prompt"),
        ("/v1/embeddings", {"model": "demo-embed", "input": {"a": 1}}, "invalid_type", "input"),
        ("/v1/embeddings", {"model": "demo-embed", "input": "x", "stream": 1}, "invalid_type", "stream"),
    ],
)
async def test_malformed_requests_are_400(gw: Gateway, path: str, body: Any, code: str, param: str | None) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await gw.http.post(path, content=content, headers={"content-type": "application/json"})
    assert_error(response, 400, code, param)


async def test_unknown_model_is_404(gw: Gateway) -> None:
    assert_error(await gw.http.post("/v1/chat/completions", json=chat(model="nope")), 404, "model_not_found", "model")
    assert_error(await gw.http.get("/v1/models/nope"), 404, "model_not_found", "model")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "demo", "input": "x"}),
        ("/v1/chat/completions", chat(model="demo-embed")),
        ("/v1/completions", {"model": "demo-embed", "prompt": "x"}),
    ],
)
async def test_role_mismatch_is_400(gw: Gateway, path: str, body: dict[str, Any]) -> None:
    assert_error(await gw.http.post(path, json=body), 400, "model_not_supported", "model")


async def test_unknown_path_and_wrong_method(gw: Gateway) -> None:
    assert_error(await gw.http.post("/v1/images/generations", json={}), 404, "not_found")
    assert_error(await gw.http.get("/v2/anything"), 404, "not_found")
    wrong = await gw.http.get("/v1/chat/completions")
    assert_error(wrong, 405, "method_not_allowed")
    assert wrong.headers["allow"] == "POST"
    assert_error(await gw.http.post("/v1/models", json={}), 405, "method_not_allowed")


async def test_body_over_the_cap_is_413(gw: Gateway) -> None:
    big = json.dumps(chat("x" * BODY_CAP)).encode()
    assert_error(await gw.http.post("/v1/chat/completions", content=big), 413, "request_too_large")
    # The gateway is still fine afterwards.
    assert (await gw.http.post("/v1/chat/completions", json=chat())).status_code == 200


async def test_chunked_body_over_the_cap_is_413_while_reading(gw: Gateway) -> None:
    # No content-length, so the cap applies while reading.
    stream = await open_raw(gw, "/v1/chat/completions", None)
    chunk = b"2000\r\n" + b" " * 8192 + b"\r\n"

    async def upload() -> None:
        try:
            for _ in range(BODY_CAP // 8192 + 2):
                await stream.send_all(chunk)
            await stream.send_all(b"0\r\n\r\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the server answered and hung up

    answer = b""
    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(upload)
        with trio.fail_after(5):
            while b"}}" not in answer:
                data = await stream.receive_some()
                if not data:
                    break
                answer += data
        nursery.cancel_scope.cancel()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 413 "
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_too_large"


async def test_refusal_before_reading_a_big_body_still_reaches_httpx(gw: Gateway) -> None:
    big = json.dumps(chat("x" * (BODY_CAP - 1000))).encode()
    async with httpx.AsyncClient(base_url=gw.url, headers={"authorization": "Bearer sk-wrong"}) as anonymous:
        for _ in range(3):
            assert_error(await anonymous.post("/v1/chat/completions", content=big), 401, "invalid_api_key")


async def test_stopped_system_answers_503_to_every_post(gw: Gateway) -> None:
    gw.store.submit_nowait(commands.put_setting("serving.stopped", True, at=1.0))
    for path, body in (
        ("/v1/chat/completions", chat()),
        ("/v1/completions", {"model": "demo", "prompt": "x"}),
        ("/v1/embeddings", {"model": "demo-embed", "input": "x"}),
        ("/v1/chat/completions", {"garbage": True}),
    ):
        assert_error(await gw.http.post(path, json=body), 503, "system_stopped")
    assert (await gw.http.get("/v1/models")).status_code == 200
    gw.store.submit_nowait(commands.put_setting("serving.stopped", False, at=2.0))
    assert (await gw.http.post("/v1/chat/completions", json=chat())).status_code == 200


# "At once", without a wall-clock threshold: the model's activation window is an hour, and an
# answer within NOT_WAITED_S (far above any honest answer, far below the hour) was not waited for.
HOUR = 3600.0
NOT_WAITED_S = 30


@pytest.mark.parametrize(
    ("model", "code", "reason"),
    [
        ("parked-one", "model_parked", "CUDA out of memory"),
        ("nowhere", "model_unplaceable", "at most 4 free"),
    ],
)
async def test_parked_and_unplaceable_answer_at_once_with_why(gw: Gateway, model: str, code: str, reason: str) -> None:
    # An hour-long activation window: had the gateway waited for one, no answer would come within the bound.
    gw.store.submit_nowait(commands.put_model(_model(model, activation_window_s=HOUR), at=1.0))
    with trio.fail_after(NOT_WAITED_S):
        response = await gw.http.post("/v1/chat/completions", json=chat(model=model), timeout=None)
    error = assert_error(response, 503, code)
    assert reason in error["message"]


async def test_activation_timeout_is_504(gw: Gateway) -> None:
    started = trio.current_time()
    error = assert_error(await gw.http.post("/v1/chat/completions", json=chat(model="cold")), 504, "activation_timeout")
    assert trio.current_time() - started >= 0.3
    assert "starting" in error["message"]
    assert "cold" in gw.router.take_activation_asks()


async def test_activation_that_finishes_in_time_is_served(gw: Gateway, nursery: trio.Nursery) -> None:
    gw.set_route(ModelRoute("cold", "chat", "absent"))
    demo = gw.routes["demo"].endpoints[0]

    async def activate() -> None:
        await trio.sleep(0.1)
        gw.set_route(ModelRoute("cold", "chat", "ready", (Endpoint("cold-r1", demo.url),)))

    nursery.start_soon(activate)
    response = await gw.http.post("/v1/chat/completions", json=chat("warm up", model="cold"))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "sim says: warm up"


async def test_route_turning_parked_fails_the_waiter_at_once(gw: Gateway, nursery: trio.Nursery) -> None:
    gw.store.submit_nowait(commands.put_model(_model("cold", mode="on-demand", activation_window_s=HOUR), at=1.0))
    gw.set_route(ModelRoute("cold", "chat", "starting"))

    async def park() -> None:
        while not gw.router.statistics().waiting.get("cold"):  # parked once the request waits, not before
            await trio.sleep(0.01)
        gw.set_route(ModelRoute("cold", "chat", "parked", (), "engine exited with status 3"))

    nursery.start_soon(park)
    # The window is an hour: only a waiter failed when its route turned parked answers within the bound.
    with trio.fail_after(NOT_WAITED_S):
        response = await gw.http.post("/v1/chat/completions", json=chat(model="cold"), timeout=None)
    error = assert_error(response, 503, "model_parked")
    assert "engine exited with status 3" in error["message"]


async def test_unreachable_replica_is_502(gw: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.gateway")
    assert_error(await gw.http.post("/v1/chat/completions", json=chat(model="dead")), 502, "upstream_unavailable")
    assert "dead-r1" in caplog.text
    assert gw.router.statistics().outstanding["dead"] == 0


async def test_client_disconnect_mid_stream_cancels_upstream(gw: Gateway) -> None:
    many_words = " ".join(["word"] * 40)  # 42 tokens at 5 tokens/s: ~8 s if not cancelled
    # A raw socket: hanging up on httpx mid-stream leaves its generators to the collector.
    stream = await open_raw(gw, "/v1/chat/completions", chat(many_words, model="slow", stream=True))
    async with stream:
        received = b""
        with trio.fail_after(5):
            while b"data: " not in received:
                received += await stream.receive_some()
        assert received.startswith(b"HTTP/1.1 200 ")
        assert gw.router.statistics().outstanding["slow"] == 1
    with trio.fail_after(2):
        while gw.router.statistics().outstanding["slow"]:
            await trio.sleep(0.01)


async def test_client_disconnect_while_waiting_for_non_streamed_reply(gw: Gateway) -> None:
    async def call() -> None:
        async with httpx.AsyncClient(base_url=gw.url, headers={"authorization": f"Bearer {KEY}"}) as client:
            await client.post("/v1/chat/completions", json=chat("a b c d e f g h", model="slow"))

    with trio.move_on_after(0.3):
        await call()
    with trio.fail_after(2):
        while gw.router.statistics().outstanding["slow"]:
            await trio.sleep(0.01)


async def test_client_disconnect_while_waiting_for_activation_stops_the_wait(gw: Gateway) -> None:
    stream = await open_raw(gw, "/v1/chat/completions", chat(model="cold-long"))
    async with stream:
        with trio.fail_after(2):
            while not gw.router.statistics().waiting:
                await trio.sleep(0.01)
    with trio.fail_after(2):  # not the 60 s window
        while gw.router.statistics().waiting:
            await trio.sleep(0.01)


# --- an injected upstream client (httpx's MockTransport): failures real engines rarely show ---


class _BreaksMidway(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": []}\n\n'
        raise httpx.ReadError("connection reset by peer")

    async def aclose(self) -> None:
        pass


async def _failing_upstream(request: httpx.Request) -> httpx.Response:
    headers = {"content-type": "text/event-stream", "date": "Thu, 01 Jan 1970 00:00:00 GMT", "server": "engine"}
    return httpx.Response(200, headers=headers, stream=_BreaksMidway())


async def test_upstream_failure_midway(nursery: trio.Nursery) -> None:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(_model("demo"), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    router.update_routes({"demo": ModelRoute("demo", "chat", "ready", (Endpoint("demo-r9", "http://engine.test"),))})
    async with httpx.AsyncClient(transport=httpx.MockTransport(_failing_upstream)) as upstream:
        deps = GatewayDeps(router=router, state=store, client=upstream)
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps))
        auth = {"authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers=auth) as http:
            # Streaming: the status is out already, so the failure is told in the stream.
            streamed = await http.post("/v1/chat/completions", json=chat(stream=True))
            assert streamed.status_code == 200
            assert streamed.headers.get_list("server") == ["hypercorn-h11"]
            assert len(streamed.headers.get_list("date")) == 1
            assert "1970" not in streamed.headers["date"]
            frames = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
            assert frames[0] == 'data: {"choices": []}'
            assert json.loads(frames[-1].removeprefix("data: "))["error"]["code"] == "upstream_error"
            # Whole answers are read before the status is sent: a clean 502.
            assert_error(await http.post("/v1/chat/completions", json=chat()), 502, "upstream_error")
        nursery.cancel_scope.cancel()
    assert router.statistics().outstanding == {"demo": 0}


async def test_serve_stops_gracefully_on_its_trigger() -> None:
    stop = trio.Event()
    store = MemoryStore()
    deps = GatewayDeps(router=Router(), state=store)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps, shutdown_trigger=stop.wait))
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://{host}:{port}/health")).status_code == 200
        stop.set()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as http:
            await http.get(f"http://{host}:{port}/health")


def test_parse_bind() -> None:
    assert parse_bind("http://127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_bind("http://[::1]:41234") == ("::1", 41234)


async def test_the_gateway_retries_once_when_an_engine_drops_a_kept_alive_connection(
        gw: Gateway, nursery: trio.Nursery) -> None:
    """Through the whole gateway: the second request reuses the kept-alive connection, the engine
    closes it without a byte, and the client still gets its answer (one retry on a new connection)."""
    engine = Engine()
    url = (await serving(nursery, engine)).removesuffix("/v1/chat/completions")
    gw.set_route(ModelRoute("demo", "chat", "ready", (Endpoint("flaky-r1", url),)))
    for _ in range(2):
        response = await gw.http.post("/v1/chat/completions", json=chat())
        assert response.status_code == 200, response.text
    assert (engine.requests, engine.connections) == (3, 2), "one drop, one retry on a new connection"
