"""Engine answers made to OpenAI's published schemas (docs/api.md "What the gateway adds to answers").

Engines leave out fields that OpenAI's schemas require: llama.cpp answers a chat without `choices[].logprobs`
and `message.refusal`, and its logprobs without `refusal`; OpenAI's SDKs and strict clients (typed
decoders generated from the schemas) read them. The gateway adds what a schema requires and the engine
left out: null where the schema allows it, else the schema's empty value (an empty list, 0 tokens) or
what the gateway knows (`object`, the served model, the request's id, the time). It never changes a value
the engine gave, with one exception: a null where the schema takes no null (vLLM's
`"system_fingerprint": null`) is left out, as if the engine had not sent it. Fields the schemas do not
name (llama.cpp's `timings`, vLLM's `stop_reason`) stay: the answer schemas allow more properties.

What it costs (tests/bench/normalise.py): a stream's chunks and an embeddings answer are read from their
bytes first (`complete`: counts of keys, no parse; an embeddings answer less its vectors), and relayed as
they came when they lack nothing. A whole chat or completion answer is parsed instead (json's C parser
reads it faster than 20 scans of its bytes) and written again only when something was added. The
`normalise_*` functions take a parsed document (the Responses and Messages translations call them on a
chat answer before translating it).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from llmgw.wire.asgi import dumps

__all__ = ["KINDS", "Fill", "StreamNormaliser", "complete", "normalise", "normalise_body", "normalise_chat",
           "normalise_chat_chunk", "normalise_completion", "normalise_embedding"]

KINDS = ("chat", "completion", "embedding")  # the endpoints' kinds (checks.POST_PATHS) whose answers it completes


class Fill:
    """What the gateway puts where an engine gave no `id`, `created` or `model`: the same for every chunk
    of one answer (a stream's chunks share them, as OpenAI's do). `changes` counts what was added or
    dropped, so an answer that lacked nothing is not written again."""

    __slots__ = ("_created", "changes", "model", "request_id")

    def __init__(self, model: str, request_id: str) -> None:
        self.model = model  # the model that served the request
        self.request_id = request_id
        self.changes = 0
        self._created: int | None = None

    def id(self, prefix: str) -> str:
        return f"{prefix}-{self.request_id}"

    @property
    def created(self) -> int:
        if self._created is None:
            self._created = int(time.time())
        return self._created


# --- the parsed path ----------------------------------------------------------------------------------

# Optional fields whose schema takes no null: a null there is dropped (it says no more than absence).
_NO_NULL_TOP = ("system_fingerprint", "usage")
_NO_NULL_MESSAGE = ("annotations", "function_call", "tool_calls")


def _put(fill: Fill, obj: dict[str, Any], key: str, value: Any) -> Any:
    """obj[key], set to `value` if it has none."""
    if key in obj:
        return obj[key]
    fill.changes += 1
    obj[key] = value
    return value


def _top(doc: dict[str, Any], fill: Fill, obj: str, prefix: str | None) -> None:
    if prefix is not None:
        if "id" not in doc:
            _put(fill, doc, "id", fill.id(prefix))
        if "created" not in doc:
            _put(fill, doc, "created", fill.created)
    _put(fill, doc, "object", obj)
    _put(fill, doc, "model", fill.model)


def _drop_nulls(fill: Fill, doc: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in doc and doc[key] is None:
            del doc[key]
            fill.changes += 1


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage(doc: dict[str, Any], fill: Fill, counted: bool = True) -> None:
    """A `usage` object's missing counts: from the others where they tell (total = prompt + completion), else 0.
    `counted`: it has completion tokens (not an embeddings answer's)."""
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return
    prompt, completion, total = (_count(usage.get(k)) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    if "prompt_tokens" not in usage:
        if total is not None and not counted:
            prompt = total  # embeddings: every token is the prompt's
        elif total is not None and completion is not None:
            prompt = total - completion
        else:
            prompt = 0
        _put(fill, usage, "prompt_tokens", prompt)
    if counted and "completion_tokens" not in usage:
        completion = _put(fill, usage, "completion_tokens",
                          total - prompt if total is not None and prompt is not None else 0)
    if "total_tokens" not in usage:
        _put(fill, usage, "total_tokens", (prompt or 0) + ((completion or 0) if counted else 0))


def _choices(doc: dict[str, Any], fill: Fill) -> list[Any]:
    choices = _put(fill, doc, "choices", [])
    return choices if isinstance(choices, list) else []


def _token_logprobs(entries: Any, fill: Fill, top: bool) -> None:
    if not isinstance(entries, list):
        return
    for entry in entries:
        if isinstance(entry, dict):
            _put(fill, entry, "bytes", None)
            if top:
                _token_logprobs(_put(fill, entry, "top_logprobs", []), fill, False)


def _chat_logprobs(choice: dict[str, Any], fill: Fill) -> None:
    logprobs = _put(fill, choice, "logprobs", None)
    if isinstance(logprobs, dict):
        _token_logprobs(_put(fill, logprobs, "content", None), fill, True)
        _token_logprobs(_put(fill, logprobs, "refusal", None), fill, True)


def _tool_calls(calls: Any, fill: Fill, chunk: bool) -> None:
    if not isinstance(calls, list):
        return
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        if chunk:
            _put(fill, call, "index", i)
            continue
        if "function" in call:
            _put(fill, call, "type", "function")
            if isinstance(call["function"], dict):
                _put(fill, call["function"], "arguments", "{}")
        _put(fill, call, "id", f"call_{i}")


def normalise_chat(doc: Any, fill: Fill) -> Any:
    """A whole chat completion (`CreateChatCompletionResponse`), completed in place; returned."""
    if not isinstance(doc, dict):
        return doc
    _top(doc, fill, "chat.completion", "chatcmpl")
    _drop_nulls(fill, doc, _NO_NULL_TOP)
    for i, choice in enumerate(_choices(doc, fill)):
        if not isinstance(choice, dict):
            continue
        _put(fill, choice, "index", i)
        _put(fill, choice, "finish_reason", "stop")  # no null in a whole answer: it ended, and said not why
        message = _put(fill, choice, "message", {})
        if isinstance(message, dict):
            _put(fill, message, "role", "assistant")
            _put(fill, message, "content", None)
            _put(fill, message, "refusal", None)
            _drop_nulls(fill, message, _NO_NULL_MESSAGE)
            _tool_calls(message.get("tool_calls"), fill, chunk=False)
        _chat_logprobs(choice, fill)
    _usage(doc, fill)
    return doc


def normalise_chat_chunk(doc: Any, fill: Fill) -> Any:
    """One streamed chat chunk (`CreateChatCompletionStreamResponse`), completed in place; returned."""
    if not isinstance(doc, dict) or "error" in doc:
        return doc
    _top(doc, fill, "chat.completion.chunk", "chatcmpl")
    _drop_nulls(fill, doc, ("system_fingerprint",))
    for i, choice in enumerate(_choices(doc, fill)):
        if not isinstance(choice, dict):
            continue
        _put(fill, choice, "index", i)
        _put(fill, choice, "finish_reason", None)
        delta = _put(fill, choice, "delta", {})
        if isinstance(delta, dict):
            _drop_nulls(fill, delta, _NO_NULL_MESSAGE)
            _tool_calls(delta.get("tool_calls"), fill, chunk=True)
        if isinstance(choice.get("logprobs"), dict):
            _chat_logprobs(choice, fill)
    _usage(doc, fill)
    return doc


def normalise_completion(doc: Any, fill: Fill, chunk: bool = False) -> Any:
    """A completion (`CreateCompletionResponse`, whole or a stream's chunk), completed in place; returned.
    A chunk's missing `finish_reason` is null (OpenAI's own chunks say null until the last)."""
    if not isinstance(doc, dict) or "error" in doc:
        return doc
    _top(doc, fill, "text_completion", "cmpl")
    _drop_nulls(fill, doc, _NO_NULL_TOP)  # a chunk's usage too: not nullable here, unlike a chat chunk's
    for i, choice in enumerate(_choices(doc, fill)):
        if not isinstance(choice, dict):
            continue
        _put(fill, choice, "index", i)
        _put(fill, choice, "text", "")
        _legacy_logprobs(_put(fill, choice, "logprobs", None), fill)
        _put(fill, choice, "finish_reason", None if chunk else "stop")
    _usage(doc, fill)
    return doc


def _legacy_logprobs(logprobs: Any, fill: Fill) -> None:
    """A completion's logprobs in the chat shape (llama.cpp's `{"content": [{token, logprob, top_logprobs}]}`)
    given OpenAI's completion shape beside it: `tokens`, `token_logprobs`, `top_logprobs` (token -> logprob).
    `text_offset` (counted from the prompt's start) the engine does not tell: left out (optional)."""
    if not isinstance(logprobs, dict) or "tokens" in logprobs or not isinstance(logprobs.get("content"), list):
        return
    entries = [e for e in logprobs["content"] if isinstance(e, dict)]
    if len(entries) != len(logprobs["content"]) or not all(isinstance(e.get("token"), str) for e in entries):
        return
    _put(fill, logprobs, "tokens", [e["token"] for e in entries])
    if all(isinstance(e.get("logprob"), (int, float)) for e in entries):
        _put(fill, logprobs, "token_logprobs", [e["logprob"] for e in entries])
    if "top_logprobs" not in logprobs and all(isinstance(e.get("top_logprobs"), list) for e in entries):
        tops = [{t["token"]: t["logprob"] for t in e["top_logprobs"] if isinstance(t, dict)
                 and isinstance(t.get("token"), str) and isinstance(t.get("logprob"), (int, float))} for e in entries]
        _put(fill, logprobs, "top_logprobs", tops)


def normalise_embedding(doc: Any, fill: Fill) -> Any:
    """An embeddings answer (`CreateEmbeddingResponse`), completed in place; returned. Usage the engine did
    not tell is 0 tokens (the schema requires it and takes no null)."""
    if not isinstance(doc, dict):
        return doc
    _top(doc, fill, "list", None)
    data = _put(fill, doc, "data", [])
    for i, item in enumerate(data if isinstance(data, list) else ()):
        if isinstance(item, dict):
            _put(fill, item, "index", i)
            _put(fill, item, "object", "embedding")
            _put(fill, item, "embedding", [])
    if not isinstance(doc.get("usage"), dict):
        doc["usage"] = {}
        fill.changes += 1
    _usage(doc, fill, counted=False)
    return doc


def normalise(kind: str, doc: Any, fill: Fill, chunk: bool = False) -> Any:
    """The answer of an endpoint `kind` (chat, completion, embedding), completed; any other kind as it is."""
    if kind == "chat":
        return normalise_chat_chunk(doc, fill) if chunk else normalise_chat(doc, fill)
    if kind == "completion":
        return normalise_completion(doc, fill, chunk)
    if kind == "embedding" and not chunk:
        return normalise_embedding(doc, fill)
    return doc


# --- the byte-level check -------------------------------------------------------------------------------
#
# For a stream's chunks (small, many) and embeddings answers (large: their vectors skipped). Counts of `"key":`
# in compact JSON: such a match is a key (an unescaped quote followed by `:` ends a key), at whatever depth.
# Each object's required keys are counted against its kind's marker (a choice's `index`), and what would put
# the same key at two depths (logprobs objects, tool calls) or hide an object from the counts (an empty `{}`, but
# a last chunk's `"delta":{}`, which requires no key) sends the answer to the parsed path. Spaced JSON never
# passes: parsed too. Events read together are counted together (`StreamNormaliser.feed`).

_SPACED = (b'": ', b'" :', b"{ ")  # not compact JSON: the patterns below could miss
_DOUBT = (*_SPACED, b'"logprobs":{', b'"tool_calls":[{', b'"system_fingerprint":null', b'"annotations":null',
          b'"function_call":null', b'"tool_calls":null')
_NULL = b'"usage":null'
_NO_DELTA = b'"delta":{}'  # a stream's last chunk, as OpenAI's and vLLM's: its choice's keys all counted
_DATA = b'data: {"'  # a chunk's event, as engines write it
_NEXT_DATA = b'\n\ndata: {"'
_DONE = b"data: [DONE]\n\n"
# A completion chunk's `"usage": null` (engines asked for usage put it in every chunk), cut from the bytes.
_NULL_USAGE = re.compile(rb',"usage":null(?=[,}])')
_TOP = (b'"id":', b'"object":', b'"created":', b'"model":', b'"choices":')
_CHUNK = (b'"finish_reason":', b'"delta":')
_COMPLETION = (b'"finish_reason":', b'"logprobs":', b'"text":')


def _embedding_complete(doc: Any) -> bool:
    """Whether a parsed embeddings answer has every key `normalise_embedding` would add."""
    if not isinstance(doc, dict) or "object" not in doc or "model" not in doc:
        return False
    usage, data = doc.get("usage"), doc.get("data")
    if not isinstance(usage, dict) or "prompt_tokens" not in usage or "total_tokens" not in usage:
        return False
    return isinstance(data, list) and all(
        isinstance(item, dict) and "index" in item and "object" in item and "embedding" in item for item in data)


def _skeleton(body: bytes) -> bytes:
    """An embeddings answer less its vectors (each `"embedding":` value, an array of numbers or a base64 string,
    as 0): the floats are most of its bytes and hold no key, so what is left parses fast."""
    parts: list[bytes] = []
    at = 0
    while (key := body.find(b'"embedding":', at)) >= 0:
        start = key + 12
        opener = body[start : start + 1]
        end = body.find(b"]", start) if opener == b"[" else body.find(b'"', start + 1) if opener == b'"' else -1
        if end < 0:
            return body  # not a value it knows: counted whole
        parts += (body[at:start], b"0")
        at = end + 1
    parts.append(body[at:])
    return b"".join(parts)


def complete(kind: str, body: bytes, chunk: bool = False, events: int = 1) -> bool:
    """Whether an answer (a whole body, or a stream's chunk: `events` of them, each `data: {json}`, together)
    certainly has every key its schema requires, read from its bytes: True, relay it as it is; False, parse and
    complete it (it may lack nothing)."""
    if kind == "embedding":
        # Its keys read from the answer less its vectors, parsed (small): counting keys in the bytes would take
        # an engine's extra field that holds one of them ({"object": ...} in an extra dict) for the missing one.
        try:
            doc = json.loads(_skeleton(body))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return False
        return _embedding_complete(doc)
    if kind not in ("chat", "completion"):
        return True
    if not chunk:
        return False  # a whole answer is parsed (normalise_body): json reads it faster than 20 scans
    choices = body.count(b'"index":')
    if not choices and b'"choices":[]' not in body:
        return False  # choices that lack their index (or no choices key at all): parsed, to be sure
    # Each choice's keys first: what engines leave out (llama.cpp's `logprobs`, `refusal`) is found at once.
    for key in _CHUNK if kind == "chat" else _COMPLETION:
        if body.count(key) != choices:
            return False
    for doubt in _DOUBT:
        if doubt in body:
            return False
    if b"{}" in body and body.count(b"{}") != body.count(_NO_DELTA):
        return False  # an empty object but a last chunk's delta (which requires nothing): parsed
    if b'"usage":{' in body or (kind == "completion" and _NULL in body):
        return False  # usage in a stream comes once, in the last chunk: parsed, to be sure of it
    if events == 1:
        for key in _TOP:
            if key not in body:
                return False
        return True
    # Several chunks: each top-level key as many times as there are chunks. One that lacks a key leaves the
    # count short, unless another has it twice (nested: no engine's chunk has these keys below the top but
    # tool calls' `id`, which the doubts send to the parsed path).
    for key in _TOP:
        if body.count(key) != events:
            return False
    return True


def normalise_body(kind: str, body: bytes, fill: Fill) -> bytes:
    """A whole answer's body, completed; as it came when it lacks nothing or is not a JSON object."""
    if kind == "embedding" and complete(kind, body):
        return body
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return body
    if not isinstance(doc, dict):
        return body
    before = fill.changes
    doc = normalise(kind, doc, fill)
    return body if fill.changes == before else dumps(doc)


class StreamNormaliser:
    """Completes a stream's chunks as they pass (server-sent events, `data: {json}` each): an event split
    across reads is held until it is whole; an event whose bytes show every required key passes as it came."""

    __slots__ = ("_fill", "_kind", "_rest")

    def __init__(self, kind: str, fill: Fill) -> None:
        self._kind = kind
        self._fill = fill
        self._rest = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._rest + chunk if self._rest else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._rest = data
            return b""
        events, self._rest = data[: end + 2], data[end + 2 :]
        kind = self._kind
        if kind == "completion" and _NULL in events:
            events = _NULL_USAGE.sub(b"", events)
        count = events.count(b"\n\n")
        if count == 1:  # the usual read: one event
            return events if complete(kind, events, chunk=True) else self._event(events[:-2], True) + b"\n\n"
        # Several events read together (an engine faster than its reader): checked at once, each `data: {...}`
        # (a quote after a brace never comes inside a JSON string: it would be escaped), the stream's end aside.
        body, count = (events[: -len(_DONE)], count - 1) if events.endswith(_DONE) else (events, count)
        if body.startswith(_DATA) and body.count(_NEXT_DATA) == count - 1 and complete(kind, body, True, count):
            return events
        return b"".join(self._event(e) + b"\n\n" for e in events.split(b"\n\n")[:-1])

    def _event(self, event: bytes, checked: bool = False) -> bytes:
        if not event.startswith(b"data:") or (not checked and complete(self._kind, event, chunk=True)):
            return event
        payload = event[5:].strip()
        if not payload.startswith(b"{"):
            return event  # [DONE]
        try:
            doc = json.loads(payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return event
        if not isinstance(doc, dict) or "error" in doc:
            return event
        before = self._fill.changes
        doc = normalise(self._kind, doc, self._fill, chunk=True)
        return event if self._fill.changes == before else b"data: " + dumps(doc)

    def flush(self) -> bytes:
        rest, self._rest = self._rest, b""
        return rest
