"""OpenAI's Responses API (`POST /v1/responses`), its stateless subset, served over the engines' chat completions:
a request's `input` items, `instructions`, sampling, function tools and text format become one chat completion
body; the answer (llmgw/gateway/responses_answer.py) becomes a `Response`, whole or as Responses' stream events.

llmgw keeps no responses: what needs one kept (`previous_response_id`, `conversation`, `store: true`,
`background: true`) is refused by name, as is what no engine here can do (built-in tools, image and file inputs,
prompt templates, OpenAI's moderation). Every field of the spec's `CreateResponse` is honoured or refused by
name; a null is never refused (it is "not given"); a field the spec lacks is refused as unknown (docs/api.md).
"""

from __future__ import annotations

from typing import Any

from llmgw.errors import OpenAIError
from llmgw.gateway.checks import ARRAY, BOOLEAN, INTEGER, NUMBER, OBJECT, STRING, STRING_OR_ARRAY, STRING_OR_OBJECT
from llmgw.gateway.dialect import Dialect
from llmgw.gateway.responses_answer import ResponsesTranslation

__all__ = ["PATH", "ResponsesDialect", "chat_request"]

PATH = "/v1/responses"

# The request's fields that llmgw honours (some only with some values, checked below), with their JSON types.
_FIELDS = {
    "model": STRING, "input": STRING_OR_ARRAY, "instructions": STRING, "max_output_tokens": INTEGER,
    "temperature": NUMBER, "top_p": NUMBER, "tools": ARRAY, "tool_choice": STRING_OR_OBJECT,
    "parallel_tool_calls": BOOLEAN, "stream": BOOLEAN, "stream_options": OBJECT, "store": BOOLEAN,
    "metadata": OBJECT, "text": OBJECT, "user": STRING, "safety_identifier": STRING, "prompt_cache_key": STRING,
    "service_tier": STRING, "reasoning": OBJECT, "max_tool_calls": INTEGER, "background": BOOLEAN,
    "truncation": STRING, "include": ARRAY, "prompt_cache_retention": STRING,
}
# Fields of the spec refused whenever given (not null), and why.
_REFUSED = {
    "previous_response_id": "llmgw keeps no responses (every request is store: false): send the whole "
                            "conversation in 'input' instead",
    "conversation": "llmgw keeps no conversations: send the whole conversation in 'input' instead",
    "prompt": "llmgw keeps no prompt templates: send the prompt's text in 'instructions' and 'input'",
    "moderation": "OpenAI's moderation is not served; an operator's guard policies judge prompts and answers "
                  "(docs/guardrails.md)",
    "context_management": "context compaction is not served",
    "prompt_cache_options": "explicit prompt cache breakpoints are not served (the engines cache prefixes "
                            "on their own)",
    "top_logprobs": "logprobs are not served on /v1/responses; use /v1/chat/completions",
}
# Values that need nothing done (or that name what no answer of llmgw's has), and the only ones taken.
_INCLUDE_TAKEN = frozenset({"reasoning.encrypted_content"})  # llmgw's answers have no reasoning items
_TEXT_FORMATS = ("text", "json_object", "json_schema")
_TOOL_FIELDS = frozenset({"type", "name", "description", "parameters", "strict"})
_TOOL_CHOICES = ("none", "auto", "required")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# Chat fields whose refusals (by the gateway's later checks) name the Responses field the client sent.
CHAT_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format",
              "reasoning_effort": "reasoning.effort", "verbosity": "text.verbosity"}


class ResponsesDialect(Dialect):
    path = PATH

    def start(self, body: dict[str, Any]) -> ResponsesTranslation:
        chat, echo = chat_request(body)
        return ResponsesTranslation(chat, echo)

    def error_doc(self, error: OpenAIError) -> dict[str, Any]:
        """OpenAI's shape; a refusal of the chat body sent on names the Responses field it came from."""
        doc = error.doc()
        name = CHAT_NAMES.get(error.param or "")
        if name is not None:
            inner = doc["error"]
            doc = {**doc, "error": {**inner, "param": name,
                                    "message": inner["message"].replace(f"'{error.param}'", f"'{name}'")}}
        return doc


def _bad(code: str, words: str, param: str) -> OpenAIError:
    return OpenAIError(400, code, words, param=param)


def _unsupported(param: str, why: str) -> OpenAIError:
    return _bad("unsupported_parameter", f"'{param}' is not supported: {why}", param)


def _unsupported_value(param: str, value: Any, why: str) -> OpenAIError:
    return _bad("unsupported_value", f"{param} {value!r} is not supported: {why}", param)


def _typed(value: Any, spec: tuple[Any, str], param: str) -> None:
    if not spec[0](value):
        raise _bad("invalid_type", f"'{param}' must be {spec[1]}", param)


