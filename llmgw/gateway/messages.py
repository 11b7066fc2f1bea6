"""Anthropic's Messages API (`POST /v1/messages`) served over the engines' chat completions (gateway/dialect.py).

A request (`system`, `messages` of text blocks, tool use and results, `max_tokens`, `stop_sequences`,
`temperature`, `top_p`, `metadata.user_id`, `tools`, `tool_choice`, `stream`) becomes one chat completion
body; the answer comes back as a `message`, or as Anthropic's events (`message_start`, `content_block_*`,
`message_delta`, `message_stop`; `error` for a stream that breaks off). What chat completions cannot carry
(images, documents, `thinking`, `top_k`, server tools...) is refused by name, never dropped. Refusals are in
Anthropic's shape, llmgw's code in `error.details.error_code` (what the SDK reads as `error_code`).

Which stop sequence ended an answer: an engine that says it (vLLM's and the sim's `stop_reason` on the
choice) gives `stop_reason: "stop_sequence"` and `stop_sequence`; one that does not (llama.cpp) gives
`end_turn` (docs/api.md, "Anthropic Messages").
"""

from __future__ import annotations

import json
import secrets
from typing import Any, ClassVar

from llmgw.errors import OpenAIError
from llmgw.gateway.checks import ARRAY, BOOLEAN, INTEGER, NUMBER, OBJECT, STRING, STRING_OR_ARRAY, _Type
from llmgw.gateway.dialect import Dialect, Translation, sse

__all__ = ["MessagesDialect", "MessagesTranslation", "error_type"]

PATH = "/v1/messages"

# The request's fields served, with their JSON types (null: not given).
FIELDS: dict[str, _Type] = {
    "model": STRING, "max_tokens": INTEGER, "messages": ARRAY, "system": STRING_OR_ARRAY, "stop_sequences": ARRAY,
    "temperature": NUMBER, "top_p": NUMBER, "stream": BOOLEAN, "metadata": OBJECT, "tools": ARRAY,
    "tool_choice": OBJECT, "cache_control": OBJECT,
}
# Anthropic's fields that chat completions cannot carry: refused by name unless null.
UNSERVED = frozenset({
    "top_k", "thinking", "container", "context_management", "mcp_servers", "service_tier", "inference_geo",
    "output_config", "output_format", "speed", "diagnostics", "user_profile_id", "workspace_id", "betas",
})
_BLOCK_KEYS = {"text": {"type", "text", "cache_control", "citations"},
               "tool_use": {"type", "id", "name", "input", "cache_control"},
               "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"}}
_TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control"}
_FINISH = {"length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use", "content_filter": "refusal"}


def _bad(code: str, words: str, param: str) -> OpenAIError:
    return OpenAIError(400, code, words, param=param)


def _typed(value: Any, spec: _Type, where: str) -> None:
    if not spec[0](value):
        raise _bad("invalid_type", f"'{where}' must be {spec[1]}", where)


def _unserved(where: str, what: str = "") -> OpenAIError:
    words = f"'{where}': {what} is not served" if what else f"'{where}' is not served"
    return _bad("unsupported_parameter", f"{words} on {PATH}: the engines behind llmgw are asked through chat "
                                         "completions, which cannot carry it", where)


def _unknown(key: str, where: str) -> OpenAIError:
    return _bad("unknown_parameter", f"unknown parameter '{where}': {PATH} takes Anthropic's fields only", where)


def _keys(doc: dict[str, Any], allowed: set[str], where: str) -> None:
    for key, value in doc.items():
        if key not in allowed and value is not None:
            raise _unknown(key, f"{where}.{key}")


def _text_block(block: dict[str, Any], where: str) -> str:
    _keys(block, _BLOCK_KEYS["text"], where)
    _typed(block.get("text"), STRING, f"{where}.text")
    if block.get("citations"):
        raise _unserved(f"{where}.citations")
    return str(block["text"])


def _content(texts: list[str]) -> str | list[dict[str, Any]]:
    """Text blocks as chat content: one block's text, else text parts (each block kept whole)."""
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts]


