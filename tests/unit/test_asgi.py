"""What the raw `/v1` apps and every hypercorn listener share: the body reader and the server config."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from llmgw.errors import OpenAIError
from llmgw.wire.asgi import MAX_BODY_BYTES, Exchange, dumps, hypercorn_config, parse_object, read_body


def receiver(*messages: dict[str, Any]) -> tuple[Callable[[], Awaitable[dict[str, Any]]], list[int]]:
    """An ASGI `receive` that plays `messages` and counts how many were taken."""
    taken = [0]

    async def receive() -> dict[str, Any]:
        message = messages[taken[0]]
        taken[0] += 1
        return message

    return receive, taken


def chunk(body: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": list(headers)}


async def test_reads_a_body_sent_in_pieces() -> None:
    receive, _ = receiver(chunk(b'{"a":'), chunk(b" 1}", more=False))
    ex = Exchange()
    assert await read_body(scope(), receive, ex, cap=100) == b'{"a": 1}'
    assert ex.body_done and not ex.disconnected


async def test_a_body_of_exactly_the_cap_is_read() -> None:
    receive, _ = receiver(chunk(b"x" * 10, more=False))
    assert await read_body(scope(), receive, Exchange(), cap=10) == b"x" * 10


async def test_an_announced_length_over_the_cap_is_refused_before_reading() -> None:
    receive, taken = receiver(chunk(b"x" * 11, more=False))
    ex = Exchange()
    with pytest.raises(OpenAIError) as caught:
        await read_body(scope((b"content-length", b"11")), receive, ex, cap=10)
    assert caught.value.status == 413 and caught.value.code == "request_too_large"
    assert caught.value.message == "the request body is larger than 10 bytes"
    assert taken[0] == 0 and not ex.body_done  # the unread body is still to be discarded


async def test_a_streamed_body_over_the_cap_stops_being_read() -> None:
    receive, taken = receiver(*[chunk(b"x" * 4)] * 10)
    ex = Exchange()
    with pytest.raises(OpenAIError) as caught:
        await read_body(scope(), receive, ex, cap=10)
    assert caught.value.status == 413
    assert taken[0] == 3 and not ex.body_done


async def test_a_last_piece_over_the_cap_leaves_nothing_to_discard() -> None:
    receive, _ = receiver(chunk(b"x" * 8), chunk(b"x" * 8, more=False))
    ex = Exchange()
    with pytest.raises(OpenAIError):
        await read_body(scope(), receive, ex, cap=10)
    assert ex.body_done  # waiting for more would wait for a disconnect


async def test_the_default_cap_is_8_mib() -> None:
    receive, _ = receiver(chunk(b"", more=False))
    assert MAX_BODY_BYTES == 8 * 1024 * 1024
    with pytest.raises(OpenAIError):
        await read_body(scope((b"content-length", str(MAX_BODY_BYTES + 1).encode())), receive, Exchange())


async def test_a_client_that_leaves_mid_body_is_marked_gone() -> None:
    receive, _ = receiver(chunk(b"{"), {"type": "http.disconnect"})
    ex = Exchange()
    with pytest.raises(OpenAIError) as caught:
        await read_body(scope(), receive, ex)
    assert caught.value.status == 400 and ex.disconnected and ex.body_done


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"[1, 2]", b""])
def test_parse_object_refuses_what_is_not_one_json_object(raw: bytes) -> None:
    with pytest.raises(OpenAIError) as caught:
        parse_object(raw)
    assert caught.value.code == "invalid_json"


def test_dumps_is_compact_utf8() -> None:
    assert dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert json.loads(dumps({"x": None})) == {"x": None}


@pytest.mark.parametrize(
    ("host", "bind"), [("::1", "[::1]:8080"), ("127.0.0.1", "127.0.0.1:8080"), ("::", "[::]:8080")]
)
def test_hypercorn_config_brackets_ipv6(host: str, bind: str) -> None:
    assert hypercorn_config(host, 8080, logger="llmgw.test", graceful_s=1.0, keep_alive_s=5.0).bind == [bind]


def test_hypercorn_config_sets_the_knobs_and_logs_through_ours() -> None:
    config = hypercorn_config(
        "127.0.0.1", 0, logger="llmgw.test.server", graceful_s=0.5, keep_alive_s=75.0, server_header=False
    )
    assert config.graceful_timeout == 0.5 and config.keep_alive_timeout == 75.0
    assert config.read_timeout is None  # long streams are never cut
    assert config.include_server_header is False
    assert config.errorlog is logging.getLogger("llmgw.test.server") and config.accesslog is None


async def test_a_server_built_from_it_listens_on_ipv6_loopback() -> None:
    from hypercorn.trio import serve

    from llmgw.wire.asgi import lifespan

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)

    try:
        with trio.socket.socket(trio.socket.AF_INET6) as probe:
            await probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, hypercorn_config("::1", 0, logger="llmgw.test", graceful_s=0.1, keep_alive_s=5.0))
        assert binds[0].startswith("http://[::1]:")
        nursery.cancel_scope.cancel()
