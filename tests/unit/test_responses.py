"""OpenAI's Responses API over chat completions (llmgw/gateway/responses.py, responses_answer.py): a request as the
chat body sent to the engine, refusals by name, and the engine's answer as a `Response` or its stream of events,
each checked against the pinned part of OpenAI's OpenAPI document (tests/support/openai_spec.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from llmgw.errors import OpenAIError
from llmgw.gateway.checks import check_request
from llmgw.gateway.responses import ResponsesDialect, chat_request
from llmgw.gateway.responses_answer import ResponsesTranslation
from tests.support import openai_spec

DIALECT = ResponsesDialect()


def refusal(body: dict[str, Any]) -> OpenAIError:
    with pytest.raises(OpenAIError) as raised:
        chat_request(body)
    assert raised.value.status == 400
    return raised.value


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **extra}


# --- the request ----------------------------------------------------------------------------------------------


def test_a_text_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat, echo = chat_request(body(instructions="be brief", max_output_tokens=20, temperature=0.2, top_p=0.9,
                                   stream=True, user="u1", metadata={"a": "b"}, store=False, parallel_tool_calls=False,
                                   stream_options={"include_obfuscation": False}, safety_identifier="s"))
    assert chat == {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "hi"}],
                    "max_tokens": 20, "temperature": 0.2, "top_p": 0.9, "stream": True, "user": "u1",
                    "parallel_tool_calls": False, "safety_identifier": "s"}
    assert echo["metadata"] == {"a": "b"} and echo["instructions"] == "be brief" and "store" not in chat


def test_items_are_chat_messages_and_function_calls_join_their_assistant_turn() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1",
            "status": "completed"}
    chat, _ = chat_request(body(input=[
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "let me look", "annotations": [], "logprobs": []}]},
        call, {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        call,
    ]))
    tool_call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert chat["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "let me look", "tool_calls": [tool_call, {**tool_call, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
    ]


def test_function_tools_text_format_and_reasoning_are_chats_fields() -> None:
    tool = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}
    schema = {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
    chat, echo = chat_request(body(tools=[tool], tool_choice={"type": "function", "name": "f"},
                                   text={"format": schema, "verbosity": "low"}, reasoning={"effort": "low"}))
    assert chat["tools"] == [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "out", "schema": {"type": "object"}, "strict": True}}
    assert (chat["verbosity"], chat["reasoning_effort"]) == ("low", "low")
    assert echo["tools"] == [tool] and echo["tool_choice"] == {"type": "function", "name": "f"}
    assert chat_request(body(text={"format": {"type": "json_object"}}))[0]["response_format"] == {"type": "json_object"}
    assert "response_format" not in chat_request(body(text={"format": {"type": "text"}}))[0]


@pytest.mark.parametrize(("extra", "code", "param", "words"), [
    ({"previous_response_id": "resp_1"}, "unsupported_parameter", "previous_response_id", "keeps no responses"),
    ({"conversation": "conv_1"}, "unsupported_parameter", "conversation", "keeps no conversations"),
    ({"prompt": {"id": "p"}}, "unsupported_parameter", "prompt", "prompt templates"),
    ({"moderation": {"model": "x"}}, "unsupported_parameter", "moderation", "guard policies"),
    ({"top_logprobs": 2}, "unsupported_parameter", "top_logprobs", "logprobs"),
    ({"store": True}, "unsupported_value", "store", "keeps no responses"),
    ({"background": True}, "unsupported_value", "background", "stream"),
    ({"truncation": "auto"}, "unsupported_value", "truncation", "disabled"),
    ({"include": ["message.output_text.logprobs"]}, "unsupported_value", "include[0]", "no such data"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "unsupported_value", "tools[0].type", "function"),
    ({"tools": [{"type": "function", "name": "f", "defer_loading": True}]}, "unsupported_parameter",
     "tools[0].defer_loading", "function tool"),
    ({"tool_choice": {"type": "web_search_preview"}}, "unsupported_value", "tool_choice.type", "function"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "unsupported_value",
     "input[0].content[0].type", "text only"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "unsupported_parameter", "input[0]", "no items"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "unsupported_value", "input[0].type", "input items"),
    ({"reasoning": {"summary": "detailed"}}, "unsupported_parameter", "reasoning.summary", "effort"),
    ({"grammar": "x"}, "unknown_parameter", "grammar", "unknown parameter"),
    ({"stream_options": {"include_usage": True}}, "unknown_parameter", "stream_options.include_usage", "unknown"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "missing_required_parameter", "text.format.schema",
     "required"),
    ({"input": []}, "invalid_value", "input", "non-empty"),
    ({"input": [{"role": "tool", "content": "x"}]}, "invalid_value", "input[0].role", "one of"),
    ({"metadata": {"a": 1}}, "invalid_type", "metadata.a", "string"),
    ({"temperature": "hot"}, "invalid_type", "temperature", "number"),
])
def test_what_is_not_served_is_refused_by_name(extra: dict[str, Any], code: str, param: str, words: str) -> None:
    error = refusal(body(**extra))
    assert (error.code, error.param) == (code, param) and words in error.message


def test_every_field_of_the_spec_is_taken_or_refused_by_name_and_null_is_never_refused() -> None:
    fields = openai_spec.request_fields("CreateResponse")
    for field in fields - {"model", "input"}:
        chat_request(body(**{field: None}))  # null: not given
    assert refusal({"input": "x"}).param == "model" and refusal({"model": "m"}).param == "input"
    # a field the spec lacks is refused as unknown; one it has never is
    assert refusal(body(no_such_field=1)).code == "unknown_parameter"
    samples: dict[str, Any] = {"text": {}, "tools": [], "reasoning": {}, "metadata": {}, "stream_options": {},
                               "include": [], "tool_choice": "auto", "truncation": "disabled",
                               "prompt_cache_retention": "in_memory", "service_tier": "auto", "store": False,
                               "background": False}
    for field in fields - {"model", "input"}:
        value = samples.get(field, "x")
        try:
            chat_request(body(**{field: value}))
        except OpenAIError as error:
            assert error.code != "unknown_parameter" and (error.param or "").startswith(field), (field, error)


def test_the_chat_fields_refusals_name_the_responses_fields() -> None:
    doc = DIALECT.error_doc(OpenAIError(400, "max_tokens_too_large", "'max_tokens' is 99; model 'm' allows at most 9",
                                        param="max_tokens"))
    assert doc["error"]["param"] == "max_output_tokens" and doc["error"]["message"].startswith("'max_output_tokens'")
    assert DIALECT.error_doc(OpenAIError(404, "model_not_found", "no", param="model"))["error"]["param"] == "model"


# Bodies a client might send: the spec's fields (and some others) with values of any JSON type.
_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=3), max_leaves=6)
_part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]),
                               "text": st.text(max_size=5)})
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
                           "content": st.text(max_size=5) | st.lists(_part, max_size=3)},
                          optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.text(max_size=3),
                           "name": st.text(max_size=3), "arguments": st.text(max_size=3)}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.text(max_size=3),
                           "output": st.text(max_size=3) | st.lists(_part, max_size=2)}),
    _json)
_fields = sorted(openai_spec.request_fields("CreateResponse") | {"n_keep"})
_bodies = st.fixed_dictionaries(
    {"model": st.just("m") | _json, "input": st.text(max_size=5) | st.lists(_item, max_size=4) | _json},
    optional={f: _json for f in _fields if f not in ("model", "input")}
    | {"tools": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search"]),
                                                "name": st.text(max_size=3)},
                                               optional={"parameters": st.just({"type": "object"})}), max_size=2)},
)


@settings(max_examples=200, deadline=None)
@given(_bodies)
def test_any_body_is_a_chat_body_the_gateway_takes_or_a_400(doc: dict[str, Any]) -> None:
    try:
        chat, _ = chat_request(doc)
    except OpenAIError as error:
        assert error.status == 400 and error.param, error
        return
    assert chat_request(doc)[0] == chat  # deterministic
    check_request("chat", json.loads(json.dumps(chat)))  # nothing the chat path would refuse in its own words


# --- the answer -------------------------------------------------------------------------------------------------


def translation(**extra: Any) -> ResponsesTranslation:
    return DIALECT.start(body(**extra))


def answer(message: dict[str, Any], finish: str = "stop", usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "engine-name",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            **({"usage": usage} if usage else {})}


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
         "prompt_tokens_details": {"cached_tokens": 1}}


def test_a_whole_answer_is_a_response_the_schema_takes() -> None:
    t = translation(instructions="x", metadata={"k": "v"}, tools=[{"type": "function", "name": "f"}],
                    temperature=0.3, text={"format": {"type": "json_object"}})
    doc = t.whole(answer({"content": "hello"}, usage=USAGE))
    assert openai_spec.errors("Response", doc) == []
    assert (doc["status"], doc["model"], doc["instructions"], doc["metadata"], doc["temperature"]) == (
        "completed", "m", "x", {"k": "v"}, 0.3)
    assert doc["output"][0]["content"] == [{"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}]
    assert doc["usage"] == {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 1, "cache_write_tokens": 0},
                            "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 5}
    assert doc["text"] == {"format": {"type": "json_object"}} and doc["tools"][0]["name"] == "f"
    assert doc["id"].startswith("resp_") and doc["output"][0]["id"].startswith("msg_")


@pytest.mark.parametrize("message, finish, kinds, status", [
    ({"content": "cut"}, "length", ["message"], "incomplete"),
    ({"content": None, "tool_calls": [{"id": "c1", "type": "function",
                                       "function": {"name": "f", "arguments": "{}"}}]}, "tool_calls",
     ["function_call"], "completed"),
    ({"content": "first", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}},
                                         {"id": "c2", "function": {"name": "g", "arguments": "{}"}}]}, "tool_calls",
     ["message", "function_call", "function_call"], "completed"),
    ({"content": None, "refusal": "no"}, "stop", ["message"], "completed"),
    ({"content": None}, "stop", ["message"], "completed"),
    ({}, "content_filter", ["message"], "incomplete"),
])
def test_answers_of_every_kind_are_responses(message: dict[str, Any], finish: str, kinds: list[str],
                                             status: str) -> None:
    doc = translation().whole(answer(message, finish))
    assert openai_spec.errors("Response", doc) == [] and "usage" not in doc
    assert [item["type"] for item in doc["output"]] == kinds and doc["status"] == status
    if status == "incomplete":
        assert doc["incomplete_details"]["reason"] == {"length": "max_output_tokens"}.get(finish, finish)
    calls = [item for item in doc["output"] if item["type"] == "function_call"]
    assert [c["call_id"] for c in calls] == [c["id"] for c in message.get("tool_calls", [])]


def events(data: bytes) -> list[dict[str, Any]]:
    found = []
    for block in data.decode().strip().split("\n\n"):
        event, line = block.split("\n")
        doc = json.loads(line.removeprefix("data: "))
        assert event == f"event: {doc['type']}"
        assert openai_spec.errors("ResponseStreamEvent", doc) == [], doc
        found.append(doc)
    return found


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "e",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


# A chat stream: text pieces and tool call pieces (index, a first piece with id and name, then arguments).
_pieces = st.lists(st.one_of(st.text(max_size=4).map(lambda t: ("text", t)),
                             st.tuples(st.just("call"), st.integers(0, 2), st.text(max_size=4))), max_size=12)


@settings(max_examples=150, deadline=None)
@given(_pieces, st.sampled_from(["stop", "length", "tool_calls"]), st.booleans(), st.booleans())
def test_any_chat_stream_is_responses_events_the_schema_and_the_sdk_take(
        pieces: list[Any], finish: str, usage: bool, breaks: bool) -> None:
    t = translation(stream=True)
    out = t.event(chunk({"role": "assistant", "content": ""}))
    seen: set[int] = set()
    for piece in pieces:
        if piece[0] == "text":
            out += t.event(chunk({"content": piece[1]}))
        else:
            _, index, args = piece
            first = {"id": f"call_{index}", "function": {"name": f"f{index}"}} if index not in seen else {}
            seen.add(index)
            out += t.event(chunk({"tool_calls": [{"index": index, **first, "function": {
                **first.get("function", {}), "arguments": args}}]}))
    out += t.event(chunk(finish=finish))
    if usage:
        out += t.event({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "e", "choices": [],
                        "usage": USAGE})
    out += t.failed(OpenAIError(502, "upstream_error", "replica r1 failed mid-stream")) if breaks else t.end()
    docs = events(out)
    assert [d["sequence_number"] for d in docs] == list(range(len(docs)))
    kinds = [d["type"] for d in docs]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    text = "".join(p[1] for p in pieces if p[0] == "text")
    assert "".join(d["delta"] for d in docs if d["type"] == "response.output_text.delta") == text
    last = docs[-1]["response"]
    if breaks:
        assert kinds[-2:] == ["error", "response.failed"] and docs[-2]["error"]["code"] == "upstream_error"
        assert last["status"] == "failed" and last["error"]["code"] == "server_error"
        return
    assert kinds[-1] == ("response.incomplete" if finish == "length" else "response.completed")
    messages = [item for item in last["output"] if item["type"] == "message"]
    assert [m["content"][0]["text"] for m in messages] == ([text] if text or not seen else [])
    calls = {item["call_id"]: item["arguments"] for item in last["output"] if item["type"] == "function_call"}
    assert calls == {f"call_{i}": "".join(p[2] for p in pieces if p[0] == "call" and p[1] == i) for i in seen}
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == len(last["output"])
    assert ("usage" in last) == usage
