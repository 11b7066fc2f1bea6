"""Anthropic's Messages API over chat completions (llmgw/gateway/messages.py): requests translated by example
and by property, answers and streams checked against the official `anthropic` SDK's own models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings, strategies as st
from pydantic import TypeAdapter

from llmgw.errors import OpenAIError
from llmgw.gateway.checks import check_request
from llmgw.gateway.messages import MessagesDialect, MessagesTranslation, error_doc, error_type

DIALECT = MessagesDialect()
EVENT = TypeAdapter(RawMessageStreamEvent)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "demo", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}], **extra}


def refused(doc: dict[str, Any], code: str, param: str) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        DIALECT.start(doc)
    error = caught.value
    assert (error.status, error.code, error.param) == (400, code, param), error.message
    assert param.split(".")[0].split("[")[0] in error.message
    return error


# --- requests -------------------------------------------------------------------------------------------


def test_a_request_becomes_the_chat_completion_it_says() -> None:
    chat = DIALECT.start(body(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "calling"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                                         {"type": "text", "text": "and?"}]},
        ],
        stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=None, stream=True, metadata={"user_id": "u7"},
        tools=[{"name": "f", "description": "adds", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )).chat
    assert chat == {
        "model": "demo", "max_tokens": 32, "temperature": 0.5, "top_p": 0.9, "stream": True, "stop": ["END"],
        "user": "u7",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": "calling", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "42"},
            {"role": "user", "content": "and?"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                    "description": "adds"}}],
        "tool_choice": "required", "parallel_tool_calls": False,
    }
    assert check_request("chat", chat) == ("demo", True)  # what the chat path then checks passes


def test_what_chat_completions_cannot_carry_is_refused_by_name() -> None:
    refused({"model": "demo", "messages": [{"role": "user", "content": "hi"}]}, "missing_required_parameter",
            "max_tokens")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    error = refused(body(messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]),
                    "unsupported_parameter", "messages[0].content[1].type")
    assert "'image'" in error.message
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    refused(body(messages=[{"role": "user", "content": [document]}]), "unsupported_parameter",
            "messages[0].content[0].type")
    refused(body(top_k=5), "unsupported_parameter", "top_k")
    refused(body(thinking={"type": "enabled", "budget_tokens": 1024}), "unsupported_parameter", "thinking")
    refused(body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "unsupported_parameter",
            "tools[0].type")
    refused(body(n_keep=5), "unknown_parameter", "n_keep")
    refused(body(metadata={"user_id": "u", "tenant": "x"}), "unknown_parameter", "metadata.tenant")
    refused(body(messages=[{"role": "system", "content": "x"}]), "invalid_value", "messages[0].role")
    refused(body(messages=[]), "invalid_value", "messages")
    refused(body(max_tokens="9"), "invalid_type", "max_tokens")
    refused(body(stop_sequences=["a", 1]), "invalid_type", "stop_sequences[1]")
    # null is "not given", for what is served and what is not
    assert DIALECT.start(body(top_k=None, thinking=None, system=None, metadata=None)).chat == {
        "model": "demo", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=10)
TEXT = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)})
CONTENT = st.text(max_size=8) | st.lists(TEXT, min_size=1, max_size=3)
NAME = st.text(min_size=1, max_size=4)
TOOL_USE = st.fixed_dictionaries({"type": st.just("tool_use"), "id": NAME, "name": NAME,
                                  "input": st.dictionaries(st.text(max_size=3), JSON, max_size=2)})
TOOL_RESULT = st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": NAME},
                                    optional={"content": CONTENT, "is_error": st.booleans()})
MESSAGE = (st.fixed_dictionaries({"role": st.just("user"),
                                  "content": CONTENT | st.lists(TEXT | TOOL_RESULT, min_size=1, max_size=3)})
           | st.fixed_dictionaries({"role": st.just("assistant"),
                                    "content": CONTENT | st.lists(TEXT | TOOL_USE, min_size=1, max_size=3)}))
VALID = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=6), "max_tokens": st.integers(1, 4096),
     "messages": st.lists(MESSAGE, min_size=1, max_size=4)},
    optional={"system": CONTENT | st.none(), "stop_sequences": st.lists(st.text(max_size=4), max_size=3),
              "temperature": st.floats(0, 1), "top_p": st.floats(0, 1), "stream": st.booleans(),
              "metadata": st.fixed_dictionaries({}, optional={"user_id": st.text(max_size=5)}),
              "top_k": st.none(), "thinking": st.none(),
              "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"}]),
              "tools": st.lists(st.fixed_dictionaries({"name": NAME, "input_schema": st.just({"type": "object"})},
                                                      optional={"description": st.text(max_size=5)}), max_size=2)},
)


@settings(max_examples=60, deadline=None)
@given(VALID)
def test_every_valid_request_translates_alike_each_time_into_a_chat_the_gateway_takes(doc: dict[str, Any]) -> None:
    chat = DIALECT.start(doc).chat
    assert chat == DIALECT.start(json.loads(json.dumps(doc))).chat
    assert check_request("chat", chat)[0] == doc["model"]
    assert chat["max_tokens"] == doc["max_tokens"]
    # every text and every tool call reaches the engine, in order
    sent = [b for m in doc["messages"] for b in
            ([{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"])]
    texts = [t for m in chat["messages"] if m["role"] not in ("tool", "system")
             for t in ([m["content"]] if isinstance(m["content"], str) else
                       [p["text"] for p in m["content"] or ()])]
    assert "".join(texts) == "".join(b["text"] for b in sent if b["type"] == "text")
    calls = [c["id"] for m in chat["messages"] for c in m.get("tool_calls", ())]
    results = [m["tool_call_id"] for m in chat["messages"] if m["role"] == "tool"]
    assert calls == [b["id"] for b in sent if b["type"] == "tool_use"]
    assert results == [b["tool_use_id"] for b in sent if b["type"] == "tool_result"]


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(st.sampled_from(["model", "max_tokens", "messages", "system", "stop_sequences", "tools",
                                        "tool_choice", "metadata", "top_k", "stream", "temperature", "x"]),
                       JSON, max_size=6)
       | VALID.flatmap(lambda v: st.fixed_dictionaries({k: st.just(x) | JSON for k, x in v.items()})))
def test_any_body_is_translated_or_refused_with_a_400_never_a_crash(doc: dict[str, Any]) -> None:
    try:
        chat = DIALECT.start(doc).chat
    except OpenAIError as error:
        assert error.status == 400 and error.param
        return
    check_request("chat", chat)  # a translated body never fails the chat checks in chat's words


# --- answers --------------------------------------------------------------------------------------------


def chat_answer(text: str | None, finish: str, **choice: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "engine-name",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                         **choice}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def whole(answer: dict[str, Any], **extra: Any) -> Message:
    translation = DIALECT.start(body(**extra))
    return Message.model_validate(translation.whole(answer), strict=True)


def test_a_whole_answer_is_a_message() -> None:
    message = whole(chat_answer("sim says: hi", "stop"))
    assert message.id.startswith("msg_") and message.model == "demo" and message.role == "assistant"
    assert [(b.type, b.text) for b in message.content if b.type == "text"] == [("text", "sim says: hi")]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 3)
    assert whole(chat_answer("x", "length")).stop_reason == "max_tokens"
    # the engine says which stop string ended it (vLLM's and the sim's `stop_reason`): that one
    stopped = whole(chat_answer("sim", "stop", stop_reason="says"), stop_sequences=["says"])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "says")
    # an engine's own stop (an end-of-turn token id, or a string not asked for) is the end of the turn
    assert whole(chat_answer("x", "stop", stop_reason=128009), stop_sequences=["says"]).stop_reason == "end_turn"


def test_tool_calls_are_tool_use_blocks() -> None:
    answer = chat_answer(None, "tool_calls")
    answer["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]
    message = whole(answer)
    assert message.stop_reason == "tool_use"
    assert [b.model_dump(exclude_none=True) for b in message.content] == [
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "call_2", "name": "g", "input": {"arguments": "not json"}}]


def events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The named events of a translated stream, each checked against the SDK's own event models."""
    out = []
    for event in data.decode().split("\n\n")[:-1]:
        name_line, data_line = event.split("\n")
        name, doc = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert doc["type"] == name
        if name not in ("ping", "error"):
            EVENT.validate_python(doc)
        out.append((name, doc))
    return out


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish, **choice}]}


