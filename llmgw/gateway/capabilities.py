"""What each engine does with each OpenAI request field, and the gateway's share: the per-engine table
(`HONOURED`), the fields the gateway answers for itself (`GATEWAY`), and `fit`, which refuses a field the
model's engine cannot honour (400 `unsupported_parameter`, naming the field, the model and its engine)
and takes the gateway's own fields out of the body before any engine sees it.

A field outside an engine's set is refused only when its value asks for something: null never does, nor a
value that asks for no more than the default (`n: 1`, `logprobs: false`, `tools: []`, `echo: false`: see
`_ASKS_NOTHING`). Nothing a client asked for is dropped silently. The table is from facts checked: the sim
engine's code, llama.cpp's server on the tiny GGUF the suite builds (tests/integration/
test_llamacpp_fields.py), vLLM's documentation (docs/api.md, "Fields by engine", says which is which).

Cheap on the hot path: one `isdisjoint` of the body's keys with the fields to look at, which a request of
model, messages, max_tokens, temperature and stream never names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmgw.domain.observed import ModelRoute
from llmgw.errors import OpenAIError
from llmgw.gateway.checks import FIELDS

__all__ = ["ENGINES", "GATEWAY", "HONOURED", "asks", "asks_tools", "calls_no_tools", "describe", "fit", "fitting",
           "no_tools", "unsupported"]

ENGINES = ("sim", "llama.cpp", "vllm")

# Every engine honours these: the request itself, and sampling settings (the sim engine answers the same
# whatever the temperature: a deterministic engine honours every sampling setting trivially).
_BASE = frozenset({"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop"})
_CHAT = _BASE | {"messages", "max_completion_tokens"}
_COMPLETION = _BASE | {"prompt"}
_EMBEDDING = frozenset({"model", "input", "encoding_format"})

HONOURED: dict[str, dict[str, frozenset[str]]] = {
    # llmgw/engines/sim: n choices, logprobs, stop strings, JSON answers to a schema, tool calls, token ids.
    "sim": {
        "chat": _CHAT | {"n", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
                         "parallel_tool_calls", "frequency_penalty", "presence_penalty"},
        "completion": _COMPLETION | {"n", "logprobs", "echo", "best_of", "frequency_penalty", "presence_penalty"},
        "embedding": _EMBEDDING | {"dimensions"},
    },
    # llama.cpp's server: one choice only (it refuses n > 1 itself), no echo/suffix/best_of (ignored), no
    # `dimensions` (ignored: its vectors keep the model's size). Tools become tool calls for the chat templates
    # llama.cpp recognises (Llama 3.x, Qwen, Hermes, Mistral...); another template answers in text, even with
    # tool_choice "required" (seen on the tiny GGUF). Its /props says which (the agent reads it: each
    # endpoint's `tool_calls`), and a request that asks for tools of a model none of whose replicas can call
    # them is refused by name (`calls_no_tools`); unknown (an older agent, /props unread): passed.
    "llama.cpp": {
        "chat": _CHAT | {"logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
                         "parallel_tool_calls", "logit_bias", "frequency_penalty", "presence_penalty"},
        "completion": _COMPLETION | {"logprobs", "logit_bias", "frequency_penalty", "presence_penalty"},
        "embedding": _EMBEDDING,
    },
    # vLLM's OpenAI server (its docs): everything but `suffix`, `best_of` (the V1 engine dropped it), audio
    # output, predictions, web search and verbosity; `parallel_tool_calls` and `user` ignored (its docs say
    # so); `dimensions` for Matryoshka models (it refuses others itself); tools with tool_choice "auto" need
    # `--enable-auto-tool-choice --tool-call-parser P` in the definition's args (else vLLM's own 400).
    "vllm": {
        "chat": _CHAT | {"n", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
                         "logit_bias", "frequency_penalty", "presence_penalty", "reasoning_effort"},
        "completion": _COMPLETION | {"n", "logprobs", "echo", "logit_bias", "frequency_penalty", "presence_penalty"},
        "embedding": _EMBEDDING | {"dimensions"},
    },
}


def _never(_value: Any) -> bool:
    return False


def _always(_value: Any) -> bool:
    return True


# Values that ask for nothing beyond what every engine does anyway (with the words docs/api.md shows); a
# field not listed asks for something whenever it is given (not null).
_ASKS_NOTHING: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v == 1, "1"),
    "best_of": (lambda v: v == 1, "1"),
    "logprobs": (lambda v: v is False, "false"),  # chat's switch; the legacy count asks even at 0
    "top_logprobs": (lambda v: v == 0, "0"),
    "echo": (lambda v: v is False, "false"),
    "suffix": (lambda v: v == "", '""'),
    "frequency_penalty": (lambda v: v == 0, "0"),
    "presence_penalty": (lambda v: v == 0, "0"),
    "logit_bias": (lambda v: v == {}, "{}"),
    "tools": (lambda v: v == [], "[]"),
    "functions": (lambda v: v == [], "[]"),
    "tool_choice": (lambda v: v == "none", '"none"'),
    "function_call": (lambda v: v == "none", '"none"'),
    "parallel_tool_calls": (lambda v: v is True, "true"),  # the default; false asks for one call at most
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"}'),
    "modalities": (lambda v: v == ["text"], '["text"]'),
    "verbosity": (lambda v: v == "medium", '"medium"'),
    "encoding_format": (lambda v: v == "float", '"float"'),
}

# The gateway's own fields, whatever the engine: OpenAI platform concerns. Each is taken out of the body
# before the engine (no engine sees a field it would ignore), or refused by name when its value asks for
# what llmgw does not do. The `str` is the refusal's reason; None: always taken out.
#   user, safety_identifier: who the end user is, for OpenAI's abuse monitoring; the request log keys
#     requests by API key instead. metadata: tags of stored completions, which llmgw keeps none of.
#   store: false/null taken out; true refused (llmgw stores no completions).
#   service_tier: "auto"/"default" taken out; another tier refused (priority is the key's class and the
#     `x-llmgw-priority` header).
#   prompt_cache_key: the replica choice's key (gateway/affinity.py), then taken out.
#   prompt_cache_retention: "in_memory" taken out (engines keep prefixes in memory, as long as they can);
#     "24h" refused. prompt_cache_options: taken out (engines cache prefixes by themselves).
#   moderation: refused (llmgw's guard policies moderate, per model: docs/guardrails.md).
_PLATFORM: dict[str, tuple[Callable[[Any], bool], str]] = {
    "user": (_always, ""),
    "safety_identifier": (_always, ""),
    "metadata": (_always, ""),
    "prompt_cache_key": (_always, ""),
    "prompt_cache_options": (_always, ""),
    "store": (lambda v: v is False, "llmgw stores no completions; send store: false or leave it out"),
    "service_tier": (lambda v: v in ("auto", "default"),
                     "llmgw has one service tier; a key's priority class (x-llmgw-priority) orders requests"),
    "prompt_cache_retention": (lambda v: v == "in_memory",
                               "engines keep cached prefixes in memory only; no retention is promised"),
    "moderation": (_never, "llmgw moderates through its guard policies (docs/guardrails.md), not per request"),
}
GATEWAY = frozenset(_PLATFORM)


# Honoured only where the replicas say they can (their endpoints' `tool_calls`, `calls_no_tools`).
_CONDITIONS = {("llama.cpp", "chat", "tools"): "honoured where the chat template calls tools (/props); "
                                              "else refused by name"}


def describe(engine: str, kind: str, field: str) -> str:
    """What happens to `field` of a `kind` request for a model on `engine`, in docs/api.md's words."""
    if field in HONOURED[engine][kind]:
        return _CONDITIONS.get((engine, kind, field), "honoured")
    platform = _PLATFORM.get(field)
    if platform is not None:
        taken = {"store": "false: taken out; true: refused", "service_tier": '"auto", "default": taken out; '
                 'others refused', "prompt_cache_retention": '"in_memory": taken out; "24h" refused',
                 "prompt_cache_key": "the affinity key, then taken out", "moderation": "refused"}
        return "gateway: " + taken.get(field, "taken out")
    nothing = _ASKS_NOTHING.get(field)
    return f"refused (but {nothing[1]})" if nothing is not None else "refused"

