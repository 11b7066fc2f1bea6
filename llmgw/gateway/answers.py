"""What the gateway reads from an engine's answer and makes of it: the usage tokens (from a whole
body, or a stream's final chunk) and an engine's own error put in OpenAI's shape, its words and status kept.

Engines answer errors in their own shapes: llama.cpp `{"error": {"code": 400, "message", "type"}}`
(older builds `{"code": 400, "message"}`), vLLM OpenAI's shape or `{"object": "error", ...}`,
FastAPI `{"detail": ...}`, a proxy plain text. OpenAI's SDKs read `error.message`, `type`, `param`
and a string (or null) `code`: whatever the engine said, the client gets that shape.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmgw.errors import OpenAIError

__all__ = ["ENGINE_ERROR", "HiddenUsage", "StreamUsage", "asking_usage", "engine_error", "usage_of"]

ENGINE_ERROR = "engine_error"  # the code of an engine's refusal that gave no string code of its own
_DECODER = json.JSONDecoder()
_KEY = b'"usage"'
# Enough of a stream's end to hold its final chunk whole (usage, and llama.cpp's timings after it).
_TAIL = 4096
# An engine's error body is a few hundred bytes; more than this is not an error document.
_ERROR_BYTES = 64 * 1024
_WORDS = 500  # the most of a non-JSON error body passed on as the message


def usage_of(body: bytes) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) of an answer's last `usage` object; None where unknown.

    Reads only from the last `"usage"` key on, so a long answer (embeddings) is not parsed whole."""
    end = len(body)
    while (at := body.rfind(_KEY, 0, end)) >= 0:
        if at == 0 or body[at - 1 : at] != b"\\":  # `\"usage\"` is inside a string: the text, not the key
            return _usage_at(body, at)
        end = at
    return None, None


def _usage_at(body: bytes, at: int) -> tuple[int | None, int | None]:
    rest = body[at + len(_KEY) :].lstrip()
    if not rest.startswith(b":"):
        return None, None
    try:
        value, _ = _DECODER.raw_decode(rest[1:].lstrip().decode("utf-8", "replace"))
    except ValueError:
        return None, None
    if not isinstance(value, dict):
        return None, None
    prompt, completion, total = (_count(value.get(k)) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    if completion is None and prompt is not None and total is not None:
        completion = total - prompt  # embeddings: no completion, and it says so by its total
    return prompt, completion


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class StreamUsage:
    """Keeps a stream's last bytes as they pass, so its final chunk's `usage` can be read at the end.

    The gateway asks every engine for that chunk (`asking_usage`); an engine that sends none leaves
    the tokens unknown (None), never 0."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        self._tail = (self._tail + chunk)[-_TAIL:]

    def tokens(self) -> tuple[int | None, int | None]:
        return usage_of(self._tail)


_JSON_SPACE = b" \t\r\n"
_ASK_USAGE = b',"stream_options":{"include_usage":true}}'


def asking_usage(body: dict[str, Any], raw: bytes) -> tuple[bytes, bool]:
    """The body to send for a stream, and whether its usage chunk is ours to keep back.

    A stream's tokens are known only from the usage chunk the client asks for
    (`stream_options.include_usage`). So that every stream is counted (the request log, per-key
    tokens/min), the gateway asks for it when the client did not, and `HiddenUsage` keeps that
    chunk from the client, who gets the stream it asked for. A body that asks already goes as is.

    A body without `stream_options` (the usual one) gets it added to its bytes, before the object's last
    brace, rather than encoded again: a stream's request is on the way to its first chunk."""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return raw, False
    if body and "stream_options" not in body:
        end = len(raw.rstrip(_JSON_SPACE))
        # One JSON object in UTF-8 (or ASCII) bytes: `{` first and `}` last, spaces aside (UTF-16 or 32 has NULs
        # beside them, a byte-order mark comes first): the option's bytes go in as they are.
        if raw[end - 1 : end] == b"}" and raw.lstrip(_JSON_SPACE)[:1] == b"{":
            return raw[: end - 1] + _ASK_USAGE, True
    options = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps({**body, "stream_options": options}, separators=(",", ":")).encode(), True


_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null(?=\s*[,}])')


class HiddenUsage:
    """Relays a stream's server-sent events whole, less the usage-only chunk (`"choices": []` with a
    `usage`) that the gateway asked for on the client's behalf. An event split across reads is held
    until it is whole (at most one event is ever held); everything else passes as it came."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._rest + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._rest = data
            return b""
        events, self._rest = data[: end + 2], data[end + 2 :]
        if _KEY not in events:
            return events
        # Engines asked for usage also put `"usage": null` in every other chunk (vLLM does); a client
        # that did not ask gets neither, as from OpenAI. (Unescaped quotes: a key, never text inside a string.)
        events = _NULL_USAGE.sub(b"", events)
        if _KEY not in events:
            return events
        return b"".join(e + b"\n\n" for e in events.split(b"\n\n") if e and not _usage_only(e))

    def flush(self) -> bytes:
        rest, self._rest = self._rest, b""
        return rest


def _usage_only(event: bytes) -> bool:
    if not event.startswith(b"data:") or _KEY not in event:
        return False
    try:
        doc = json.loads(event[5:])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("choices") == [] and isinstance(doc.get("usage"), dict)


def engine_error(status: int, body: bytes, where: str) -> OpenAIError:
    """An engine's non-2xx answer as the client gets it: OpenAI's shape, the engine's status and message
    (`where` words it when the engine said nothing usable), its `param` and string `code` when it gave them."""
    doc: Any = None
    if len(body) <= _ERROR_BYTES:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            doc = None
    inner = doc.get("error") if isinstance(doc, dict) else None
    fields = inner if isinstance(inner, dict) else doc if isinstance(doc, dict) else {}
    message = fields.get("message") or (inner if isinstance(inner, str) else None) or fields.get("detail")
    if not isinstance(message, str) or not message:
        text = body[:_WORDS].decode("utf-8", "replace").strip() if doc is None else ""
        message = f"{where} answered {status}" + (f": {text}" if text else "")
    code = fields.get("code")
    param = fields.get("param")
    return OpenAIError(
        status,
        code if isinstance(code, str) and code else ENGINE_ERROR,
        message,
        param=param if isinstance(param, str) else None,
    )
