"""What a `/v1` request must be: each endpoint's allowlist of OpenAI fields and their JSON types,
engine-private knobs refused by name, and the body parser's limits (no RecursionError, no NaN)."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.errors import OpenAIError
from llmgw.domain.model import Limits
from llmgw.gateway.checks import ENGINE_PRIVATE, FIELDS, check_limits, check_request
from llmgw.wire.asgi import parse_object
from tests.support.openai_spec import request_fields

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
BASE = {"chat": CHAT, "completion": {"model": "m", "prompt": "hi"}, "embedding": {"model": "m", "input": "hi"}}


def refusal(kind: str, body: dict[str, Any]) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        check_request(kind, body)
    assert caught.value.status == 400
    return caught.value


def test_every_field_openai_documents_for_chat_is_accepted() -> None:
    body = {
        **CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 5,
        "max_completion_tokens": 5, "n": 1, "temperature": 0.2, "top_p": 1, "frequency_penalty": -1.5,
        "presence_penalty": 0.0, "seed": 42, "stop": ["\n"], "logit_bias": {"50256": -100}, "logprobs": True,
        "top_logprobs": 3, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
        "parallel_tool_calls": False, "functions": [], "function_call": "none", "metadata": {"k": "v"},
        "store": False, "modalities": ["text"], "audio": {}, "prediction": {}, "reasoning_effort": "low",
        "verbosity": "low", "service_tier": "auto", "web_search_options": {}, "safety_identifier": "s",
        "prompt_cache_key": "p", "user": "u", "prompt_cache_retention": "in_memory",
        "prompt_cache_options": {"ttl": "30m"}, "moderation": {"model": "omni-moderation-latest"},
    }
    assert check_request("chat", body) == ("m", True)
    assert set(body) == set(FIELDS["chat"])


@pytest.mark.parametrize(("kind", "schema"), [("chat", "CreateChatCompletionRequest"),
                                              ("completion", "CreateCompletionRequest"),
                                              ("embedding", "CreateEmbeddingRequest")])
def test_the_fields_are_those_of_the_pinned_spec(kind: str, schema: str) -> None:
    """A newer copy of OpenAI's document (tests/support/openai_spec.py) shows here what is missing."""
    assert set(FIELDS[kind]) == request_fields(schema)


@pytest.mark.parametrize("field", sorted(FIELDS["chat"]))
def test_a_null_optional_field_is_never_refused(field: str) -> None:
    if field in ("model", "messages"):
        return
    assert check_request("chat", {**CHAT, field: None}) == ("m", False)


@pytest.mark.parametrize(("kind", "field"), [("completion", "prompt"), ("embedding", "input")])
@pytest.mark.parametrize("value", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]], [0]])
def test_token_ids_wherever_the_spec_takes_them(kind: str, field: str, value: Any) -> None:
    assert check_request(kind, {**BASE[kind], field: value}) == ("m", False)


@pytest.mark.parametrize(("kind", "field"), [("completion", "prompt"), ("embedding", "input")])
@pytest.mark.parametrize("value", [[1, "a"], ["a", 1], [[1], 2], [[1, "a"]], [1.5], [True], [[True]], [{}],
                                   [[[1]]], [None]])
def test_token_arrays_are_typed_precisely(kind: str, field: str, value: Any) -> None:
    error = refusal(kind, {**BASE[kind], field: value})
    assert (error.code, error.param) == ("invalid_type", field)
    assert "token ids" in error.message


def test_legacy_completions_and_embeddings_fields() -> None:
    completion = {"model": "m", "prompt": ["a", "b"], "suffix": "", "echo": False, "best_of": 2, "logprobs": 3,
                  "max_tokens": 3, "stream": False, "user": "u"}
    assert check_request("completion", completion) == ("m", False)
    embedding = {"model": "m", "input": ["a"], "encoding_format": "float", "dimensions": 8, "user": "u"}
    assert check_request("embedding", embedding) == ("m", False)


def test_null_means_not_given() -> None:
    assert check_request("chat", {**CHAT, "temperature": None, "stream": None, "tools": None}) == ("m", False)


@pytest.mark.parametrize("field", sorted(ENGINE_PRIVATE))
@pytest.mark.parametrize("kind", sorted(BASE))
def test_engine_private_knobs_are_refused_by_name(kind: str, field: str) -> None:
    error = refusal(kind, {**BASE[kind], field: 1})
    assert (error.code, error.param) == ("unknown_parameter", field)
    assert "clients may not set" in error.message


