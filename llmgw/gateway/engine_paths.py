"""The endpoints whose engines speak other paths and bodies than the client: `/v1/rerank`, `/v1/tokenize` and
`/v1/detokenize`. One table, (engine, kind) -> `Route`: the engine's path, the client's body as that engine takes
it, and the engine's answer back in the gateway's one shape. Pure (no I/O); the app sends and reads.

The gateway's shapes (docs/api.md, "Rerank and tokenize"):

- rerank (Jina's and Cohere's, as vLLM and llama.cpp serve it): `{model, query, documents: [str | {"text"}],
  top_n?, return_documents?}` -> `{id, model, results: [{index, relevance_score, document?: {text}}] (highest
  score first, at most top_n), usage: {prompt_tokens, total_tokens}}`. Sorting, `top_n` and the documents are
  the gateway's work, from the engine's scores and the request's documents: engines differ in each.
- tokenize (vLLM's): `{model, prompt | messages, add_special_tokens?, add_generation_prompt?}` ->
  `{tokens: [int], count, max_model_len?}` (`max_model_len` where the engine says it: vLLM).
- detokenize (vLLM's): `{model, tokens: [int]}` -> `{prompt: str}`.

Engines: llama.cpp serves `/v1/rerank` (started with `--reranking`), `/tokenize` `{content, add_special}` ->
`{tokens}` (no chat: `messages` is refused by name) and `/detokenize` `{tokens}` -> `{content}`; vLLM
`/v1/rerank`, `/tokenize` and `/detokenize` in the gateway's own shapes. The sim engine speaks llama.cpp's shapes,
so the tests go through the same mapping.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmgw.errors import OpenAIError
from llmgw.gateway import upstream
from llmgw.wire.asgi import dumps

__all__ = ["Call", "ROUTES", "answer", "plan", "refusal", "serves", "translated"]

Doc = dict[str, Any]


@dataclass(frozen=True)
class Route:
    """How one engine serves one kind: its path, the request it takes (from the checked client body and the
    served model's name) and the gateway's answer from its answer (and the client body)."""

    path: str
    request: Callable[[Doc, str], Doc]
    answer: Callable[[Doc, Doc, str, str], Doc]  # (engine's answer, client body, model, request id)


@dataclass(frozen=True)
class Call:
    """One request's call to its engine: where, what, and how its answer is read back."""

    path: str
    body: bytes
    route: Route
    client: Doc  # the client's body, as checked
    model: str  # the model that serves it


# --- rerank ---------------------------------------------------------------------------------------------


def _texts(body: Doc) -> list[str]:
    return [d if isinstance(d, str) else d["text"] for d in body["documents"]]


def _rerank_request(body: Doc, model: str) -> Doc:
    # Plain strings: what both engines take; the gateway adds the documents to the answer itself.
    out: Doc = {"model": model, "query": body["query"], "documents": _texts(body)}
    if body.get("top_n") is not None:
        out["top_n"] = body["top_n"]
    return out


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _rerank_answer(doc: Doc, body: Doc, model: str, request_id: str) -> Doc:
    texts = _texts(body)
    results = doc.get("results")
    if not isinstance(results, list):
        raise _shape("rerank", "no 'results' array")
    scores: dict[int, float] = {}
    for result in results:
        index = _count(result.get("index")) if isinstance(result, dict) else None
        score = result.get("relevance_score") if isinstance(result, dict) else None
        if (index is None or not index < len(texts) or isinstance(score, bool) or not isinstance(score, (int, float))
                or not math.isfinite(score)):
            raise _shape("rerank", f"a result that is not {{index < {len(texts)}, relevance_score}}: {result!r:.80}")
        scores[index] = float(score)
    # Highest score first; equal scores in the documents' order (a stable answer for the same request).
    ranked = sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))
    top_n = body.get("top_n")
    if top_n is not None:
        ranked = ranked[:top_n]
    documents = body.get("return_documents") is True
    out = [{"index": i, "relevance_score": s, **({"document": {"text": texts[i]}} if documents else {})}
           for i, s in ranked]
    usage: Doc = doc["usage"] if isinstance(doc.get("usage"), dict) else {}
    total, prompt = _count(usage.get("total_tokens")), _count(usage.get("prompt_tokens"))
    # Every token of a rerank is read, none generated: vLLM says only its total.
    counted = {"prompt_tokens": prompt if prompt is not None else total, "total_tokens": total if total is not None
               else prompt} if total is not None or prompt is not None else {}
    return {"id": f"rerank-{request_id}", "model": model, "results": out, "usage": counted}


# --- tokenize and detokenize ----------------------------------------------------------------------------


def _llama_tokenize(body: Doc, model: str) -> Doc:
    if body.get("messages") is not None:
        raise OpenAIError(400, "unsupported_parameter", f"model {model!r}'s engine tokenizes text only: give "
                                                        "'prompt', not 'messages'", param="messages")
    # llama.cpp adds no special tokens unless asked; vLLM's default (and the gateway's) is to add them.
    return {"content": body["prompt"], "add_special": body.get("add_special_tokens") is not False}


def _vllm_tokenize(body: Doc, model: str) -> Doc:
    return {**{k: v for k, v in body.items() if v is not None}, "model": model}


