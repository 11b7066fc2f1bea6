"""What a `/v1` request must be before it reaches an engine: its path and method, its key's
place in the headers, each endpoint's allowlist of OpenAI fields with their JSON types, and which
model roles serve it. Pure checks; every refusal is an `OpenAIError` naming the field it is about."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from llmgw.domain.model import Limits
from llmgw.errors import OpenAIError

# Path -> kind of request; kind -> the model roles that may serve it.
POST_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding",
              "/v1/rerank": "rerank", "/v1/tokenize": "tokenize", "/v1/detokenize": "detokenize"}
# Tokenizing needs a tokenizer, which every role's model has.
_TOKENIZERS = ("chat", "guard", "embedding", "rerank")
ROLES_FOR = {"chat": ("chat", "guard"), "completion": ("chat", "guard"), "embedding": ("embedding",),
             "rerank": ("rerank",), "tokenize": _TOKENIZERS, "detokenize": _TOKENIZERS}
# The kinds whose engines speak other paths and bodies than the client's (gateway/engine_paths.py): a model
# that cannot serve one gets `unsupported_endpoint` rather than `model_not_supported`.
ENGINE_MAPPED = frozenset({"rerank", "tokenize", "detokenize"})
# Other APIs' paths, served by translation to chat completions (gateway/dialect.py).
DIALECT_PATHS = ("/v1/responses", "/v1/messages")
# Every path of the /v1 API a client may ask (metrics count requests per endpoint, any other as "other").
ENDPOINTS = frozenset({*POST_PATHS, *DIALECT_PATHS, "/v1/models"})

# A field's JSON type: a test of the value and the words a refusal uses. The gateway checks
# types (an engine given a string for a number may fail with a 500, or worse, guess); values
# and ranges are the engine's to judge, and its refusal reaches the client as it said it.
_Type = tuple[Callable[[Any], bool], str]


def _int(value: Any) -> bool:
    # bool is an int in Python, a JSON true is not a count; engines keep integers in 64 bits.
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _number(value: Any) -> bool:
    # `1e999` is valid JSON and infinite in Python: no sampling setting is.
    return (isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63) or (
        isinstance(value, float) and math.isfinite(value)
    )


INTEGER: _Type = (_int, "an integer")
NUMBER: _Type = (_number, "a finite number")
BOOLEAN: _Type = (lambda v: isinstance(v, bool), "true or false")
STRING: _Type = (lambda v: isinstance(v, str), "a string")
OBJECT: _Type = (lambda v: isinstance(v, dict), "an object")
ARRAY: _Type = (lambda v: isinstance(v, list), "an array")
STRING_OR_ARRAY: _Type = (lambda v: isinstance(v, (str, list)), "a string or an array")
STRING_OR_OBJECT: _Type = (lambda v: isinstance(v, (str, dict)), "a string or an object")


def _strings(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _tokens(value: list[Any]) -> bool:
    return all(_int(v) for v in value)


def _text_or_tokens(value: Any) -> bool:
    """A string, an array of strings, an array of token ids, or an array of such arrays (the spec's four
    forms of a completion's `prompt` and an embedding's `input`; a client's tokenizer sent the ids)."""
    if isinstance(value, str):
        return True
    if not isinstance(value, list):
        return False
    first = value[0] if value else ""
    if isinstance(first, str):
        return all(isinstance(v, str) for v in value)
    if isinstance(first, list):
        return all(isinstance(v, list) and _tokens(v) for v in value)
    return _tokens(value)


STRINGS: _Type = (_strings, "a string or an array of strings")
TEXT_OR_TOKENS: _Type = (_text_or_tokens, "a string, an array of strings, an array of token ids (integers) or "
                                          "an array of arrays of token ids")

# Each endpoint's fields: every request property of OpenAI's current OpenAPI document for it
# (`tests/unit/test_checks.py` compares them with the pinned copy, so a newer spec shows what is
# missing here). A field outside its list is refused by name: engines take private knobs in the
# same body (llama.cpp's `n_keep`, `slot_id`, `grammar`, `cache_prompt`; a proxy's `api_base`), and
# a client must not steer a shared replica, or another tenant's cache, with them. Whether the
# model's engine honours a field is gateway/capabilities.py's to say.
_COMMON: dict[str, _Type] = {"model": STRING, "user": STRING}
_SAMPLING: dict[str, _Type] = {
    "stream": BOOLEAN,
    "stream_options": OBJECT,
    "max_tokens": INTEGER,
    "n": INTEGER,
    "temperature": NUMBER,
    "top_p": NUMBER,
    "frequency_penalty": NUMBER,
    "presence_penalty": NUMBER,
    "seed": INTEGER,
    "stop": STRINGS,
    "logit_bias": OBJECT,
}
# A dict per kind of request: other endpoints' kinds sit beside these.
FIELDS: dict[str, dict[str, _Type]] = {
    "chat": {
        **_COMMON,
        **_SAMPLING,
        "messages": ARRAY,
        "max_completion_tokens": INTEGER,
        "logprobs": BOOLEAN,
        "top_logprobs": INTEGER,
        "response_format": OBJECT,
        "tools": ARRAY,
        "tool_choice": STRING_OR_OBJECT,
        "parallel_tool_calls": BOOLEAN,
        "functions": ARRAY,
        "function_call": STRING_OR_OBJECT,
        "metadata": OBJECT,
        "store": BOOLEAN,
        "modalities": ARRAY,
        "audio": OBJECT,
        "prediction": OBJECT,
        "reasoning_effort": STRING,
        "verbosity": STRING,
        "service_tier": STRING,
        "web_search_options": OBJECT,
        "safety_identifier": STRING,
        "prompt_cache_key": STRING,
        "prompt_cache_retention": STRING,
        "prompt_cache_options": OBJECT,
        "moderation": OBJECT,
    },
    "completion": {
        **_COMMON,
        **_SAMPLING,
        "prompt": TEXT_OR_TOKENS,
        "suffix": STRING,
        "echo": BOOLEAN,
        "best_of": INTEGER,
        "logprobs": INTEGER,  # the legacy endpoint's logprobs is a count (0..5), not a switch
    },
    "embedding": {**_COMMON, "input": TEXT_OR_TOKENS, "encoding_format": STRING, "dimensions": INTEGER},
    # Jina's and Cohere's rerank, as vLLM and llama.cpp serve it; vLLM's tokenize and detokenize.
    "rerank": {"model": STRING, "query": STRING, "documents": ARRAY, "top_n": INTEGER, "return_documents": BOOLEAN},
    "tokenize": {"model": STRING, "prompt": STRING, "messages": ARRAY, "add_special_tokens": BOOLEAN,
                 "add_generation_prompt": BOOLEAN},
    "detokenize": {"model": STRING, "tokens": ARRAY},
}
STREAM_OPTIONS: dict[str, _Type] = {"include_usage": BOOLEAN, "include_obfuscation": BOOLEAN}

# Known engine and proxy knobs, for a refusal that says what they are rather than "unknown".
ENGINE_PRIVATE = frozenset(
    {
        "n_keep", "n_discard", "slot_id", "id_slot", "cache_prompt", "grammar", "grammar_file", "json_schema",
        "n_probs", "n_predict", "samplers", "lora", "ignore_eos", "min_keep", "t_max_predict_ms", "dry_multiplier",
        "api_base", "base_url", "api_key", "api_version", "custom_llm_provider", "extra_headers", "timeout",
    }
)


def allow(method: str, allowed: str) -> None:
    if method != allowed:
        words = f"method {method} is not allowed here; use {allowed}"
        raise OpenAIError(405, "method_not_allowed", words, headers=[(b"allow", allowed.encode())])


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's key: `Authorization: Bearer KEY` (OpenAI's SDKs), else `x-api-key: KEY` (Anthropic's)."""
    other = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
        if name == b"x-api-key":
            other = value.decode("latin-1").strip()
    return other


WAIT_HEADER = b"x-llmgw-wait"


def wait_budget(headers: list[tuple[bytes, bytes]]) -> float | None:
    """How long the client waits for a model with no ready replica, from `x-llmgw-wait`: None (absent, or
    `true`: the model's activation window), 0 (`false`: not at all), or a number of seconds (capped by the
    window where it is used). Anything else: 400 `invalid_wait`, before the body is read."""
    for name, value in headers:
        if name != WAIT_HEADER:
            continue
        text = value.decode("latin-1").strip().lower()
        if text == "true":
            return None
        if text == "false":
            return 0.0
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= 0) or text.startswith(("+", "-")) or "_" in text:
            raise OpenAIError(400, "invalid_wait", f"x-llmgw-wait is true, false or a number of seconds (0 or more), "
                                                   f"not {text[:40]!r}", param="x-llmgw-wait")
        return seconds
    return None