def chat_request(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat completion body for a Responses request, and the request's fields its `Response` echoes.
    Refuses (400, `param` the Responses field) what llmgw does not serve, by name."""
    for key, value in body.items():
        if key in _REFUSED:
            if value is not None:
                raise _unsupported(key, _REFUSED[key])
            continue
        spec = _FIELDS.get(key)
        if spec is None:
            raise _bad("unknown_parameter", f"unknown parameter '{key}': /v1/responses takes the fields of "
                                            "OpenAI's Responses API only", key)
        if value is not None:
            _typed(value, spec, key)
    model = body.get("model")
    if model is None:
        raise _bad("missing_required_parameter", "'model' is required", "model")
    if not model:
        raise _bad("invalid_type", "'model' must be a non-empty string", "model")
    chat: dict[str, Any] = {"model": model}
    echo: dict[str, Any] = {"model": model}
    _refuse_values(body)
    instructions = body.get("instructions")
    messages = [{"role": "system", "content": instructions}] if instructions is not None else []
    messages += _messages(body.get("input"))
    chat["messages"] = messages
    for key, chat_key in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                          ("parallel_tool_calls", "parallel_tool_calls"), ("stream", "stream"), ("user", "user"),
                          ("safety_identifier", "safety_identifier"), ("prompt_cache_key", "prompt_cache_key"),
                          ("service_tier", "service_tier")):
        if body.get(key) is not None:
            chat[chat_key] = body[key]
    tools = body.get("tools")
    if tools:
        chat["tools"], echo["tools"] = _tools(tools)
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    _stream_options(body.get("stream_options"))
    metadata = body.get("metadata")
    if metadata is not None:
        for k, v in metadata.items():
            if not isinstance(v, str):
                raise _bad("invalid_type", f"'metadata.{k}' must be a string", f"metadata.{k}")
    text = body.get("text")
    if text is not None:
        chat.update(_text(text))
    reasoning = body.get("reasoning")
    if reasoning is not None:
        for key, value in reasoning.items():
            if value is None or (key in ("summary", "generate_summary") and value == "auto"):
                continue  # "auto": a summary where there is reasoning to sum up; llmgw answers carry none
            if key != "effort":
                raise _unsupported(f"reasoning.{key}", "only 'reasoning.effort' is passed to the engine")
            _typed(value, STRING, "reasoning.effort")
            chat["reasoning_effort"] = value
    for key in ("instructions", "max_output_tokens", "temperature", "top_p", "tool_choice", "parallel_tool_calls",
                "metadata", "text", "reasoning", "user", "safety_identifier", "prompt_cache_key", "service_tier",
                "max_tool_calls", "prompt_cache_retention"):
        if body.get(key) is not None and key not in echo:
            echo[key] = body[key]
    return chat, echo


def _refuse_values(body: dict[str, Any]) -> None:
    """The fields taken with some values only."""
    if body.get("store") is True:
        raise _unsupported_value("store", True, "llmgw keeps no responses; send store: false, or leave it out "
                                                "(nothing is kept either way, and nothing can be retrieved)")
    if body.get("background") is True:
        raise _unsupported_value("background", True, "llmgw keeps no responses to poll; send stream: true "
                                                     "for a long answer")
    if body.get("truncation") not in (None, "disabled"):
        raise _unsupported_value("truncation", body["truncation"], "llmgw does not drop input to fit the context; "
                                                                   "'disabled' is the only value")
    if body.get("prompt_cache_retention") not in (None, "in_memory"):
        raise _unsupported_value("prompt_cache_retention", body["prompt_cache_retention"],
                                 "the engines keep their prompt caches in memory only ('in_memory')")
    for i, value in enumerate(body.get("include") or ()):
        if not isinstance(value, str) or value not in _INCLUDE_TAKEN:
            raise _unsupported_value(f"include[{i}]", value, "llmgw's answers carry no such data")


def _messages(items: Any) -> list[dict[str, Any]]:
    if items is None:
        raise _bad("missing_required_parameter", "'input' is required", "input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not items:
        raise _bad("invalid_value", "'input' must be a string or a non-empty array of items", "input")
    messages: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message that function calls join (one turn)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad("invalid_type", f"'{where}' must be an object", where)
        kind = item.get("type")
        if kind is None or kind == "message":
            messages.append(_message(item, where))
            turn = messages[-1] if messages[-1]["role"] == "assistant" else None
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            if turn is not None:
                turn.setdefault("tool_calls", []).append(call)  # one assistant turn: its text and its calls
            else:
                turn = {"role": "assistant", "content": None, "tool_calls": [call]}
                messages.append(turn)
            continue
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _parts(output, f"{where}.output", "tool")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": content})
            turn = None
        elif kind == "item_reference":
            raise _unsupported(where, "llmgw keeps no items to refer to: send the item itself")
        elif isinstance(kind, str):
            raise _unsupported_value(f"{where}.type", kind, "input items are messages, function_call and "
                                                            "function_call_output")
        else:
            raise _bad("invalid_type", f"'{where}.type' must be a string", f"{where}.type")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        words = f"'{where}.role' must be one of user, assistant, system, developer"
        raise _bad("invalid_value", words, f"{where}.role")
    content = item.get("content")
    if not isinstance(content, str):
        content = _parts(content, f"{where}.content", role)
    # developer is a system message to the engines' chat templates (most know no developer role)
    return {"role": _ROLES[role], "content": content}


def _parts(parts: Any, where: str, role: str) -> str | list[dict[str, Any]]:
    """Text content parts, as chat content: one text a string, several an array of text parts."""
    if not isinstance(parts, list):
        raise _bad("invalid_type", f"'{where}' must be a string or an array of content parts", where)
    texts = []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise _bad("invalid_type", f"'{at}' must be an object", at)
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            texts.append(_string(part, "text", at))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise _unsupported_value(f"{at}.type", kind, "llmgw serves text only on /v1/responses")
        elif isinstance(kind, str):
            raise _unsupported_value(f"{at}.type", kind, f"a {role} message's content parts are input_text "
                                                         "and output_text")
        else:
            raise _bad("invalid_type", f"'{at}.type' must be a string", f"{at}.type")
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts] if texts else ""


def _string(doc: dict[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        words = f"'{where}.{key}' is required" if value is None else f"'{where}.{key}' must be a string"
        raise _bad("missing_required_parameter" if value is None else "invalid_type", words, f"{where}.{key}")
    return value


def _tools(tools: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Responses' flat function tools as chat's, and as the `Response` echoes them."""
    chat, echo = [], []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad("invalid_type", f"'{where}' must be an object", where)
        kind = tool.get("type")
        if kind != "function":
            if not isinstance(kind, str):
                raise _bad("invalid_type", f"'{where}.type' must be a string", f"{where}.type")
            raise _unsupported_value(f"{where}.type", kind, "llmgw serves function tools only (the client runs "
                                                            "them); built-in tools are OpenAI's")
        for key, value in tool.items():
            if key not in _TOOL_FIELDS and value is not None:
                raise _unsupported(f"{where}.{key}", "a function tool takes name, description, parameters and "
                                                     "strict")
        function: dict[str, Any] = {"name": _string(tool, "name", where)}
        for key, spec in (("description", STRING), ("parameters", OBJECT), ("strict", BOOLEAN)):
            if tool.get(key) is not None:
                _typed(tool[key], spec, f"{where}.{key}")
                function[key] = tool[key]
        chat.append({"type": "function", "function": function})
        echo.append({"type": "function", "name": function["name"], "description": tool.get("description"),
                     "parameters": tool.get("parameters"), "strict": tool.get("strict")})
    return chat, echo


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise _bad("invalid_value", "'tool_choice' must be none, auto, required or a function", "tool_choice")
        return choice
    kind = choice.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}
    raise _unsupported_value("tool_choice.type", kind, "llmgw serves function tools only")