def _tokens_answer(doc: Doc, body: Doc, model: str, request_id: str) -> Doc:
    tokens = doc.get("tokens")
    # llama.cpp answers pieces ({id, piece}) when asked for them; the gateway never asks, but reads either.
    ids = [t.get("id") if isinstance(t, dict) else t for t in tokens] if isinstance(tokens, list) else None
    if ids is None or not all(_count(t) is not None for t in ids):
        raise _shape("tokenize", "no 'tokens' array of token ids")
    out: Doc = {"tokens": ids, "count": len(ids)}
    if _count(doc.get("max_model_len")) is not None:
        out["max_model_len"] = doc["max_model_len"]
    return out


def _llama_detokenize(body: Doc, model: str) -> Doc:
    return {"tokens": body["tokens"]}


def _vllm_detokenize(body: Doc, model: str) -> Doc:
    return {"model": model, "tokens": body["tokens"]}


def _detokenized(key: str) -> Callable[[Doc, Doc, str, str], Doc]:
    def answer(doc: Doc, body: Doc, model: str, request_id: str) -> Doc:
        text = doc.get(key)
        if not isinstance(text, str):
            raise _shape("detokenize", f"no '{key}' string")
        return {"prompt": text}

    return answer


_LLAMA = {
    "rerank": Route("/v1/rerank", _rerank_request, _rerank_answer),
    "tokenize": Route("/tokenize", _llama_tokenize, _tokens_answer),
    "detokenize": Route("/detokenize", _llama_detokenize, _detokenized("content")),
}
_VLLM = {
    "rerank": Route("/v1/rerank", _rerank_request, _rerank_answer),
    "tokenize": Route("/tokenize", _vllm_tokenize, _tokens_answer),
    "detokenize": Route("/detokenize", _vllm_detokenize, _detokenized("prompt")),
}
# (engine, kind) -> how that engine serves it; absent: it does not (400 unsupported_endpoint).
ROUTES: dict[tuple[str, str], Route] = {
    **{("llama.cpp", k): r for k, r in _LLAMA.items()},
    **{("sim", k): r for k, r in _LLAMA.items()},  # the simulator speaks llama.cpp's shapes
    **{("vllm", k): r for k, r in _VLLM.items()},
}
KINDS = frozenset(kind for _, kind in ROUTES)


def serves(kind: str, engine: str) -> bool:
    """Whether `engine` serves `kind` (the kinds not mapped here pass unchanged: always)."""
    return kind not in KINDS or (engine, kind) in ROUTES


def plan(kind: str, engine: str, model: str, path: str, body: Doc) -> Call | None:
    """The call for a request of `kind` to `model` on `engine`; None when the body goes unchanged (chat,
    completions, embeddings: one set lookup). Raises 400 `unsupported_endpoint` when the engine cannot serve it,
    or the route's own refusal of a field it cannot take."""
    if kind not in KINDS:
        return None
    route = ROUTES.get((engine, kind))
    if route is None:
        raise OpenAIError(400, "unsupported_endpoint", f"model {model!r} runs on engine {engine}, which does not "
                                                       f"serve {path}", param="model")
    sent = route.request(body, model)
    return Call(route.path, dumps(sent), route, body, model)


def answer(call: Call, raw: bytes, request_id: str) -> bytes:
    """The gateway's answer from the engine's successful (2xx) answer `raw`; 502 `upstream_error` when it is not
    the shape that engine answers in."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise _shape(call.path, "not a JSON object")
    out = call.route.answer(doc, call.client, call.model, request_id)
    return dumps(out)


# llama.cpp answers a detokenize of an id outside its vocabulary with a 500 naming C++'s range check.
_OUT_OF_VOCABULARY = re.compile(rb"_M_range_check: __n \(which is (\d+)\) >= this->size\(\) \(which is (\d+)\)")


def refusal(call: Call, status: int, raw: bytes) -> OpenAIError | None:
    """The client's error an engine answered as its own failure (a 5xx), in the client's words; None when the
    answer is what it says. llama.cpp fails a detokenize of an unknown token id with a 500: that is a 400 of the
    request, and no failure of the replica (its circuit breaker must not count it)."""
    if status == 500 and call.route.path == "/detokenize" and (found := _OUT_OF_VOCABULARY.search(raw[:4096])):
        token, size = (int(n) for n in found.groups())
        return OpenAIError(400, "invalid_value", f"token id {token} is not in model {call.model!r}'s vocabulary "
                                                 f"(ids 0 to {size - 1})", param="tokens")
    return None


async def translated(call: Call, response: upstream.Response, request_id: str,
                     answered: Callable[[], None]) -> upstream.Response:
    """The engine's whole answer (`upstream.answer(whole=True)`) in the gateway's shape: a success translated
    (`answer`), an engine's error as it came, but for the client's error it reports as its own (`refusal`:
    raised, after `answered()` tells the replica's breaker it answered)."""
    if response.status >= 500:
        raw = await response.read()
        error = refusal(call, response.status, raw)
        if error is not None:
            answered()
            raise error
        return upstream.Whole(response.status, response.headers, [raw])
    if response.status >= 400:
        return response
    return upstream.Whole(response.status, response.headers, [answer(call, await response.read(), request_id)])


def _shape(what: str, words: str) -> OpenAIError:
    return OpenAIError(502, "upstream_error", f"the engine's {what} answer is not in the shape it should be: {words}")