def test_a_field_of_another_endpoint_is_unknown_here() -> None:
    error = refusal("embedding", {**BASE["embedding"], "messages": []})
    assert (error.code, error.param) == ("unknown_parameter", "messages")
    assert "/v1/embeddings takes OpenAI's fields only" in error.message


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("chat", "temperature", "hot"),
        ("chat", "temperature", True),
        ("chat", "temperature", float("inf")),
        ("chat", "top_p", float("nan")),
        ("chat", "max_tokens", 1.5),
        ("chat", "max_tokens", True),
        ("chat", "max_tokens", 2**64),
        ("chat", "seed", -(2**63) - 1),
        ("chat", "n", "2"),
        ("chat", "stream", "yes"),
        ("chat", "logprobs", 1),
        ("chat", "stop", 5),
        ("chat", "stop", ["a", 1]),
        ("chat", "moderation", "on"),
        ("chat", "prompt_cache_retention", 24),
        ("chat", "tools", {}),
        ("chat", "tool_choice", 3),
        ("chat", "response_format", "json"),
        ("chat", "user", 7),
        ("chat", "stream_options", []),
        ("completion", "logprobs", True),
        ("completion", "prompt", 5),
        ("embedding", "dimensions", "8"),
        ("embedding", "input", {"a": 1}),
    ],
)
def test_wrong_types_are_refused_naming_the_field(kind: str, field: str, value: Any) -> None:
    error = refusal(kind, {**BASE[kind], field: value})
    assert (error.code, error.param) == ("invalid_type", field)


def test_stream_options_are_checked_too() -> None:
    error = refusal("chat", {**CHAT, "stream": True, "stream_options": {"include_usage": "yes"}})
    assert (error.code, error.param) == ("invalid_type", "stream_options.include_usage")
    error = refusal("chat", {**CHAT, "stream": True, "stream_options": {"n_keep": 1}})
    assert (error.code, error.param) == ("unknown_parameter", "stream_options.n_keep")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"messages": [{"role": "user"}]}, "missing_required_parameter", "model"),
        ({**CHAT, "model": ""}, "invalid_type", "model"),
        ({"model": "m"}, "missing_required_parameter", "messages"),
        ({"model": "m", "messages": []}, "invalid_type", "messages"),
        ({"model": "m", "messages": [1]}, "invalid_type", "messages"),
        ({"model": "m", "messages": [{"content": "x"}]}, "invalid_type", "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user"}, {"role": 3}]}, "invalid_type", "messages[1].role"),
    ],
)
def test_chat_shape(body: dict[str, Any], code: str, param: str) -> None:
    error = refusal("chat", body)
    assert (error.code, error.param) == (code, param)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"[" * 100_000, "nested too deeply"),
        (b'{"a":' * 100_000, "nested too deeply"),
        (b'{"temperature": NaN}', "not valid JSON"),
        (b'{"temperature": -Infinity}', "not valid JSON"),
        (b'{"n": ' + b"9" * 5000 + b"}", "not valid JSON"),  # past Python's int-from-text limit
        (b'{"model": "\xff"}', "not valid JSON"),
    ],
)
def test_bodies_the_parser_refuses(raw: bytes, words: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        parse_object(raw)
    assert (caught.value.status, caught.value.code) == (400, "invalid_json")
    assert words in caught.value.message


def test_nesting_the_parser_takes_is_kept() -> None:
    deep = parse_object(b'{"a":' + b"[" * 200 + b"]" * 200 + b"}")["a"]
    for _ in range(199):
        deep = deep[0]
    assert deep == []


# --- the model's limits -------------------------------------------------------

LIMITS = Limits(max_tokens=100, max_n=2)


@pytest.mark.parametrize(
    ("body", "code", "param", "words"),
    [
        ({"max_tokens": 101}, "max_tokens_too_large", "max_tokens", "'max_tokens' is 101; model 'm' allows at most 100"),
        ({"max_completion_tokens": 10**9}, "max_tokens_too_large", "max_completion_tokens", "allows at most 100"),
        ({"max_tokens": 5, "n": 3}, "n_too_large", "n", "'n' is 3; model 'm' allows at most 2 choices"),
    ],
)
def test_asking_more_than_the_model_allows_is_refused(body: dict[str, Any], code: str, param: str,
                                                      words: str) -> None:
    with pytest.raises(OpenAIError) as info:
        check_limits(body, LIMITS, "m")
    e = info.value
    assert (e.status, e.code, e.param, e.doc()["error"]["type"]) == (400, code, param, "invalid_request_error")
    assert words in e.message


@pytest.mark.parametrize(
    "body",
    [{}, {"max_tokens": 100, "n": 2}, {"max_completion_tokens": 1, "n": 1}, {"max_tokens": None, "n": None}],
)
def test_within_the_limits_or_omitted_passes(body: dict[str, Any]) -> None:
    check_limits(body, LIMITS, "m")  # an omitted max_tokens is the engine's default, not refused


def test_no_limits_means_no_limit() -> None:
    check_limits({"max_tokens": 2**62, "n": 10**6}, Limits(), "m")
