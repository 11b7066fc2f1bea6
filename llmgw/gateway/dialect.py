"""Other APIs served over the engines' chat completions: a `Dialect` per path (OpenAI's Responses, Anthropic's
Messages) turns its request into a chat completion body, and a `Translation` of that one request turns the
engine's answer back, whole or event by event, and words every refusal in the dialect's error shape.

The rest of the request path is the chat path unchanged: the key, limits, the guard (its checks read the
chat body, and a held answer is judged in chat shape before it is translated), affinity, the request log
(under the client's path), usage (read from the chat answer before translation) and metrics.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import trio

from llmgw.domain.observed import Endpoint
from llmgw.errors import OpenAIError
from llmgw.gateway import upstream
from llmgw.gateway.answers import StreamUsage, engine_error, usage_of
from llmgw.wire.asgi import Send, dumps

__all__ = ["CHAT_PATH", "Dialect", "Translation", "relay_translated"]

_log = logging.getLogger("llmgw.gateway.app")

CHAT_PATH = "/v1/chat/completions"  # what a translated request is sent to
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class Translation(ABC):
    """One request of a dialect: `chat` is the body sent to the engine; the methods turn its answer back."""

    def __init__(self, chat: dict[str, Any]) -> None:
        self.chat = chat

    @abstractmethod
    def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        """The dialect's answer for the engine's whole chat completion `answer`."""
        ...

    @abstractmethod
    def event(self, chunk: dict[str, Any]) -> bytes:
        """The dialect's server-sent events (b"" for none) for one chat completion chunk of the engine's stream
        (the usage-only chunk, `choices: []`, included: the gateway always asks for it)."""
        ...

    @abstractmethod
    def end(self) -> bytes:
        """The events that close the dialect's stream, once the engine's has ended."""
        ...

    @abstractmethod
    def failed(self, error: OpenAIError) -> bytes:
        """The event that tells the client its stream broke off (`error`), as the dialect's SDKs read it."""
        ...


class Dialect(ABC):
    """An API served by translation: its path, its requests' translation, and its error shape."""

    path: ClassVar[str]

    @abstractmethod
    def start(self, body: dict[str, Any]) -> Translation:
        """The translation of one request; a refusal (400) names the dialect's field, not the chat field."""
        ...

    def error_doc(self, error: OpenAIError) -> dict[str, Any]:
        """The body of a refusal, in the dialect's shape (the status and headers are the error's)."""
        return error.doc()

    def headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        """Headers of every answer beside `x-request-id`, as the dialect's SDKs read them."""
        return []


class _Events:
    """Splits the engine's server-sent events across reads: `feed` returns the whole events' data fields."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._rest + chunk
        held = b"\r" if data.endswith(b"\r") else b""  # a CRLF cut between reads: its LF comes next
        data = (data[:-1] if held else data).replace(b"\r\n", b"\n")
        end = data.rfind(b"\n\n")
        if end < 0:
            self._rest = data + held
            return []
        events, self._rest = data[: end + 2], data[end + 2 :] + held
        found = []
        for event in events.split(b"\n\n"):
            lines = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                found.append(b"\n".join(lines))
        return found


async def relay_translated(ex: Any, translation: Translation, response: upstream.Response, endpoint: Endpoint,
                           stream: bool, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
    """`relay` for a translated request (ex: its `Progress`): the engine's chat answer, whole or streamed,
    sent on in the dialect's shape; the usage is read from the chat answer for the log and the key's limits."""
    headers = [*headers, *ex.dialect.headers(ex.request_id)]
    if not stream or response.status >= 400:
        try:
            body = await response.read()
        except upstream.UpstreamFailed as error:
            raise upstream.failure(endpoint, ex.model, error) from None
        if response.status >= 400:
            raise engine_error(response.status, body, f"replica {endpoint.replica_id}")
        ex.tokens_in, ex.tokens_out = usage_of(body)
        try:
            answer = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            raise OpenAIError(502, "upstream_error", f"replica {endpoint.replica_id} answered what is not a chat "
                                                     "completion")
        out = dumps(translation.whole(answer))
        headers = [*_json_headers(headers), (b"content-length", str(len(out)).encode())]
        ex.started, ex.status = True, response.status
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        ex.finished = True
        await send({"type": "http.response.body", "body": out, "more_body": False})
        return
    ex.started, ex.status = True, response.status
    await send({"type": "http.response.start", "status": response.status,
                "headers": [*_json_headers(headers, SSE_HEADERS)]})
    usage = StreamUsage()
    events = _Events()
    # As `relay`: the engine's last events, when its end came with them, go out with the stream's end in one write
    # (once the head is out with something of the stream: a stream's answer stays chunked).
    last = b""
    sent = False
    while True:
        try:
            chunk = await response.next_chunk()
            if chunk is None:
                break
            if ex.ttft is None:
                ex.ttft = trio.current_time()
            usage.feed(chunk)
            out = b""
            for data in events.feed(chunk):
                if data == b"[DONE]":
                    continue
                doc = json.loads(data)
                if isinstance(doc, dict) and isinstance(doc.get("error"), dict):  # the engine failed mid-stream
                    raise engine_error(502, data, f"replica {endpoint.replica_id}")
                if isinstance(doc, dict):
                    out += translation.event(doc)
        except Exception as error:
            if isinstance(error, upstream.UpstreamFailed):
                err = upstream.failure(endpoint, ex.model, error, mid_stream=True)
            elif isinstance(error, OpenAIError):
                err = error
            else:
                _log.exception("translating replica %s's stream of model %s failed", endpoint.replica_id, ex.model)
                err = OpenAIError(502, "upstream_error", f"replica {endpoint.replica_id} failed mid-stream")
            ex.error = err.code or ""
            await send({"type": "http.response.body", "body": translation.failed(err), "more_body": True})
            break
        if out:
            if sent and response.at_end():
                response.close(keep=True)
                last = out
                break
            sent = True
            await send({"type": "http.response.body", "body": out, "more_body": True})
    end = last + translation.end() if not ex.error else last
    if not sent and end:
        await send({"type": "http.response.body", "body": end, "more_body": True})
        end = b""
    ex.tokens_in, ex.tokens_out = usage.tokens()
    ex.finished = True
    await send({"type": "http.response.body", "body": end, "more_body": False})


def _json_headers(headers: list[tuple[bytes, bytes]],
                  content: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
    """The relayed headers less the engine's content type (the dialect's answer has its own)."""
    kept = [(k, v) for k, v in headers if k not in (b"content-type", b"cache-control")]
    return [*kept, *(content or [(b"content-type", b"application/json")])]


def sse(event: str, doc: dict[str, Any]) -> bytes:
    """One server-sent event with a name (both Responses and Messages name their events)."""
    return b"event: " + event.encode() + b"\ndata: " + dumps(doc) + b"\n\n"