def _system(value: Any) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        return value
    texts = []
    for i, block in enumerate(value):
        where = f"system[{i}]"
        if not isinstance(block, dict):
            raise _bad("invalid_type", f"'{where}' must be a text block", where)
        if block.get("type") != "text":
            raise _unserved(f"{where}.type", f"a {block.get('type')!r} block in the system prompt")
        texts.append(_text_block(block, where))
    return _content(texts)


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    _keys(block, _BLOCK_KEYS["tool_result"], where)
    _typed(block.get("tool_use_id"), STRING, f"{where}.tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        _typed(content, STRING_OR_ARRAY, f"{where}.content")
        parts = []
        for j, inner in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(inner, dict) or inner.get("type") != "text":
                kind = inner.get("type") if isinstance(inner, dict) else None
                raise _unserved(f"{at}.type", f"a {kind!r} block in a tool result")
            parts.append(_text_block(inner, at))
        text = "\n".join(parts)
    if block.get("is_error") is not None:
        _typed(block["is_error"], BOOLEAN, f"{where}.is_error")
        if block["is_error"]:
            text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    _keys(block, _BLOCK_KEYS["tool_use"], where)
    for key, spec in (("id", STRING), ("name", STRING), ("input", OBJECT)):
        _typed(block.get(key), spec, f"{where}.{key}")
    arguments = json.dumps(block["input"], ensure_ascii=False, separators=(",", ":"))
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _message(message: Any, i: int) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user's tool results first (each a `tool` message), then the
    rest of its text; an assistant's text and tool uses as one message with `tool_calls`."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise _bad("invalid_type", f"'{where}' must be an object", where)
    _keys(message, {"role", "content"}, where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise _bad("invalid_value", f"'{where}.role' must be \"user\" or \"assistant\"", f"{where}.role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _bad("invalid_type", f"'{where}.content' must be a string or an array of content blocks",
                   f"{where}.content")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(block, dict):
            raise _bad("invalid_type", f"'{at}' must be a content block (an object)", at)
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_block(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at))
        elif kind in ("tool_use", "tool_result"):
            raise _bad("invalid_value", f"a {kind} block belongs in an {'assistant' if kind == 'tool_use' else 'user'}"
                                        " message", f"{at}.type")
        elif isinstance(kind, str):
            raise _unserved(f"{at}.type", f"a {kind!r} content block")
        else:
            raise _bad("invalid_type", f"'{at}.type' must be a string", f"{at}.type")
    out = list(results)
    if role == "assistant":
        chat: dict[str, Any] = {"role": role, "content": _content(texts) if texts else ("" if not calls else None)}
        if calls:
            chat["tool_calls"] = calls
        out.append(chat)
    elif texts or not results:
        out.append({"role": role, "content": _content(texts) if texts else ""})
    return out


def _tools(value: list[Any]) -> list[dict[str, Any]]:
    tools = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad("invalid_type", f"'{where}' must be an object", where)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _unserved(f"{where}.type", f"the server tool {kind!r}")
        _keys(tool, _TOOL_KEYS, where)
        _typed(tool.get("name"), STRING, f"{where}.name")
        _typed(tool.get("input_schema"), OBJECT, f"{where}.input_schema")
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            _typed(tool["description"], STRING, f"{where}.description")
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(choice: dict[str, Any]) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice as chat's `tool_choice` and `parallel_tool_calls` (None: not said)."""
    kind = choice.get("type")
    _keys(choice, {"type", "name", "disable_parallel_tool_use"}, "tool_choice")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None:
        _typed(parallel, BOOLEAN, "tool_choice.disable_parallel_tool_use")
    if kind == "tool":
        _typed(choice.get("name"), STRING, "tool_choice.name")
        chosen: Any = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in ("auto", "any", "none"):
        chosen = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise _bad("invalid_value", "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"",
                   "tool_choice.type")
    return chosen, (None if parallel is None else not parallel)


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion body for an Anthropic Messages request; a 400 names what is wrong in its own words.
    Pure and deterministic."""
    for key, value in body.items():
        if key in FIELDS:
            if value is not None:
                _typed(value, FIELDS[key], key)
        elif value is None:
            continue
        elif key in UNSERVED:
            raise _unserved(key)
        else:
            raise _unknown(key, key)
    for key in ("model", "max_tokens", "messages"):
        if body.get(key) is None:  # Anthropic refuses these absent (max_tokens too: no default)
            raise _bad("missing_required_parameter", f"'{key}' is required", key)
    if not body["model"]:  # a string (typed above): the chat checks refuse an empty one, in chat's words
        raise _bad("invalid_value", "'model' must be a non-empty string", "model")
    if body["max_tokens"] < 1:
        raise _bad("invalid_value", "'max_tokens' must be at least 1", "max_tokens")
    if not body["messages"]:
        raise _bad("invalid_value", "'messages' must have at least one message", "messages")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None and (system := _system(body["system"])):
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(body["messages"]):
        messages.extend(_message(message, i))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    for key in ("temperature", "top_p", "stream"):
        if body.get(key) is not None:
            chat[key] = body[key]
    stops = body.get("stop_sequences")
    if stops:
        for i, stop in enumerate(stops):
            _typed(stop, STRING, f"stop_sequences[{i}]")
        chat["stop"] = list(stops)
    metadata = body.get("metadata")
    if metadata:
        _keys(metadata, {"user_id"}, "metadata")
        if metadata.get("user_id") is not None:
            _typed(metadata["user_id"], STRING, "metadata.user_id")
            chat["user"] = metadata["user_id"]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"])
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    return chat


# --- answers ----------------------------------------------------------------------------------------------


def stop_reason(finish: Any, said: Any, stops: list[str]) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat choice's `finish_reason` and the stop string the
    engine says ended it (`said`: vLLM's `stop_reason`; None from an engine that does not say)."""
    if finish == "stop" and isinstance(said, str) and said in stops:
        return "stop_sequence", said
    return _FINISH.get(finish, "end_turn") if isinstance(finish, str) else "end_turn", None


def _tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments (JSON text) as Anthropic's `input` object; text that is not an object is kept
    under `arguments` rather than lost."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class MessagesTranslation(Translation):
    """One Messages request: its chat body, and the answer back as a `message` or as Anthropic's events."""

    def __init__(self, chat: dict[str, Any], model: str, stops: list[str]) -> None:
        super().__init__(chat)
        self.model = model
        self.stops = stops
        self.id = "msg_" + secrets.token_hex(12)
        # The stream's progress: whether message_start went out, the open block (index and kind), calls seen.
        self._started = False
        self._blocks = 0
        self._open: tuple[int, str] | None = None
        self._calls: dict[int, int] = {}  # a chat tool call's index -> its block's index
        self._stop: tuple[str, str | None] = ("end_turn", None)
        self._usage = (0, 0)

    def _message(self, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
                 usage: tuple[int, int]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop[0], "stop_sequence": stop[1],
                "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}

    def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        choices = answer.get("choices")
        choice = _dict(next((c for c in choices if isinstance(c, dict)), None) if isinstance(choices, list) else None)
        message = _dict(choice.get("message"))
        text = message.get("content")
        content: list[dict[str, Any]] = []
        calls = message.get("tool_calls")
        calls = calls if isinstance(calls, list) else []
        if isinstance(text, str) and (text or not calls):
            content.append({"type": "text", "text": text})
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                content.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{secrets.token_hex(12)}"),
                                "name": str(function.get("name") or ""),
                                "input": _tool_input(function.get("arguments"))})
        usage = _dict(answer.get("usage"))
        stop = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), self.stops)
        return self._message(content, stop, (_count(usage.get("prompt_tokens")),
                                             _count(usage.get("completion_tokens"))))

    # --- events ---

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return (sse("message_start", {"type": "message_start", "message": self._message([], (None, None), (0, 0))})
                + sse("ping", {"type": "ping"}))

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open = self._open[0], None
        return sse("content_block_stop", {"type": "content_block_stop", "index": index})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        index = self._blocks
        self._blocks += 1
        self._open = (index, kind)
        return out + sse("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        assert self._open is not None
        return sse("content_block_delta", {"type": "content_block_delta", "index": self._open[0], "delta": delta})

    def event(self, chunk: dict[str, Any]) -> bytes:
        out = self._start()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = (_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = _dict(choice.get("delta"))
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self._open is None or self._open[1] != "text":
                    out += self._open_block("text", {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": text})
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out += self._tool_delta(call)
            if choice.get("finish_reason") is not None:
                self._stop = stop_reason(choice["finish_reason"], choice.get("stop_reason"), self.stops)
        return out

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        out = b""
        at = call.get("index", 0)
        function = _dict(call.get("function"))
        if at not in self._calls:  # a new call: its block, with its id and name (input streamed after)
            out += self._open_block("tool", {"type": "tool_use", "name": str(function.get("name") or ""), "input": {},
                                             "id": str(call.get("id") or f"toolu_{secrets.token_hex(12)}")})
            self._calls[at] = self._blocks - 1
        elif self._open is None or self._open[0] != self._calls[at]:
            return b""  # a late piece of a call whose block is closed: Anthropic's blocks do not interleave
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def end(self) -> bytes:
        out = self._start() + self._close()
        stop, sequence = self._stop
        usage = {"input_tokens": self._usage[0], "output_tokens": self._usage[1]}
        out += sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": sequence},
                                     "usage": usage})
        return out + sse("message_stop", {"type": "message_stop"})

    def failed(self, error: OpenAIError) -> bytes:
        return sse("error", error_doc(error))


def error_type(status: int) -> str:
    """Anthropic's error `type` for a status (the SDK picks its exception class by the status)."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status in (503, 529):
        return "overloaded_error"
    if status in (408, 504):
        return "timeout_error"
    if status >= 500:
        return "api_error"
    return "invalid_request_error"


def error_doc(error: OpenAIError) -> dict[str, Any]:
    """A refusal in Anthropic's shape; llmgw's code is `error.details.error_code` (the SDK's `error_code`)."""
    doc: dict[str, Any] = {"type": error_type(error.status), "message": error.message}
    if error.code:
        doc["details"] = {"error_code": error.code}
    return {"type": "error", "error": doc}


class MessagesDialect(Dialect):
    path: ClassVar[str] = PATH

    def start(self, body: dict[str, Any]) -> MessagesTranslation:
        chat = to_chat(body)
        return MessagesTranslation(chat, chat["model"], list(chat.get("stop") or ()))

    def error_doc(self, error: OpenAIError) -> dict[str, Any]:
        return error_doc(error)

    def headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        return [(b"request-id", request_id.encode())]  # the SDK's `request_id` of an answer or an exception