# Per engine and kind: the fields `fit` looks at (neither honoured by the engine nor nothing at all).
_WATCH: dict[tuple[str, str], frozenset[str]] = {
    (engine, kind): frozenset(FIELDS[kind]) - honoured
    for engine, kinds in HONOURED.items() for kind, honoured in kinds.items()
}


def asks(field: str, value: Any) -> bool:
    """Whether `value` of `field` asks the engine for anything beyond its defaults (null never does)."""
    nothing = _ASKS_NOTHING.get(field)
    return value is not None and (nothing is None or not nothing[0](value))


def fit(kind: str, engine: str, body: dict[str, Any], model: str) -> dict[str, Any]:
    """`body` as the model's engine is to get it: itself when nothing needs doing, else a copy without the
    gateway's own fields. Raises 400 `unsupported_parameter` for a field the engine cannot honour that
    asks for something, and for a gateway field's value llmgw does not serve. An engine or kind the table
    does not know (another endpoint's) is passed as is."""
    watch = _WATCH.get((engine, kind))
    if watch is None or watch.isdisjoint(body):
        return body
    strip = False
    for key, value in body.items():
        if key not in watch:
            continue
        platform = _PLATFORM.get(key)
        if platform is not None:
            if value is not None and not platform[0](value):
                raise unsupported(key, model, engine, platform[1])
            strip = True
        elif asks(key, value):
            raise unsupported(key, model, engine, "")
    return {k: v for k, v in body.items() if k not in GATEWAY} if strip else body


def fitting(kind: str, engine: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """`fit`'s body, or None where it refuses (a fallback that would refuse is passed over)."""
    try:
        return fit(kind, engine, body, "")
    except OpenAIError:
        return None


def asks_tools(kind: str, body: dict[str, Any]) -> bool:
    """Whether a request asks its engine for tool calls: a chat request's non-empty `tools` that `tool_choice`
    does not turn off ("none"). One lookup for a body without tools."""
    return kind == "chat" and asks("tools", body.get("tools")) and body.get("tool_choice") != "none"


def calls_no_tools(route: ModelRoute | None) -> bool:
    """Whether every ready endpoint of the model says its engine makes no tool calls (llama.cpp's /props of a
    chat template without tools): a request's tools would be ignored. False while unknown (no ready endpoint,
    or one that does not say) or where any endpoint calls them."""
    return route is not None and bool(route.endpoints) and all(e.tool_calls is False for e in route.endpoints)


def no_tools(model: str) -> OpenAIError:
    return OpenAIError(400, "unsupported_parameter",
                       f"'tools' is not supported by model {model!r}: its chat template (llama.cpp's /props) calls "
                       "no tools, so the tools would be ignored", param="tools")


def unsupported(field: str, model: str, engine: str, why: str) -> OpenAIError:
    if why:
        words = f"'{field}' is not supported: {why}"
    else:
        words = f"'{field}' is not supported by model {model!r}: its engine ({engine}) cannot honour it"
    return OpenAIError(400, "unsupported_parameter", words, param=field)
