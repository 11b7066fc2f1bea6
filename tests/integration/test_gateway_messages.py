"""`/v1/messages` (issue 23, point 2) through the whole gateway, driven by the official `anthropic` Python SDK
(its sync client, in a thread) in front of sim engines on loopback: answers whole and streamed, stop
sequences, usage in the request log and against a key's limits, guard policies on prompts and answers, and
refusals raised as the SDK's own exceptions."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anthropic
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
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine, serving
from tests.support.requestlog import record_of

KEY = "sk-test-messages"
LIMITED = "sk-test-messages-limited"  # 60 tokens a minute
ADMIN_KEY = "sk-test-admin"
T = TypeVar("T")


@dataclass
class Setup:
    url: str
    store: MemoryStore
    http: httpx.AsyncClient  # the admin's, for the request log
    demo: sim.SimApp
    clients: list[anthropic.Anthropic] = dataclasses.field(default_factory=list)  # closed when the test ends

    def client(self, key: str = KEY) -> anthropic.Anthropic:
        made = anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0)
        self.clients.append(made)
        return made

    def policy(self, check: str) -> None:
        self.store.submit_nowait(set_policy(GuardPolicy(name="strict", judge="lg", check=check, models=("demo",)),
                                            at=0.0))

    async def record(self, request_id: str) -> dict[str, Any]:
        with trio.fail_after(10):
            return await record_of(self.http, request_id, ADMIN_KEY)


async def sdk(call: Callable[[], T]) -> T:
    """A call of the SDK's sync client, off the event loop the gateway runs on."""
    return await trio.to_thread.run_sync(call)


async def _breaks(request: Request, reply: Reply) -> None:
    """A replica whose stream breaks off after its first words (its connection closed mid-answer)."""
    await reply.start()
    await reply.chunk(b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
                      b'"delta":{"role":"assistant","content":"one"},"finish_reason":null}]}\n\n')


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Setup]:
    store = MemoryStore()
    for name, role in (("demo", "chat"), ("lg", "guard"), ("breaks", "chat")):
        store.submit_nowait(commands.put_model(ModelDef.from_doc(
            {"name": name, "engine": "sim", "source": f"sim://{name}", "role": role}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(LIMITED), "limited", "client", 0.0, tokens_per_min=60))
    store.submit_nowait(commands.add_key(hash_key(ADMIN_KEY), "ops", "admin", 0.0))
    apps = {"demo": sim.make_app(sim.SimOptions("127.0.0.1", 0, "demo")),
            "lg": sim.make_app(sim.SimOptions("127.0.0.1", 0, "lg", "guard", unsafe=(("bomb", "S9"),
                                                                                     ("lawyer", "S6"))))}
    routes = {}
    for name, app in apps.items():
        url = await nursery.start(partial(sim.serve, app.opts, app=app))
        routes[name] = ModelRoute(name, app.opts.role, "ready", (Endpoint(f"{name}-r1", url),))
    routes["breaks"] = ModelRoute("breaks", "chat", "ready",
                                  (Endpoint("breaks-r1", await serving(nursery, ScriptedEngine(_breaks))),))
    router = Router()
    router.update_routes(routes)
    log = RequestLog(tmp_path / "requests", "gw1", timeouts=dataclasses.replace(TIMEOUTS, requestlog_flush_s=0.02))
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                requestlog=log)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
        setup = Setup(f"http://{host}:{port}", store, http, apps["demo"])
        try:
            yield setup
        finally:
            for client in setup.clients:  # their kept-alive sockets, not left to the collector (a ResourceWarning)
                client.close()


HELLO = [{"role": "user", "content": "hello there"}]


async def test_the_sdk_gets_a_message_and_the_request_log_counts_it(gw: Setup) -> None:
    client = gw.client()
    raw = await sdk(lambda: client.messages.with_raw_response.create(
        model="demo", max_tokens=64, system="Be brief.", messages=HELLO,
        extra_headers={"anthropic-version": "2023-06-01", "anthropic-beta": "some-beta-2025"}))
    message = raw.parse()
    assert isinstance(message, anthropic.types.Message) and message.id.startswith("msg_")
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", "sim says: hello there")]
    assert (message.model, message.role, message.stop_reason, message.stop_sequence) == ("demo", "assistant",
                                                                                          "end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 4)  # the system prompt's words too
    record = await gw.record(raw.headers["x-request-id"])
    assert message._request_id == raw.headers["x-request-id"]  # the SDK's own header, `request-id`
    assert (record["endpoint"], record["model"], record["status"]) == ("/v1/messages", "demo", 200)
    assert (record["tokens_in"], record["tokens_out"]) == (4, 4)


async def test_stop_sequences_and_max_tokens_say_why_the_answer_stopped(gw: Setup) -> None:
    client = gw.client()
    stopped = await sdk(lambda: client.messages.create(model="demo", max_tokens=64, messages=HELLO,
                                                       stop_sequences=["nothing", "there"]))
    assert stopped.content[0].type == "text" and stopped.content[0].text == "sim says: hello "
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "there")
    cut = await sdk(lambda: client.messages.create(model="demo", max_tokens=2, messages=HELLO,
                                                   extra_body={"temperature": 0.2, "top_p": 0.9}))
    assert (cut.content[0].type, cut.stop_reason, cut.usage.output_tokens) == ("text", "max_tokens", 2)


