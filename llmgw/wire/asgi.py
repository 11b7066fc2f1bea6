"""What our ASGI servers share: the raw `/v1` apps' plumbing (the gateway, the simulator) and
the hypercorn config every listener (those two and the admin API) is built from.

The plumbing speaks OpenAI's error shape: both raw apps serve `/v1`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import trio
from hypercorn.config import Config

from llmgw.errors import OpenAIError
from llmgw.net import url_host

__all__ = [
    "MAX_BODY_BYTES",
    "WATCH",
    "Exchange",
    "cancel_on_disconnect",
    "cancelled_on_disconnect",
    "dumps",
    "hypercorn_config",
    "lifespan",
    "parse_object",
    "read_body",
    "send_json",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# The largest `/v1` request body: far above any prompt, far below what would hurt memory.
MAX_BODY_BYTES = 8 * 1024 * 1024
# The scope's extension (`scope["extensions"]`) by which our own server (llmgw/wire/front.py) watches for a client
# going away without a task of the app's: `watch(on_gone)` -> bool (False: not watched), `watch(None)` to stop.
WATCH = "llmgw.watch"
_JSON = (b"content-type", b"application/json")


class Exchange:
    """How far one request got: its body read to the end, its last answer message sent, its client gone."""

    __slots__ = ("body_done", "finished", "disconnected")

    def __init__(self) -> None:
        self.body_done = False
        self.finished = False
        self.disconnected = False


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer the server's lifespan events; neither app has start-up work of its own."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class RawApp:
    """A raw ASGI app: each HTTP request to `_http`, the server's lifespan answered, other scopes ignored."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


async def read_body(scope: Scope, receive: Receive, ex: Exchange, cap: int = MAX_BODY_BYTES) -> bytes:
    """The whole request body; refuses (413) one over `cap` bytes, announced or sent.

    Keeps `ex.body_done` and `ex.disconnected` up to date, so a refusal knows
    whether the rest of the body is still to be read.
    """
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > cap:
            raise _too_large(cap)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ex.body_done = ex.disconnected = True
            raise OpenAIError(400, "invalid_request", "client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        ex.body_done = not message.get("more_body", False)
        size += len(chunk)
        if size > cap:
            raise _too_large(cap)
        chunks.append(chunk)
        if ex.body_done:
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(cap: int) -> OpenAIError:
    return OpenAIError(413, "request_too_large", f"the request body is larger than {cap} bytes")


def _not_json(word: str) -> Any:
    # Python reads NaN and Infinity, which are not JSON; an engine would choke on them (or worse).
    raise ValueError(f"{word} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_not_json)  # one, not one per request (as json.loads with an argument)


def parse_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object: standard JSON only, nested as deep as the parser's
    own stack allows (a deeper one, say 100,000 `[`, is refused, not a `RecursionError` and a 500)."""
    try:
        # What json.loads does with bytes: UTF-8, 16 or 32 by the first bytes, a UTF-8 byte-order mark skipped.
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, UnicodeDecodeError):
        raise OpenAIError(400, "invalid_json", "the request body is not valid JSON") from None
    except RecursionError:
        raise OpenAIError(400, "invalid_json", "the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "invalid_json", "the request body must be a JSON object")
    return body


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, as every `/v1` answer and stream frame is sent."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


async def send_json(send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Answer with a whole JSON body (already encoded) and `headers` beyond type and length."""
    head = [_JSON, (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def cancel_on_disconnect(receive: Receive, scope: trio.CancelScope, ex: Exchange) -> None:
    """Cancel `scope` when the client goes away before the answer's last message."""
    while (await receive())["type"] != "http.disconnect":
        pass
    # The server also reports the end of a completed exchange as a disconnect.
    if not ex.finished:
        ex.disconnected = True
        scope.cancel()


class cancelled_on_disconnect:  # noqa: N801 (used as `async with cancelled_on_disconnect(...)`, like trio's own)
    """A cancel scope that the client going away before the answer's last message cancels (`ex.disconnected`
    set); the request's body read first. Our server watches for it itself (`WATCH`); under another, a task of the
    block's reads `receive` (`cancel_on_disconnect`). A class rather than a generator: it is entered on every
    request's way to the engine, where a generator's frames cost more than the rest of it."""

    __slots__ = ("_scope", "_receive", "_ex", "_watch", "_cancel", "_nursery")

    def __init__(self, scope: Scope, receive: Receive, ex: Exchange) -> None:
        self._scope, self._receive, self._ex = scope, receive, ex
        self._watch: Callable[[Callable[[], None] | None], bool] | None = None
        self._cancel = trio.CancelScope()
        self._nursery: Any = None  # trio.open_nursery()'s manager, under another server

    def _gone(self) -> None:
        if not self._ex.finished:
            self._ex.disconnected = True
            self._cancel.cancel()

    async def __aenter__(self) -> trio.CancelScope:
        extensions = self._scope.get("extensions")
        watch = extensions.get(WATCH) if extensions else None
        if watch is not None and watch(self._gone):
            self._watch = watch
            return self._cancel.__enter__()
        self._nursery = trio.open_nursery()
        nursery: trio.Nursery = await self._nursery.__aenter__()
        nursery.start_soon(cancel_on_disconnect, self._receive, nursery.cancel_scope, self._ex)
        self._cancel = nursery.cancel_scope
        return nursery.cancel_scope

    async def __aexit__(self, *exc: Any) -> bool | None:
        if self._watch is not None:
            try:
                # (its Cancelled, the client gone, ends here: the block's exception, not this one's)
                return self._cancel.__exit__(*exc)
            finally:
                self._watch(None)
        self._cancel.cancel()  # the block is done: the task that reads for a disconnect ends too
        return bool(await self._nursery.__aexit__(*exc))


def hypercorn_config(
    host: str,
    port: int,
    *,
    logger: str,
    graceful_s: float,
    keep_alive_s: float,
    server_header: bool = True,
) -> Config:
    """A listener on host:port (`::1` bracketed) whose error lines go to our `logger`, with no access log."""
    config = Config()
    config.bind = [f"{url_host(host)}:{port}"]
    config.keep_alive_timeout = keep_alive_s
    # Hypercorn's default backlog (100) drops the SYNs of a burst of new clients (1,000 connecting at
    # once retry after 1 s, 3 s, ...: client timeouts); the kernel caps this at net.core.somaxconn.
    config.backlog = 2048
    config.graceful_timeout = graceful_s
    # A TLS handshake that never ends holds its descriptor no longer than an idle connection (hypercorn's
    # default: 60 s). A head over h11_max_incomplete_size (16 KiB) is refused; one that never ends is
    # closed at keep_alive_s (hypercorn's idle timer runs until a whole head is in).
    config.ssl_handshake_timeout = keep_alive_s
    # Hypercorn has no response timeout and read_timeout stays None, so long streams are never cut.
    config.read_timeout = None
    # A Logger object (not "-") so hypercorn adds no handler of its own and lines reach ours.
    config.errorlog = logging.getLogger(logger)
    config.accesslog = None
    config.include_server_header = server_header
    return config
