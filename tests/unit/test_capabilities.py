"""The field x engine table (gateway/capabilities.py): every OpenAI field has its place for every engine, a
field an engine cannot honour is refused by name when it asks for something, a null never is, the gateway's
own fields never reach an engine, and the common request costs one set test. docs/api.md's table is made
from it (`markdown_table`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.observed import Endpoint, ModelRoute, ReplicaObs
from llmgw.errors import OpenAIError
from llmgw.gateway import checks
from llmgw.gateway.capabilities import (ENGINES, GATEWAY, HONOURED, asks, asks_tools, calls_no_tools, describe, fit,
                                        no_tools)
from llmgw.gateway.checks import FIELDS, check_request
from llmgw.wire.protocol import route_doc, route_from_doc

KINDS = ("chat", "completion", "embedding")
BASE: dict[str, dict[str, Any]] = {"chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                                   "completion": {"model": "m", "prompt": "hi"},
                                   "embedding": {"model": "m", "input": "hi"}}
# A value of each JSON type that asks for something of any field of that type.
ASKING: dict[Any, Any] = {checks.INTEGER: 7, checks.NUMBER: 0.5, checks.BOOLEAN: True, checks.STRING: "x",
                          checks.OBJECT: {"a": "b"}, checks.ARRAY: [{"a": 1}], checks.STRINGS: ["s"],
                          checks.TEXT_OR_TOKENS: [1, 2], checks.STRING_OR_OBJECT: "x"}


def test_every_engine_places_every_field_of_every_endpoint() -> None:
    assert set(HONOURED) == set(ENGINES)
    for engine in ENGINES:
        assert set(HONOURED[engine]) == set(KINDS)
        for kind in KINDS:
            assert HONOURED[engine][kind] <= set(FIELDS[kind]), (engine, kind)  # no misspelt field
            assert not HONOURED[engine][kind] & GATEWAY


def test_the_common_request_is_passed_as_it_is() -> None:
    body = {**BASE["chat"], "max_tokens": 64, "temperature": 0.2, "stream": True, "stop": ["\n"], "seed": 1}
    for engine in ENGINES:
        assert fit("chat", engine, body, "m") is body
    assert fit("rerank", "sim", {"query": "q"}, "m") == {"query": "q"}  # a kind the table does not know


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", KINDS)
def test_what_an_engine_cannot_honour_is_refused_by_name(engine: str, kind: str) -> None:
    refused = sorted(set(FIELDS[kind]) - HONOURED[engine][kind] - GATEWAY)
    for field in refused:
        value = False if field == "parallel_tool_calls" else ASKING[FIELDS[kind][field]]  # true is the default
        with pytest.raises(OpenAIError) as caught:
            fit(kind, engine, {**BASE[kind], field: value}, "my-model")
        error = caught.value
        assert (error.status, error.code, error.param) == (400, "unsupported_parameter", field)
        assert f"'{field}'" in error.message and "'my-model'" in error.message and f"({engine})" in error.message
        assert fit(kind, engine, {**BASE[kind], field: None}, "my-model") == {**BASE[kind], field: None}


@pytest.mark.parametrize(("field", "value"), [("n", 1), ("logprobs", False), ("tools", []), ("tool_choice", "none"),
                                              ("response_format", {"type": "text"}), ("modalities", ["text"]),
                                              ("parallel_tool_calls", True), ("verbosity", "medium")])
def test_a_value_that_asks_for_nothing_passes_anywhere(field: str, value: Any) -> None:
    body = {**BASE["chat"], field: value}
    for engine in ENGINES:
        assert fit("chat", engine, body, "m") is body


def test_the_gateways_own_fields_are_taken_out_or_refused() -> None:
    body = {**BASE["chat"], "user": "u", "safety_identifier": "s", "metadata": {"k": "v"}, "store": False,
            "service_tier": "default", "prompt_cache_key": "k", "prompt_cache_retention": "in_memory",
            "prompt_cache_options": {"ttl": "30m"}, "moderation": None}
    for engine in ENGINES:
        assert fit("chat", engine, body, "m") == BASE["chat"]
    assert fit("embedding", "vllm", {**BASE["embedding"], "user": "u"}, "m") == BASE["embedding"]
    for field, value in (("store", True), ("service_tier", "flex"), ("prompt_cache_retention", "24h"),
                         ("moderation", {"model": "omni-moderation-latest"})):
        with pytest.raises(OpenAIError) as caught:
            fit("chat", "vllm", {**BASE["chat"], field: value}, "m")
        assert (caught.value.code, caught.value.param) == ("unsupported_parameter", field)


def _values(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    """Bodies of `kind` with a random subset of its fields, each null, a value asking nothing, or one asking."""
    def value(field: str) -> st.SearchStrategy[Any]:
        typed = FIELDS[kind][field]
        if field == "stream_options":
            return st.sampled_from([None, {}, {"include_usage": True}])
        options = [None, ASKING[typed], 1, 0, False, "none", "auto", "in_memory", {}, [], {"type": "text"}, ["text"]]
        return st.sampled_from([v for v in options if v is None or typed[0](v)])

    optional = sorted(set(FIELDS[kind]) - set(BASE[kind]))
    return st.lists(st.sampled_from(optional), unique=True, max_size=8).flatmap(
        lambda fields: st.fixed_dictionaries({f: value(f) for f in fields}))


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), engine=st.sampled_from(ENGINES), data=st.data())
def test_any_subset_of_fields_is_refused_by_name_or_sent_without_the_gateways(kind: str, engine: str,
                                                                              data: st.DataObject) -> None:
    extra = data.draw(_values(kind))
    body = {**BASE[kind], **extra}
    check_request(kind, body)  # the values are of their types
    asking = [f for f, v in extra.items() if f not in HONOURED[engine][kind] and f not in GATEWAY and asks(f, v)]
    try:
        sent = fit(kind, engine, body, "m")
    except OpenAIError as error:
        assert (error.status, error.code) == (400, "unsupported_parameter")
        assert error.param in extra and extra[error.param] is not None  # a null is never refused
        assert error.param in asking or error.param in GATEWAY
        return
    assert not asking
    assert not set(sent) & GATEWAY
    assert {k: v for k, v in body.items() if k not in GATEWAY} == sent


# --- docs/api.md's table ------------------------------------------------------------

# The test that shows each field's behaviour end to end (unit tests above show every cell).
SHOWN_BY = {
    "tools": "test_gateway_fields.py::test_a_tool_call_whole_in_openai_shape, "
             "::test_a_tool_call_streamed_as_openai_does_and_assembled_by_the_sdk, "
             "test_llamacpp_tools.py::test_a_llamacpp_template_without_tools_is_reported_and_tools_refused_by_name",
    "tool_choice": "test_gateway_fields.py::test_a_tool_call_streamed_as_openai_does_and_assembled_by_the_sdk",
    "response_format": "test_gateway_fields.py::test_json_schema_answers_parse_with_the_sdk, "
                       "test_llamacpp_fields.py::test_json_schema_logprobs_and_stop_reach_llama_cpp",
    "logprobs": "test_gateway_fields.py::test_logprobs_n_and_stop_lists, "
                "test_llamacpp_fields.py::test_json_schema_logprobs_and_stop_reach_llama_cpp",
    "top_logprobs": "test_gateway_fields.py::test_logprobs_n_and_stop_lists",
    "n": "test_gateway_fields.py::test_logprobs_n_and_stop_lists, "
         "::test_a_field_the_engine_cannot_honour_is_refused_by_name",
    "stop": "test_gateway_fields.py::test_logprobs_n_and_stop_lists, "
            "test_llamacpp_fields.py::test_json_schema_logprobs_and_stop_reach_llama_cpp",
    "echo": "test_gateway_fields.py::test_a_field_the_engine_cannot_honour_is_refused_by_name",
    "prompt": "test_gateway_fields.py::test_token_id_inputs_as_the_spec_allows",
    "input": "test_gateway_fields.py::test_token_id_inputs_as_the_spec_allows",
    "dimensions": "test_llamacpp_fields.py::test_what_llama_cpp_cannot_do_is_refused_by_name",
    "prediction": "test_gateway_fields.py::test_a_field_the_engine_cannot_honour_is_refused_by_name",
    "moderation": "test_gateway_fields.py::test_a_field_the_engine_cannot_honour_is_refused_by_name",
    "store": "test_gateway_fields.py::test_a_field_the_engine_cannot_honour_is_refused_by_name",
}
for _field in ("user", "safety_identifier", "metadata", "service_tier", "prompt_cache_key",
               "prompt_cache_retention"):
    SHOWN_BY[_field] = "test_gateway_fields.py::test_the_gateways_own_fields_never_reach_the_engine"


def markdown_table() -> str:
    """docs/api.md's table of fields by engine (a test keeps the two the same)."""
    lines = ["| endpoint | field | sim | llama.cpp | vLLM | shown by (tests/integration/) |",
             "| --- | --- | --- | --- | --- | --- |"]
    paths = {"chat": "chat", "completion": "completions", "embedding": "embeddings"}
    for kind in KINDS:
        for field in sorted(set(FIELDS[kind]) - set(BASE[kind])):
            cells = [describe(engine, kind, field) for engine in ENGINES]
            lines.append(f"| {paths[kind]} | `{field}` | {' | '.join(cells)} | {SHOWN_BY.get(field, 'unit tests')} |")
    return "\n".join(lines) + "\n"


