"""The gateway's answer to a client, relayed from an engine's: a whole body, or a stream chunk for chunk
(read, then send: the engine is read no faster than the client takes it), and one request's `Progress`.

Split from app.py: the app decides who answers; this module carries the answer across and says what it
was (status, tokens, time to first token) for the request log.
"""

from __future__ import annotations

import logging

import trio

from llmgw.domain.observed import Endpoint
from llmgw.domain.state import ApiKey
from llmgw.errors import OpenAIError
from llmgw.gateway import upstream
from llmgw.gateway.answers import HiddenUsage, StreamUsage, engine_error, usage_of
from llmgw.gateway.dialect import Dialect, Translation, relay_translated
from llmgw.gateway.guard import Checks
from llmgw.gateway.normalise import KINDS, Fill, StreamNormaliser, normalise_body
from llmgw.gateway.pool import Ticket
from llmgw.wire.asgi import Exchange, Send, dumps

__all__ = ["Progress", "relay", "response_headers"]

_log = logging.getLogger("llmgw.gateway.app")  # the app's lines: one logger for the request path

# Hop-by-hop (RFC 9110 §7.6.1) plus what this server sets itself.
_DROP_UPSTREAM = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"date",
        b"server",
        b"content-length",
        b"x-request-id",
    }
)


class Progress(Exchange):
    """One request's progress: what its log line reports and how far its answer got."""

    __slots__ = ("request_id", "model", "replica", "status", "started", "tokens_in", "tokens_out", "key",
                 "node", "error", "ttft", "guard_rule", "guard", "served", "ticket", "dialect", "translation")  # from `node`: for the request log

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id
        self.model = "-"  # the name asked for: a model or an alias
        self.served = ""  # the model that serves it: the one asked for, an alias's, or a fallback ("": none yet)
        self.replica = "-"
        self.status = 0
        self.started = False
        self.node = self.error = ""
        self.ttft: float | None = None  # trio time of the first streamed chunk
        # From the engine's `usage` (answers.py); None: not known (no usage chunk asked for, a failure).
        self.tokens_in: int | None = None
        self.tokens_out: int | None = None
        self.key: ApiKey | None = None  # the client key admitted (auth.py); None until then
        self.guard_rule = ""  # the judges' verdicts (gateway/guard.py); "" when no policy applied
        self.guard: Checks | None = None  # this request's guard checks; None: none apply
        self.ticket: Ticket | None = None  # its key and priority class, and its wait for a slot (pool.py)
        self.dialect: Dialect | None = None  # another API's path served over chat completions (dialect.py)
        self.translation: Translation | None = None  # that request, translated (once its body is read)


async def relay(ex: Progress, response: upstream.Response, endpoint: Endpoint, stream: bool, send: Send,
                hide_usage: bool, kind: str = "") -> None:
    """Send the engine's answer on: whole (with its usage read for the log) or streamed, a failure mid-stream
    told in the stream; `hide_usage`: the usage chunk the gateway asked for on the client's behalf is kept back;
    `kind` (checks.POST_PATHS): the endpoint, whose answers are completed to OpenAI's schemas (normalise.py)."""
    fill = Fill(ex.served or ex.model, ex.request_id) if kind in KINDS else None
    try:
        headers = response_headers(response.headers, ex.request_id)
        headers.append((b"x-llmgw-model", ex.served.encode()))  # which model served (an alias's, a fallback)
        if ex.translation is not None:  # another API's answer, made from the chat completion
            await relay_translated(ex, ex.translation, response, endpoint, stream, send, headers)
            return
        if not stream or response.status >= 400:
            try:
                body = await response.read()
            except upstream.UpstreamFailed as error:
                raise upstream.failure(endpoint, ex.model, error) from None
            if response.status >= 400:  # the engine's own refusal, in OpenAI's shape
                raise engine_error(response.status, body, f"replica {endpoint.replica_id}")
            ex.tokens_in, ex.tokens_out = usage_of(body)  # as the engine told them: before any is filled in
            if fill is not None:
                body = normalise_body(kind, body, fill)
            headers.append((b"content-length", str(len(body)).encode()))
            ex.started = True
            ex.status = response.status
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            ex.finished = True
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        ex.started = True
        ex.status = response.status
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        usage = StreamUsage()
        hidden = HiddenUsage() if hide_usage else None
        normaliser = StreamNormaliser(kind, fill) if fill is not None else None
        # Read, then send: the engine is read no faster than the client takes the answer (no buffer). The
        # engine's last bytes, when its end came with them, go out with the answer's end: one write, not two
        # (but never the first: a stream's answer is chunked, not one whole body with a length).
        last = b""
        first = True
        while True:
            try:
                chunk = await response.next_chunk()
                if chunk is None:
                    break
                if ex.ttft is None:
                    ex.ttft = trio.current_time()
                usage.feed(chunk)
            except Exception as error:
                # The status is already sent: say so in the stream, where OpenAI's SDKs look for it, and end
                # it (a stream left open, or cut without its last chunk, is a client's hang or a protocol error).
                if isinstance(error, upstream.UpstreamFailed):
                    err = upstream.failure(endpoint, ex.model, error, mid_stream=True)
                else:
                    _log.exception("relaying replica %s of model %s failed mid-stream", endpoint.replica_id,
                                   ex.model)
                    err = OpenAIError(502, "upstream_error", f"replica {endpoint.replica_id} failed mid-stream")
                ex.error = err.code or ""
                await send({"type": "http.response.body", "body": b"data: " + dumps(err.doc()) + b"\n\n",
                            "more_body": True})
                break
            if hidden is not None:
                chunk = hidden.feed(chunk)
            if normaliser is not None and chunk:
                chunk = normaliser.feed(chunk)
            if not chunk:
                continue
            if not first and response.at_end():
                response.close(keep=True)
                last = chunk
                break
            first = False
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        rest = hidden.flush() if hidden is not None else b""
        if normaliser is not None:
            rest = normaliser.feed(rest) + normaliser.flush() if rest else normaliser.flush()
        ex.tokens_in, ex.tokens_out = usage.tokens()
        ex.finished = True
        await send({"type": "http.response.body", "body": last + rest if rest else last, "more_body": False})
    finally:
        response.close()


def response_headers(raw: list[tuple[bytes, bytes]], request_id: str) -> list[tuple[bytes, bytes]]:
    named: set[bytes] = set()
    for name, value in raw:
        if name.lower() == b"connection":
            # Headers the upstream declared hop-by-hop for this connection only.
            named.update(v.strip().lower() for v in value.split(b","))
    headers = [
        (lower, value)
        for name, value in raw
        if (lower := name.lower()) not in _DROP_UPSTREAM and lower not in named
    ]
    headers.append((b"x-request-id", request_id.encode()))
    return headers