USAGE = {"id": "c", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def run(translation: MessagesTranslation, chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return events(b"".join(translation.event(c) for c in chunks) + translation.end())


def test_a_stream_is_anthropics_event_sequence() -> None:
    translation = DIALECT.start(body(stream=True, stop_sequences=["says"]))
    seen = run(translation, [chunk({"role": "assistant", "content": ""}), chunk({"content": "sim"}),
                             chunk({"content": " hi"}), chunk(None, "stop", stop_reason="says"), USAGE])
    assert [name for name, _ in seen] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                          "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    start = seen[0][1]["message"]
    assert (start["id"], start["content"], start["stop_reason"], start["model"]) == (translation.id, [], None, "demo")
    assert seen[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert [d["delta"] for n, d in seen if n == "content_block_delta"] == [
        {"type": "text_delta", "text": "sim"}, {"type": "text_delta", "text": " hi"}]
    assert seen[6][1] == {"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "says"},
                          "usage": {"input_tokens": 5, "output_tokens": 2}}


def test_a_streamed_tool_call_is_a_tool_use_block_with_its_input_in_pieces() -> None:
    calls = [chunk({"content": "let me see"}),
             chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "f", "arguments": ""}}]}),
             chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
             chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
             chunk(None, "tool_calls"), USAGE]
    seen = run(DIALECT.start(body(stream=True)), calls)
    assert [(n, d.get("index")) for n, d in seen][2:] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1),
        ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    assert seen[5][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}
    assert "".join(d["delta"]["partial_json"] for n, d in seen if d.get("index") == 1 and n.endswith("delta")) \
        == '{"a": 1}'
    assert seen[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_an_empty_stream_still_opens_and_closes_the_message() -> None:
    seen = run(DIALECT.start(body(stream=True)), [])
    assert [n for n, _ in seen] == ["message_start", "ping", "message_delta", "message_stop"]
    assert seen[2][1]["usage"] == {"input_tokens": 0, "output_tokens": 0}


def test_a_stream_that_breaks_off_ends_with_an_error_event() -> None:
    translation = DIALECT.start(body(stream=True))
    translation.event(chunk({"content": "x"}))
    [(name, doc)] = events(translation.failed(OpenAIError(502, "upstream_error", "replica r1 failed mid-stream")))
    assert (name, doc) == ("error", {"type": "error", "error": {
        "type": "api_error", "message": "replica r1 failed mid-stream", "details": {"error_code": "upstream_error"}}})


# --- refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (405, "invalid_request_error"), (413, "invalid_request_error"),
    (429, "rate_limit_error"), (500, "api_error"), (502, "api_error"), (503, "overloaded_error"),
    (504, "timeout_error"),
])
def test_refusals_are_in_anthropics_shape_with_llmgws_code(status: int, kind: str) -> None:
    doc = error_doc(OpenAIError(status, "some_code", "words", param="p"))
    assert error_type(status) == kind
    assert doc == {"type": "error", "error": {"type": kind, "message": "words", "details": {"error_code": "some_code"}}}
    assert ErrorResponse.model_validate(doc).error.type == kind
    assert DIALECT.error_doc(OpenAIError(status, None, "w")) == {"type": "error", "error": {"type": kind,
                                                                                            "message": "w"}}


def test_an_empty_model_name_is_refused_in_the_messages_words() -> None:
    # Found by the property above: an empty name passed the translation, then failed the chat checks.
    with pytest.raises(OpenAIError) as refused:
        DIALECT.start({"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert (refused.value.status, refused.value.param) == (400, "model")