def test_docs_api_has_the_table() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    assert markdown_table() in docs, "regenerate it: tests.unit.test_capabilities.markdown_table()"


# --- tools on a model whose chat template calls none (llama.cpp's /props) ------------------------------------

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _route(*calls: bool | None) -> ModelRoute:
    return ModelRoute("m", "chat", "ready", tuple(Endpoint(f"r{i}", f"http://h:{i}", tool_calls=c)
                                                  for i, c in enumerate(calls)))


def test_a_request_asks_for_tools_when_it_names_some_it_does_not_turn_off() -> None:
    assert asks_tools("chat", {**BASE["chat"], "tools": [TOOL]})
    for choice in ("auto", "required", {"type": "function", "function": {"name": "f"}}, None):
        assert asks_tools("chat", {**BASE["chat"], "tools": [TOOL], "tool_choice": choice})
    assert not asks_tools("chat", {**BASE["chat"], "tools": [TOOL], "tool_choice": "none"})
    for tools in ([], None):
        assert not asks_tools("chat", {**BASE["chat"], "tools": tools})
    assert not asks_tools("chat", BASE["chat"])
    assert not asks_tools("completion", {**BASE["completion"], "tools": [TOOL]})


def test_tools_are_refused_only_where_every_ready_endpoint_calls_none() -> None:
    assert calls_no_tools(_route(False)) and calls_no_tools(_route(False, False))
    for route in (_route(True), _route(None), _route(False, None), _route(False, True), _route(),
                  ModelRoute("m", "chat", "starting"), None):
        assert not calls_no_tools(route)
    error = no_tools("tiny")
    assert (error.status, error.code, error.param) == (400, "unsupported_parameter", "tools")
    assert "'tiny'" in error.message and "chat template" in error.message and "/props" in error.message


@given(st.lists(st.sampled_from([True, False, None]), max_size=4))
def test_tools_pass_unless_every_endpoint_says_it_calls_none(calls: list[bool | None]) -> None:
    assert calls_no_tools(_route(*calls)) == (bool(calls) and set(calls) == {False})


def test_the_fact_travels_from_the_agents_report_to_remote_gateways() -> None:
    for calls in (True, False, None):
        obs = ReplicaObs("r1", "m", "n1", "ready", "http://h:1", tool_calls=calls)
        assert ReplicaObs.from_doc(obs.to_doc(), "n1") == obs
        route = _route(calls)
        assert route_from_doc(route_doc(route)) == route
    old = ReplicaObs("r1", "m", "n1", "ready", "http://h:1").to_doc()
    del old["tool_calls"]  # an agent that predates it: unknown
    assert ReplicaObs.from_doc(old, "n1").tool_calls is None
    assert "tool_calls" not in route_doc(_route(None))["endpoints"][0]  # the same bytes as before it, unknown