async def test_the_sdks_stream_helper_and_raw_events(gw: Setup) -> None:
    client = gw.client()

    def helper() -> tuple[str, anthropic.types.Message]:
        with client.messages.stream(model="demo", max_tokens=64, system=[{"type": "text", "text": "Be brief."}],
                                    messages=HELLO, stop_sequences=["there"]) as stream:
            return "".join(stream.text_stream), stream.get_final_message()

    text, final = await sdk(helper)
    assert text == "sim says: hello " and final.content[0].type == "text" and final.content[0].text == text
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "there")
    assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 4)  # from the last message_delta

    def raw() -> list[Any]:
        with client.messages.create(model="demo", max_tokens=64, messages=HELLO, stream=True) as stream:
            return list(stream)

    events = await sdk(raw)
    assert [e.type for e in events] == ["message_start", "content_block_start", *["content_block_delta"] * 4,
                                        "content_block_stop", "message_delta", "message_stop"]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "sim says: hello there"
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == 4


async def test_a_stream_that_breaks_off_ends_in_an_error_event_the_sdk_raises(gw: Setup) -> None:
    client = gw.client()
    got: list[str] = []

    def streamed() -> None:
        with client.messages.stream(model="breaks", max_tokens=64, messages=HELLO) as stream:
            for text in stream.text_stream:
                got.append(text)

    with pytest.raises(anthropic.APIStatusError) as broke:
        await sdk(streamed)
    assert got == ["one"] and broke.value.error_code == "upstream_error" and broke.value.type == "api_error"


async def test_refusals_are_the_sdks_exceptions_with_llmgws_code(gw: Setup) -> None:
    with pytest.raises(anthropic.AuthenticationError) as bad_key:
        await sdk(lambda: gw.client("sk-wrong").messages.create(model="demo", max_tokens=8, messages=HELLO))
    assert bad_key.value.error_code == "invalid_api_key" and bad_key.value.type == "authentication_error"
    assert bad_key.value.request_id and bad_key.value.request_id.startswith("req")
    client = gw.client()
    with pytest.raises(anthropic.NotFoundError) as unknown:
        await sdk(lambda: client.messages.create(model="no-such-model", max_tokens=8, messages=HELLO))
    assert unknown.value.error_code == "model_not_found" and unknown.value.type == "not_found_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        await sdk(lambda: client.messages.create(model="demo", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "text", "text": "see"}, image]}]))  # type: ignore[list-item]
    assert refused.value.error_code == "unsupported_parameter" and "messages[0].content[1].type" in str(refused.value)
    # max_tokens is required, as Anthropic's API has it (the SDK would not send a request without it)
    answer = await gw.http.post("/v1/messages", headers={"x-api-key": KEY},
                                json={"model": "demo", "messages": HELLO})
    assert answer.status_code == 400 and answer.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "'max_tokens' is required",
        "details": {"error_code": "missing_required_parameter"}}}
    assert gw.demo.generated == 0


async def test_a_keys_tokens_per_minute_count_messages_streamed_or_not(gw: Setup) -> None:
    client = gw.client(LIMITED)
    words = [{"role": "user", "content": " ".join(["word"] * 40)}]

    def streamed() -> None:
        with client.messages.stream(model="demo", max_tokens=64, messages=words) as stream:
            stream.until_done()

    await sdk(streamed)  # 40 words in, 42 out: over the key's minute
    with pytest.raises(anthropic.RateLimitError) as limited:
        await sdk(lambda: client.messages.create(model="demo", max_tokens=8, messages=HELLO))
    assert limited.value.error_code == "rate_limited" and limited.value.type == "rate_limit_error"


@pytest.mark.parametrize("check", ["prompt", "response"])
async def test_a_guard_policy_refuses_on_messages_whole_and_streamed(gw: Setup, check: str) -> None:
    gw.policy(check)
    client = gw.client()
    # the sim echoes the prompt: an unsafe prompt gives an unsafe answer, judged under either check
    unsafe = [{"role": "user", "content": "ask a lawyer"}]
    with pytest.raises(anthropic.BadRequestError) as whole:
        await sdk(lambda: client.messages.create(model="demo", max_tokens=64, messages=unsafe))
    assert whole.value.error_code == "guard_refused" and "judge: S6,Specialized Advice" in str(whole.value)

    def streamed() -> None:
        with client.messages.stream(model="demo", max_tokens=64, messages=unsafe) as stream:
            stream.until_done()

    with pytest.raises(anthropic.BadRequestError) as held:
        await sdk(streamed)
    assert held.value.error_code == "guard_refused"
    assert gw.demo.generated == (0 if check == "prompt" else 2)
    safe = await sdk(lambda: client.messages.create(model="demo", max_tokens=64, messages=HELLO))
    assert safe.content[0].type == "text" and safe.content[0].text == "sim says: hello there"
