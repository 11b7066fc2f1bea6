"""Every refusal the gateway makes reaches the official `openai` SDK as the exception class the SDK
maps its status to, with the gateway's code, and answers that retrying cannot fix are not retried
(`x-should-retry: false`): against a real `llmgw up`, and against a remote `llmgw gateway` process
beside `llmgw control` and `llmgw agent`; with the sync and the async client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import trio

from e2e_clusters import Target, remote_cluster
from tests.support.processes import UpProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["up", "remote gateway"])
def up(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    root = tmp_path_factory.mktemp("sdk")
    if request.param == "up":
        proc = UpProcess(root / "state").start()
        proc.wait_engines(1)
        creds = proc.credentials
        yield Target(creds["gateway_url"], creds["client_key"], creds["admin_key"], creds["admin_url"])
        proc.kill()
        return
    with remote_cluster(root) as target:
        yield target


def run(up: Target, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "llmgw", *args, "--url", up.admin_url, "--key", up.admin_key],
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


class Counted:
    """The SDK's own HTTP client, counting what it sends (retries included)."""

    def __init__(self) -> None:
        self.sent = 0

    def hook(self, request: httpx.Request) -> None:
        self.sent += 1

    async def ahook(self, request: httpx.Request) -> None:
        self.sent += 1


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Each client a test made is closed when it ends (an unclosed one is a ResourceWarning)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def sdk(up: Target, counted: Counted, key: str | None = None) -> openai.OpenAI:
    creds = up.credentials
    client = openai.OpenAI(base_url=creds["gateway_url"], api_key=key or creds["client_key"], timeout=30,
                           http_client=httpx.Client(event_hooks={"request": [counted.hook]}))  # default retries: 2
    _OPEN.append(client)
    return client


def chat(client: openai.OpenAI, model: str = "demo", **extra: Any) -> Any:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], **extra)


def test_each_refusal_is_the_sdk_exception_for_its_status(up: Target) -> None:
    counted = Counted()
    client = sdk(up, counted)
    cases: list[tuple[type[openai.APIStatusError], str, Any]] = [
        (openai.NotFoundError, "model_not_found", lambda: chat(client, "no-such-model")),
        (openai.BadRequestError, "unknown_parameter", lambda: chat(client, extra_body={"n_keep": 1})),
        (openai.AuthenticationError, "invalid_api_key", lambda: chat(sdk(up, counted, "sk-llmgw-wrong"))),
        # An admin key is never a client key.
        (openai.AuthenticationError, "invalid_api_key", lambda: chat(sdk(up, counted, up.credentials["admin_key"]))),
    ]
    for exception, code, call in cases:
        with pytest.raises(exception) as caught:
            call()
        assert caught.value.code == code, (code, caught.value)
        assert caught.value.response.headers["x-request-id"].startswith("req-")


def test_a_model_that_cannot_fit_fails_at_once_without_retries(up: Target) -> None:
    run(up, "ctl", "model", "serve", "--name", "too-big", "--engine", "vllm", "--source", "hf://org/too-big",
        "--gpus", "8")
    counted = Counted()
    with pytest.raises(openai.InternalServerError) as caught:
        chat(sdk(up, counted), "too-big")
    assert caught.value.status_code == 503 and caught.value.code == "model_unplaceable", caught.value
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert counted.sent == 1, "the SDK honours x-should-retry: false (no retries of a model that cannot fit)"


def test_a_stopped_system_fails_at_once_and_serves_again_after_start(up: Target) -> None:
    run(up, "stop")
    counted = Counted()
    client = sdk(up, counted)
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            chat(client)
        assert caught.value.code == "system_stopped" and counted.sent == 1
    finally:
        run(up, "start")
    for _ in range(60):  # placed again as it asks: ready within the activation window
        try:
            assert chat(client).choices[0].message.content == "sim says: hi"
            break
        except openai.APIStatusError as error:
            assert error.status_code in (503, 504), error
    else:
        raise AssertionError("demo did not serve again after `llmgw start`")


def test_a_key_over_its_rate_is_a_rate_limit_error_with_retry_after(up: Target) -> None:
    created = json.loads(run(up, "ctl", "--json", "keys", "create", "limited", "--rpm", "1"))
    secret = next(v for v in created.values() if isinstance(v, str) and v.startswith("sk-llmgw-"))
    counted = Counted()
    client = sdk(up, counted, secret)
    chat(client)
    with pytest.raises(openai.RateLimitError) as caught:
        chat(client.with_options(max_retries=0))
    assert caught.value.code == "rate_limited" and int(caught.value.response.headers["retry-after"]) >= 1


def test_the_async_client_sees_the_same_classes(up: Target) -> None:
    creds = up.credentials

    async def main() -> None:
        async with openai.AsyncOpenAI(base_url=creds["gateway_url"], api_key=creds["client_key"],
                                      max_retries=0, timeout=30) as client:
            reply = await client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content == "sim says: hi"
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
            vectors = await client.embeddings.create(model="demo-embed", input=["a", "b"])
            assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 0

    trio.run(main)


def test_the_sdk_streams_chat_and_reads_usage_and_embeddings(up: Target) -> None:
    """The official client's happy paths, against `up` and against a remote gateway process alike: a
    stream read chunk by chunk with its usage, a plain stream with no usage field, and embeddings."""
    client = sdk(up, Counted())
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    plain = list(chat(client, stream=True))
    assert plain and all(c.usage is None for c in plain), "usage only when the client asked for it"
    assert "".join(c.choices[0].delta.content or "" for c in plain if c.choices) == text
    vectors = client.embeddings.create(model="demo-embed", input=["a", "b"])
    assert [d.index for d in vectors.data] == [0, 1] and len(vectors.data[0].embedding) > 0