def _stream_options(options: Any) -> None:
    """`include_obfuscation` is taken (llmgw pads no events: it has nothing to hide that way); the gateway asks
    the engine for the stream's usage itself."""
    for key, value in (options or {}).items():
        where = f"stream_options.{key}"
        if key != "include_obfuscation":
            raise _bad("unknown_parameter", f"unknown parameter '{where}'", where)
        if value is not None:
            _typed(value, BOOLEAN, where)


def _text(text: dict[str, Any]) -> dict[str, Any]:
    """`text.format` as chat's `response_format`, `text.verbosity` as chat's `verbosity`."""
    chat: dict[str, Any] = {}
    for key, value in text.items():
        if key not in ("format", "verbosity"):
            raise _bad("unknown_parameter", f"unknown parameter 'text.{key}'", f"text.{key}")
    if text.get("verbosity") is not None:
        _typed(text["verbosity"], STRING, "text.verbosity")
        chat["verbosity"] = text["verbosity"]
    fmt = text.get("format")
    if fmt is None:
        return chat
    _typed(fmt, OBJECT, "text.format")
    kind = fmt.get("type")
    if kind not in _TEXT_FORMATS:
        raise _bad("invalid_value", "'text.format.type' must be text, json_object or json_schema", "text.format.type")
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        schema: dict[str, Any] = {"name": _string(fmt, "name", "text.format")}
        if fmt.get("schema") is None:
            raise _bad("missing_required_parameter", "'text.format.schema' is required", "text.format.schema")
        _typed(fmt["schema"], OBJECT, "text.format.schema")
        schema["schema"] = fmt["schema"]
        for key, spec in (("description", STRING), ("strict", BOOLEAN)):
            if fmt.get(key) is not None:
                _typed(fmt[key], spec, f"text.format.{key}")
                schema[key] = fmt[key]
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    return chat