def check_request(kind: str, body: dict[str, Any]) -> tuple[str, bool]:
    """The model name and whether to stream; raises on what an engine should never see."""
    name = body.get("model")
    if name is None:
        raise OpenAIError(400, "missing_required_parameter", "'model' is required", param="model")
    if not isinstance(name, str) or not name:
        raise OpenAIError(400, "invalid_type", "'model' must be a non-empty string", param="model")
    check_fields(kind, body)
    if kind == "chat":
        messages = body.get("messages")
        if messages is None:
            raise OpenAIError(400, "missing_required_parameter", "'messages' is required", param="messages")
        if not messages or not all(isinstance(m, dict) for m in messages):
            raise OpenAIError(400, "invalid_type", "'messages' must be a non-empty array of objects", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                where = f"messages[{i}].role"
                raise OpenAIError(400, "invalid_type", f"'{where}' must be a string", param=where)
    elif kind == "completion":
        required(body, "prompt")
    elif kind == "embedding":
        required(body, "input")
    else:
        _BODY_CHECKS[kind](body)
    stream = body.get("stream")
    return name, stream is True


def check_fields(kind: str, body: dict[str, Any]) -> None:
    """Every field is one of the endpoint's OpenAI fields, of its JSON type (null: not given)."""
    fields = FIELDS[kind]
    for key, value in body.items():
        spec = fields.get(key)
        if spec is None:
            raise _unknown(key, kind)
        if value is not None and not spec[0](value):
            raise OpenAIError(400, "invalid_type", f"'{key}' must be {spec[1]}", param=key)
    options = body.get("stream_options")
    if options:
        for key, value in options.items():
            where = f"stream_options.{key}"
            spec = STREAM_OPTIONS.get(key)
            if spec is None:
                raise OpenAIError(400, "unknown_parameter", f"unknown parameter '{where}'", param=where)
            if value is not None and not spec[0](value):
                raise OpenAIError(400, "invalid_type", f"'{where}' must be {spec[1]}", param=where)


def check_limits(body: dict[str, Any], limits: Limits, name: str) -> None:
    """Refuse what asks more than the model's definition allows (`limits`). An omitted
    max_tokens is not refused, nor filled in: the engine's own default applies."""
    if limits.max_tokens is not None:
        for key in ("max_tokens", "max_completion_tokens"):
            value: Any = body.get(key)
            if _int(value) and value > limits.max_tokens:  # check_fields has refused other types
                words = f"'{key}' is {value}; model {name!r} allows at most {limits.max_tokens}"
                raise OpenAIError(400, "max_tokens_too_large", words, param=key)
    n: Any = body.get("n")
    if limits.max_n is not None and _int(n) and n > limits.max_n:
        words = f"'n' is {n}; model {name!r} allows at most {limits.max_n} choices per request"
        raise OpenAIError(400, "n_too_large", words, param="n")


def within_limits(body: dict[str, Any], limits: Limits) -> bool:
    """Whether `check_limits` lets the request through (a fallback that would refuse it is passed over)."""
    if limits.max_tokens is None and limits.max_n is None:
        return True
    try:
        check_limits(body, limits, "")
    except OpenAIError:
        return False
    return True


def _unknown(key: str, kind: str) -> OpenAIError:
    path = next(p for p, k in POST_PATHS.items() if k == kind)
    fields = "the fields docs/api.md lists for it" if kind in ENGINE_MAPPED else "OpenAI's fields"
    if key in ENGINE_PRIVATE:
        words = f"'{key}' is an engine or proxy setting that clients may not set; {path} takes {fields} only"
    else:
        words = f"unknown parameter '{key}': {path} takes {fields} only"
    return OpenAIError(400, "unknown_parameter", words, param=key)


def required(body: dict[str, Any], key: str) -> None:
    if body.get(key) is None:
        raise OpenAIError(400, "missing_required_parameter", f"'{key}' is required", param=key)


def _check_rerank(body: dict[str, Any]) -> None:
    required(body, "query")
    documents = body.get("documents")
    if documents is None:
        raise OpenAIError(400, "missing_required_parameter", "'documents' is required", param="documents")
    if not documents:
        raise OpenAIError(400, "invalid_type", "'documents' must be a non-empty array", param="documents")
    for i, doc in enumerate(documents):
        if not (isinstance(doc, str) or (isinstance(doc, dict) and isinstance(doc.get("text"), str)
                                         and set(doc) == {"text"})):
            where = f"documents[{i}]"
            raise OpenAIError(400, "invalid_type", f"'{where}' must be a string or an object {{\"text\": string}}",
                              param=where)
    top_n: Any = body.get("top_n")
    if top_n is not None and top_n < 1:  # (an integer: check_fields said so)
        raise OpenAIError(400, "invalid_value", f"'top_n' must be at least 1, not {top_n}", param="top_n")


def _check_tokenize(body: dict[str, Any]) -> None:
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        words = "give one of 'prompt' (a string) or 'messages' (a chat), not both" if has_prompt else \
            "'prompt' or 'messages' is required"
        raise OpenAIError(400, "invalid_type" if has_prompt else "missing_required_parameter", words, param="prompt")
    if has_messages:
        messages = body["messages"]
        if not messages or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise OpenAIError(400, "invalid_type", "'messages' must be a non-empty array of objects with a string "
                                                   "'role'", param="messages")


def _check_detokenize(body: dict[str, Any]) -> None:
    tokens = body.get("tokens")
    if tokens is None:
        raise OpenAIError(400, "missing_required_parameter", "'tokens' is required", param="tokens")
    # Token ids are counts from 0 within a vocabulary: an engine given a negative one may fail badly.
    if not all(_int(t) and 0 <= t < 2**31 for t in tokens):
        raise OpenAIError(400, "invalid_type", "'tokens' must be an array of token ids (integers from 0)",
                          param="tokens")


_BODY_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "rerank": _check_rerank, "tokenize": _check_tokenize, "detokenize": _check_detokenize}


def role_refusal(kind: str, name: str, role: str, path: str) -> OpenAIError:
    """The refusal of a model whose role does not serve `kind`."""
    if kind in ENGINE_MAPPED:
        return OpenAIError(400, "unsupported_endpoint", f"model {name!r} is a {role} model and does not serve {path}"
                                                        + ("; rerank needs a model of role rerank"
                                                           if kind == "rerank" else ""), param="model")
    return OpenAIError(400, "model_not_supported", role_words(name, role, path), param="model")


def role_words(name: str, role: str, path: str) -> str:
    if role == "embedding":
        return f"model {name!r} is an embedding model; use /v1/embeddings"
    return f"model {name!r} is a {role} model and does not serve {path}"


def model_doc(name: str) -> dict[str, Any]:
    # The catalog keeps no creation time; 0 keeps the field an integer as SDKs expect.
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}
