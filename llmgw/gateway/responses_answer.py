"""A chat completion answer as OpenAI's Responses API answers (llmgw/gateway/responses.py translates the request):
the whole `Response` object, or its stream of events, each with its `sequence_number`: `response.created`,
`response.in_progress`, per output item `response.output_item.added` ... `.done` (a message's text part and its
`response.output_text.delta`s; a function call's `response.function_call_arguments.delta`s), then
`response.completed` (or `response.incomplete` when the engine stopped at the token limit) with the whole
`Response`. A stream that breaks off ends with an `error` event and `response.failed`.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from llmgw.errors import OpenAIError
from llmgw.gateway.dialect import Translation, sse

__all__ = ["ResponsesTranslation", "usage_doc"]

# finish_reason -> incomplete_details.reason (the others complete the response)
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


# The Response's fields the schema requires (null where the schema lets them be); others are left out when null.
_REQUIRED = frozenset({"id", "object", "created_at", "error", "incomplete_details", "instructions", "model", "tools",
                       "output", "parallel_tool_calls", "metadata", "tool_choice", "temperature", "top_p"})


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage_doc(usage: Any) -> dict[str, Any] | None:
    """A chat completion's `usage` in Responses' words (None: the engine gave none)."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    out_details = usage.get("completion_tokens_details")
    reasoning = _count(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion}


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponsesTranslation(Translation):
    """One `/v1/responses` request: `chat` is sent to the engine; `echo` holds the request's fields the
    `Response` repeats (its model, instructions, tools, sampling, metadata...)."""

    def __init__(self, chat: dict[str, Any], echo: dict[str, Any]) -> None:
        super().__init__(chat)
        self.echo = echo
        self.id = _id("resp")
        self.created_at = int(time.time())
        # the stream's state
        self._seq = 0
        self._started = False
        self._items: list[dict[str, Any]] = []  # output items in order, as they stand
        self._message: dict[str, Any] | None = None  # the message item text goes to
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool call index -> its function_call item
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None

    # --- the Response object ----------------------------------------------------------------------------------

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 finish: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The `Response` object: every field the schema requires, with the request's values or null."""
        echo = self.echo
        reason = _INCOMPLETE.get(finish or "")
        if status == "completed" and reason is not None:
            status = "incomplete"
        doc: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error, "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "instructions": echo.get("instructions"), "max_output_tokens": echo.get("max_output_tokens"),
            "model": echo["model"], "output": output, "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "previous_response_id": None, "reasoning": echo.get("reasoning"), "store": False,
            "temperature": echo.get("temperature"), "top_p": echo.get("top_p"),
            "text": echo.get("text") or {"format": {"type": "text"}}, "tool_choice": echo.get("tool_choice", "auto"),
            "tools": echo.get("tools", []), "truncation": "disabled", "metadata": echo.get("metadata", {}),
            "background": False, "max_tool_calls": echo.get("max_tool_calls"), "user": echo.get("user"),
            "safety_identifier": echo.get("safety_identifier"), "prompt_cache_key": echo.get("prompt_cache_key"),
            "prompt_cache_retention": echo.get("prompt_cache_retention"),
        }
        if usage is not None:
            doc["usage"] = usage
        if echo.get("service_tier") is not None:
            doc["service_tier"] = echo["service_tier"]
        return {k: v for k, v in doc.items() if v is not None or k in _REQUIRED}

    def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        choices = answer.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        message = _obj(choice.get("message"))
        finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
        status = "incomplete" if finish in _INCOMPLETE else "completed"
        output: list[dict[str, Any]] = []
        text, refusal = message.get("content"), message.get("refusal")
        calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
        if isinstance(text, str) and (text or not calls) or isinstance(refusal, str):
            content = [_text_part(text)] if isinstance(text, str) else []
            if isinstance(refusal, str):
                content.append({"type": "refusal", "refusal": refusal})
            output.append({"type": "message", "id": _id("msg"), "status": status, "role": "assistant",
                           "content": content})
        for call in calls:
            function = _obj(call.get("function"))
            output.append(_call_item(call.get("id"), function.get("name"), function.get("arguments"), "completed"))
        if not output:  # no text and no call (content null): an empty message, as OpenAI answers one
            output.append({"type": "message", "id": _id("msg"), "status": status, "role": "assistant",
                           "content": [_text_part("")]})
        return self.response(status, output, usage_doc(answer.get("usage")), finish)

    # --- the stream ---------------------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        doc = {"type": kind, **fields, "sequence_number": self._seq}
        self._seq += 1
        return sse(kind, doc)

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        begun = self.response("in_progress", [])
        return (self._event("response.created", response=begun)
                + self._event("response.in_progress", response=begun))

    def event(self, chunk: dict[str, Any]) -> bytes:
        out = self._start()
        if isinstance(chunk.get("usage"), dict):
            self._usage = usage_doc(chunk["usage"])
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return out
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self._finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return out
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._text(text)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._call(call)
        return out

    def _open_message(self) -> tuple[dict[str, Any], bytes]:
        item = self._message = {"type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant",
                                "content": []}
        out = self._add(item)
        out += self._event("response.content_part.added", item_id=item["id"], output_index=item["_index"],
                           content_index=0, part=_text_part(""))
        item["content"].append(_text_part(""))
        return item, out

    def _text(self, text: str) -> bytes:
        item, out = (self._message, b"") if self._message is not None else self._open_message()
        item["content"][0]["text"] += text
        return out + self._event("response.output_text.delta", item_id=item["id"], output_index=item["_index"],
                                 content_index=0, delta=text, logprobs=[])

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index")
        if not isinstance(index, int):
            index = len(self._calls)
        function = _obj(call.get("function"))
        item = self._calls.get(index)
        if item is None:
            item = self._calls[index] = _call_item(call.get("id"), function.get("name"), "", "in_progress")
            out += self._add(item)
        elif isinstance(function.get("name"), str) and not item["name"]:
            item["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item["arguments"] += arguments
            out += self._event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=item["_index"], delta=arguments)
        return out

    def _add(self, item: dict[str, Any]) -> bytes:
        item["_index"] = len(self._items)
        self._items.append(item)
        return self._event("response.output_item.added", output_index=item["_index"], item=_public(item))

    def end(self) -> bytes:
        out = self._start()
        if not self._items:  # no text and no call: an empty message, as a whole answer has
            out += self._open_message()[1]
        status = "incomplete" if self._finish in _INCOMPLETE else "completed"
        for item in self._items:
            index = item["_index"]
            item["status"] = status if item["type"] == "message" else "completed"
            if item["type"] == "message":
                part = item["content"][0]
                out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[])
                out += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part)
            else:
                out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                   name=item["name"], arguments=item["arguments"])
            out += self._event("response.output_item.done", output_index=index, item=_public(item))
        final = self.response(status, [_public(item) for item in self._items], self._usage, self._finish)
        return out + self._event(f"response.{final['status']}", response=final)

    def failed(self, error: OpenAIError) -> bytes:
        """An `error` event (flat, as the spec has it, and with OpenAI's nested `error` too, on which the
        official SDKs raise `APIError`), then `response.failed` for clients that wait for the last event."""
        out = self._start()
        code = "rate_limit_exceeded" if error.status == 429 else "server_error"
        inner = error.doc()["error"]
        out += self._event("error", code=error.code, message=error.message, param=error.param, error=inner)
        failed = self.response("failed", [_public(item) for item in self._items], self._usage,
                               error={"code": code, "message": error.message})
        return out + self._event("response.failed", response=failed)


def _call_item(call_id: Any, name: Any, arguments: Any, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": _id("fc"), "call_id": call_id if isinstance(call_id, str) else _id("call"),
            "name": name if isinstance(name, str) else "", "arguments": arguments if isinstance(arguments, str) else "",
            "status": status}


def _public(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as sent (a copy: later deltas change the item kept)."""
    doc = {k: v for k, v in item.items() if k != "_index"}
    if doc["type"] == "message":
        doc["content"] = [dict(part) for part in doc["content"]]
    return doc
