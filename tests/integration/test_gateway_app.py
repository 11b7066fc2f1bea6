"""The gateway's /v1 API (S4, S14) over real HTTP, in front of real sim engines on loopback.

Driven with httpx and with the official `openai` SDK, whose async client works under trio.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import openai
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.flaky_engine import Engine, serving
from llmgw.testing.scripted_engine import ScriptedEngine
from llmgw.testing.scripted_engine import serving as scripted

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
    types = {401: "authentication_error", 500: "server_error", 502: "server_error", 503: "service_unavailable",
             504: "service_unavailable"}
    assert error["type"] == types.get(status, "invalid_request_error")
    assert re.fullmatch(r"req-[a-z0-9]{1,24}-[0-9a-f]{16}", response.headers["x-request-id"])
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
        assert re.fullmatch(r"req-[a-z0-9]{1,24}-[0-9a-f]{16}", response.headers["x-request-id"])
        assert len(response.headers.get_list("date")) == 1
        assert len(response.headers.get_list("server")) <= 1
        assert len(response.headers.get_list("content-length")) == 1
        assert "transfer-encoding" not in response.headers
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


async def test_admin_key_is_refused_on_v1(gw: Gateway) -> None:
    # Admin keys administer the cluster; they never serve traffic (docs/api.md, "Keys").
    response = await gw.http.post("/v1/chat/completions", json=chat(), headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


async def test_upstream_errors_pass_through(gw: Gateway) -> None:
    response = await gw.http.post("/v1/chat/completions", json=chat(max_tokens=0))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"


async def test_one_log_line_per_request_without_prompt_or_key(gw: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="llmgw.gateway")
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
    # Answered requests are in the request log; the process log has their line at debug level only.
    assert lines[0].levelno == logging.DEBUG
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
        ("/v1/embeddings", {"model": "demo-embed", "input": "x", "stream": 1}, "unknown_parameter", "stream"),
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


async def test_bytes_that_are_not_http_get_a_json_400_with_a_request_id(gw: Gateway) -> None:
    """The HTTP server's own refusals (before any route) are in the API's error shape and named too."""
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(b"HELLO THERE\r\n\r\n")
        answer = b""
        with trio.fail_after(5):
            while data := await stream.receive_some():
                answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert re.search(rb"\r\nx-request-id: req-local-[0-9a-f]{16}\r\n", head + b"\r\n"), head
    assert json.loads(body)["error"]["code"] == "invalid_request"


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
    assert status_line.startswith(b"HTTP/1.1 413 ")
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


async def test_a_model_its_schedule_holds_at_0_is_refused_at_once_with_when_it_ends(gw: Gateway) -> None:
    # An hour-long activation window, as above: a request that waited for an activation would get no answer
    # within the bound. The rule forbids any replica, so no activation is asked for either.
    ends = time.time() + 2 * HOUR
    gw.store.submit_nowait(commands.put_model(_model("nightly", mode="on-demand", activation_window_s=HOUR), at=1.0))
    gw.set_route(ModelRoute("nightly", "chat", "absent", (), "schedule rule 1 allows no replica until 06:00",
                            off_until=ends))
    with trio.fail_after(NOT_WAITED_S):
        response = await gw.http.post("/v1/chat/completions", json=chat(model="nightly"), timeout=None)
    error = assert_error(response, 503, "model_scheduled_off")
    assert error["message"] == "model 'nightly' is off by its schedule: schedule rule 1 allows no replica until 06:00"
    assert response.headers["x-should-retry"] == "false"
    assert 2 * HOUR - NOT_WAITED_S <= int(response.headers["retry-after"]) <= 2 * HOUR + 1
    assert "nightly" not in gw.router.take_activation_asks()
    # With a fallback, the fallback serves meanwhile.
    gw.store.submit_nowait(commands.put_model(_model("nightly", mode="on-demand", activation_window_s=HOUR,
                                                     fallbacks=["demo"]), at=2.0))
    with trio.fail_after(NOT_WAITED_S):
        served = await gw.http.post("/v1/chat/completions", json=chat(model="nightly"), timeout=None)
    assert served.status_code == 200, served.text
    assert served.headers["x-llmgw-model"] == "demo"


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


async def test_client_disconnect_mid_stream_cancels_upstream(
        gw: Gateway, autojump_clock: trio.testing.MockClock) -> None:
    many_words = " ".join(["word"] * 40)  # 42 tokens at 5 tokens/s: ~8 s (of the MockClock) if not cancelled
    # A raw socket: hanging up on httpx mid-stream leaves its generators to the collector.
    stream = await open_raw(gw, "/v1/chat/completions", chat(many_words, model="slow", stream=True))
    async with stream:
        received = b""
        with trio.fail_after(5):
            while b"data: " not in received:
                received += await stream.receive_some()
        assert received.startswith(b"HTTP/1.1 200 ")
        assert gw.router.statistics().outstanding["slow"] == 1
        hung_up = trio.current_time()
    while gw.router.statistics().outstanding["slow"]:
        await trio.sleep(0.01)
    assert trio.current_time() - hung_up < 0.5  # at once: the engine's next token alone is 0.2 s away


async def test_client_disconnect_while_waiting_for_non_streamed_reply(gw: Gateway, nursery: trio.Nursery) -> None:
    # An engine that never answers: only the gateway hanging up on it (the cancel) ends the call.
    # Without the cancel, `hung_up` is never set and the replica stays outstanding.
    engine = ScriptedEngine(lambda request, reply: trio.sleep_forever())
    gw.set_route(ModelRoute("slow", "chat", "ready", (Endpoint("silent-r1", await scripted(nursery, engine)),)))
    stream = await open_raw(gw, "/v1/chat/completions", chat(model="slow"))
    async with stream:
        with trio.fail_after(5):
            await engine.arrived.wait()
        assert gw.router.statistics().outstanding["slow"] == 1
    with trio.fail_after(5):
        await engine.hung_up.wait()
        while gw.router.statistics().outstanding["slow"]:
            await trio.sleep(0.01)


async def test_client_disconnect_while_waiting_for_activation_stops_the_wait(
        gw: Gateway, autojump_clock: trio.testing.MockClock) -> None:
    stream = await open_raw(gw, "/v1/chat/completions", chat(model="cold-long"))
    async with stream:
        with trio.fail_after(2):
            while not gw.router.statistics().waiting:
                await trio.sleep(0.01)
        hung_up = trio.current_time()
    while gw.router.statistics().waiting:
        await trio.sleep(0.01)
    assert trio.current_time() - hung_up < 0.5  # at once, not at the end of the 60 s window


# --- an engine that breaks off: failures real engines rarely show ---------------------------------

_BREAKS_MIDWAY = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ndate: Thu, 01 Jan 1970 00:00:00 GMT\r\n"
                  b"server: engine\r\ntransfer-encoding: chunked\r\n\r\n"
                  b"17\r\ndata: {\"choices\": []}\n\n\r\n")  # one chunk of the body, then the engine hangs up


async def _breaks_midway(stream: trio.SocketStream) -> None:
    async with stream:
        received = b""
        while b"\r\n\r\n" not in received:
            received += await stream.receive_some()
        await stream.send_all(_BREAKS_MIDWAY)


async def test_upstream_failure_midway(nursery: trio.Nursery) -> None:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(_model("demo"), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    listeners = await nursery.start(partial(trio.serve_tcp, _breaks_midway, 0, host="127.0.0.1"))
    engine = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    router = Router()
    router.update_routes({"demo": ModelRoute("demo", "chat", "ready", (Endpoint("demo-r9", engine),))})
    deps = GatewayDeps(router=router, state=store)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps))
    auth = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers=auth) as http:
        # Streaming: the status is out already, so the failure is told in the stream.
        streamed = await http.post("/v1/chat/completions", json=chat(stream=True))
        assert streamed.status_code == 200
        assert streamed.headers.get_list("server") == ["llmgw"]  # ours, not the engine's
        assert len(streamed.headers.get_list("date")) == 1
        assert "1970" not in streamed.headers["date"]
        frames = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert json.loads(frames[0].removeprefix("data: "))["choices"] == []  # (completed: normalise.py)
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


# --- the OpenAI surface: fields, engine errors, retry advice, streaming (issue 9, points 1 and 2) ---


async def _scripted_demo(gw: Gateway, nursery: trio.Nursery, script: Any) -> ScriptedEngine:
    """Serve `demo` from a scripted engine: the test says what the engine answers, and when."""
    engine = ScriptedEngine(script)
    gw.set_route(ModelRoute("demo", "chat", "ready", (Endpoint("scripted-r1", await scripted(nursery, engine)),)))
    return engine


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/chat/completions", "n_keep"),
        ("/v1/chat/completions", "n_discard"),
        ("/v1/chat/completions", "slot_id"),
        ("/v1/chat/completions", "grammar"),
        ("/v1/chat/completions", "cache_prompt"),
        ("/v1/chat/completions", "api_base"),
        ("/v1/completions", "base_url"),
        ("/v1/completions", "grammar_file"),
        ("/v1/embeddings", "temperature"),
        ("/v1/chat/completions", "no_such_field"),
    ],
)
async def test_fields_outside_the_openai_allowlist_are_refused_by_name(
        gw: Gateway, nursery: trio.Nursery, path: str, field: str) -> None:
    engine = await _scripted_demo(gw, nursery, lambda request, reply: reply.whole(200, b"{}"))
    body = {"/v1/chat/completions": chat(), "/v1/completions": {"model": "demo", "prompt": "x"},
            "/v1/embeddings": {"model": "demo-embed", "input": "x"}}[path]
    error = assert_error(await gw.http.post(path, json={**body, field: 1}), 400, "unknown_parameter", field)
    assert field in error["message"]
    assert engine.requests == []


async def test_newer_openai_fields_reach_the_engine_unchanged(gw: Gateway, nursery: trio.Nursery) -> None:
    answer = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "demo", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
    engine = await _scripted_demo(gw, nursery, lambda request, reply: reply.whole(200, answer))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    async with openai.DefaultAsyncHttpxClient() as http_client:
        reply = await gw.sdk(http_client).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5,
            response_format={"type": "json_object"}, tools=[tool], tool_choice="auto",  # type: ignore[list-item]
            parallel_tool_calls=False, seed=7, logprobs=True, top_logprobs=2, user="u1",
            metadata={"team": "a"}, store=False, temperature=0.5, stop=["\n"],
        )
    assert reply.choices[0].message.content == "ok"
    sent = json.loads(engine.requests[0].body)
    assert sent["max_completion_tokens"] == 5 and sent["tools"] == [tool] and sent["top_logprobs"] == 2
    assert not {"metadata", "user", "store"} & set(sent)  # the gateway's own (docs/api.md, "Fields by engine")


@pytest.mark.parametrize(
    ("status", "body", "message", "code"),
    [
        # llama.cpp's server today, and its older builds.
        (400, b'{"error":{"code":400,"message":"the request exceeds the available context size","type":'
              b'"exceed_context_size_error"}}', "the request exceeds the available context size", "engine_error"),
        (400, b'{"code":400,"message":"grammar parse error"}', "grammar parse error", "engine_error"),
        (503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}', "Loading model",
         "engine_error"),
        (500, b"Internal Server Error: boom", "boom", "engine_error"),
        (422, b'{"detail":"field required"}', "field required", "engine_error"),
        # OpenAI's own shape (vLLM): its code and param kept.
        (400, b'{"error":{"message":"bad n","type":"invalid_request_error","param":"n","code":"invalid_value"}}',
         "bad n", "invalid_value"),
    ],
)
async def test_an_engines_own_error_reaches_the_client_in_openai_shape(
        gw: Gateway, nursery: trio.Nursery, status: int, body: bytes, message: str, code: str) -> None:
    content_type = "text/plain" if body.startswith(b"Internal") else "application/json"
    await _scripted_demo(gw, nursery, lambda request, reply: reply.whole(status, body, content_type))
    for request in (chat(), chat(stream=True)):  # a streamed request refused before its stream: the same
        response = await gw.http.post("/v1/chat/completions", json=request)
        assert response.headers["content-type"] == "application/json"
        error = assert_error(response, status, code, "n" if code == "invalid_value" else None)
        assert message in error["message"]


async def test_an_engines_refusal_raises_the_sdks_typed_error(gw: Gateway, nursery: trio.Nursery) -> None:
    body = b'{"error":{"code":400,"message":"the request exceeds the available context size","type":"x"}}'
    await _scripted_demo(gw, nursery, lambda request, reply: reply.whole(400, body))
    async with openai.DefaultAsyncHttpxClient() as http_client:
        with pytest.raises(openai.BadRequestError) as caught:
            await gw.sdk(http_client).chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}])
    assert "exceeds the available context size" in caught.value.message


@pytest.mark.parametrize(
    ("model", "code", "stopped"),
    [("parked-one", "model_parked", False), ("nowhere", "model_unplaceable", False), ("demo", "system_stopped", True)],
)
async def test_answers_a_retry_cannot_fix_are_not_retried_by_the_sdk(
        gw: Gateway, model: str, code: str, stopped: bool) -> None:
    if stopped:
        gw.store.submit_nowait(commands.put_setting("serving.stopped", True, at=1.0))
    sent: list[str] = []

    async def count(request: Any) -> None:
        sent.append(request.url.path)

    # The SDK's default: 2 retries of every 5xx, unless the answer says `x-should-retry: false`.
    async with openai.DefaultAsyncHttpxClient(event_hooks={"request": [count]}) as http_client:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY, http_client=http_client, max_retries=2)
        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 503 and caught.value.code == code
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/chat/completions"], "one request at the gateway: no retry"


async def test_retryable_answers_leave_the_sdk_its_own_rule(gw: Gateway) -> None:
    response = await gw.http.post("/v1/chat/completions", json=chat(model="dead"))
    assert_error(response, 502, "upstream_unavailable")
    assert "x-should-retry" not in response.headers


async def test_streaming_forwards_each_chunk_before_the_next_exists(gw: Gateway, nursery: trio.Nursery) -> None:
    """The engine sends its second chunk only once the client has the first: a gateway that buffered
    (a whole answer, or chunks until some size) would never deliver the first, and this would time out."""
    first_seen = trio.Event()
    frames = [b'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n',
              b'data: {"choices":[{"index":0,"delta":{"content":"two"}}]}\n\n', b"data: [DONE]\n\n"]

    async def script(request: Any, reply: Any) -> None:
        await reply.start()
        await reply.chunk(frames[0])
        await first_seen.wait()
        for frame in frames[1:]:
            await reply.chunk(frame)
        await reply.end()

    await _scripted_demo(gw, nursery, script)
    stream = await open_raw(gw, "/v1/chat/completions", chat(stream=True))
    received = b""
    async with stream:
        with trio.fail_after(10):  # a bound on a hang, not a measurement
            while b'"one"' not in received:
                received += await stream.receive_some()
            assert b'"two"' not in received
            first_seen.set()
            while not received.endswith(b"0\r\n\r\n"):
                received += await stream.receive_some()
    assert b'"two"' in received and b"data: [DONE]" in received
    assert re.search(rb"\r\nx-request-id: req-[a-z0-9]{1,24}-[0-9a-f]{16}\r\n", received)


@sdk_stream_warnings
async def test_a_stream_cut_midway_ends_with_an_error_event(gw: Gateway, nursery: trio.Nursery) -> None:
    async def script(request: Any, reply: Any) -> None:
        await reply.start()
        await reply.chunk(b'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n')
        # Then the engine dies: the connection closes with the chunked body unfinished.

    await _scripted_demo(gw, nursery, script)
    with trio.fail_after(10):
        async with gw.http.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as response:
            body = (await response.aread()).decode()
    data = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
    assert json.loads(data[0])["choices"][0]["delta"]["content"] == "one"
    assert json.loads(data[-1])["error"]["code"] == "upstream_error"
    async with openai.DefaultAsyncHttpxClient() as http_client:
        stream = await gw.sdk(http_client).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "x"}], stream=True)
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            async for _ in stream:
                pass
        await stream.close()


async def test_a_replica_that_refuses_connections_leaves_the_rotation_and_its_request_goes_to_another(
        gw: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.gateway")
    live = gw.routes["demo"].endpoints[0]
    refusing = Endpoint("refusing-r2", f"http://127.0.0.1:{_closed_port()}")
    gw.set_route(ModelRoute("demo", "chat", "ready", (refusing, live)))
    for _ in range(4):
        response = await gw.http.post("/v1/chat/completions", json=chat())
        assert response.status_code == 200, response.text  # the refused one was sent to the live replica
    # Tried once, then out of rotation (its fast failures would otherwise make it the least loaded).
    assert caplog.text.count("refusing-r2 of model demo refuses connections") == 1


async def test_past_a_replicas_connections_and_queue_the_answer_is_overloaded_at_once(
        gw: Gateway, autojump_clock: trio.testing.MockClock) -> None:
    gw.store.submit_nowait(commands.put_setting("gateway.upstream_connections_per_replica", 1, at=0.0))
    gw.store.submit_nowait(commands.put_setting("gateway.upstream_queue_per_replica", 1, at=0.0))
    statuses: list[int] = []

    async def slow_call() -> None:  # ~1 s at the slow replica's 5 tokens/s
        statuses.append((await gw.http.post("/v1/chat/completions", json=chat("a b c", model="slow"))).status_code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_call)  # holds the one connection
        nursery.start_soon(slow_call)  # waits in the queue
        with trio.fail_after(5):
            while not statuses and gw.router.statistics().outstanding.get("slow", 0) < 2:
                await trio.sleep(0.01)
        asked = trio.current_time()
        assert_error(await gw.http.post("/v1/chat/completions", json=chat(model="slow")), 503, "overloaded")
        assert trio.current_time() - asked < 0.1  # at once (MockClock): the slow replica's next token is 0.2 s away
        assert statuses == []  # answered while the other two are still in flight
    assert statuses == [200, 200]  # the queued one was served, not refused


def _sse(*docs: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs] + [b"data: [DONE]\n\n"]


USAGE_CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "demo", "choices": [],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
TEXT_CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "demo",
              "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}


async def _usage_engine(request: Any, reply: Any) -> None:
    """Answers a stream as engines do: the usage chunk only when the request asked for it."""
    asked = json.loads(request.body).get("stream_options", {}).get("include_usage") is True
    await reply.start()
    chunks = _sse(TEXT_CHUNK, USAGE_CHUNK) if asked else _sse(TEXT_CHUNK)
    # The usage event split across two writes: the gateway must hold it until it is whole.
    for chunk in chunks:
        await reply.chunk(chunk[:20])
        await reply.chunk(chunk[20:])
    await reply.end()


@pytest.mark.parametrize("client_asks", [False, True])
async def test_every_stream_asks_for_usage_and_the_client_gets_only_what_it_asked_for(
        gw: Gateway, nursery: trio.Nursery, client_asks: bool) -> None:
    engine = await _scripted_demo(gw, nursery, _usage_engine)
    body = chat(stream=True, **({"stream_options": {"include_usage": True}} if client_asks else {}))
    async with gw.http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        text = b"".join([part async for part in response.aiter_bytes()])
    sent = json.loads(engine.requests[0].body)
    assert sent["stream_options"]["include_usage"] is True, "the gateway counts every stream's tokens"
    events = [e for e in text.split(b"\n\n") if e]
    assert events[0] == b"data: " + json.dumps(TEXT_CHUNK).encode() and events[-1] == b"data: [DONE]"
    assert (b'"usage"' in text) == client_asks, text


# --- per-model request limits (issue 9, point 7) -------------------------------------


async def test_a_request_over_the_models_limits_is_refused_before_the_engine(
        gw: Gateway, nursery: trio.Nursery) -> None:
    answer = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "capped", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
    engine = ScriptedEngine(lambda request, reply: reply.whole(200, answer))
    gw.store.submit_nowait(commands.put_model(_model("capped", limits={"max_tokens": 64, "max_n": 2}), at=0.0))
    gw.set_route(ModelRoute("capped", "chat", "ready", (Endpoint("capped-r1", await scripted(nursery, engine)),)))
    post = partial(gw.http.post, "/v1/chat/completions")
    error = assert_error(await post(json=chat(model="capped", max_tokens=65)), 400, "max_tokens_too_large",
                         "max_tokens")
    assert "at most 64" in error["message"]
    assert_error(await post(json=chat(model="capped", max_completion_tokens=1000)), 400, "max_tokens_too_large",
                 "max_completion_tokens")
    assert "at most 2" in assert_error(await post(json=chat(model="capped", n=3)), 400, "n_too_large", "n")["message"]
    assert engine.requests == []
    # At the limits, or with max_tokens left out (the engine's default), the request is served unchanged.
    for body in (chat(model="capped", max_tokens=64, n=2), chat(model="capped")):
        assert (await post(json=body)).status_code == 200
    assert [json.loads(r.body).get("max_tokens") for r in engine.requests] == [64, None]
    assert (await post(json=chat(max_tokens=65, n=3))).status_code == 200  # demo has no limits
