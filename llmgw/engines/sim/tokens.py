"""The simulator's rerank, tokenize and detokenize, in llama.cpp's shapes (`/v1/rerank`, `/tokenize`
`{content, add_special}` -> `{tokens}`, `/detokenize` `{tokens}` -> `{content}`), so the gateway's mapping
(gateway/engine_paths.py) is what tests go through.

A token is a whitespace-separated word (as everywhere in the simulator); its id is a hash of the word to 31 bits,
stable across processes, and each process remembers the words it gave ids to so it can read them back; an id it
never gave reads back as `<unk:ID>`. `BOS` (id 1, `<s>`) is the one special token: added when asked, read back
as nothing. A rerank's relevance score is the share of the query's distinct words that a document holds, 0..1.
"""

from __future__ import annotations

import hashlib
from typing import Any

from llmgw.errors import OpenAIError

__all__ = ["BOS", "Vocabulary", "relevance", "rerank"]

BOS = 1
_FIRST_ID = 256  # ids below are special (only BOS is used); a word's id is never one of them
_MAX_WORDS = 1 << 20  # words remembered for detokenize: a long-running sim does not grow without end


def word_id(word: str) -> int:
    """The word's id: its blake2b hash to 31 bits, above the special ids."""
    raw = int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=4).digest(), "big")
    return _FIRST_ID + raw % ((1 << 31) - _FIRST_ID)


class Vocabulary:
    """One sim process's words by id, for detokenize."""

    def __init__(self) -> None:
        self._words: dict[int, str] = {}

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        ids = [BOS] if add_special else []
        for word in text.split():
            token = word_id(word)
            if len(self._words) < _MAX_WORDS:
                self._words.setdefault(token, word)
            ids.append(token)
        return ids

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(self._words.get(t, f"<unk:{t}>") for t in ids if t != BOS)


def relevance(query: str, document: str) -> float:
    """The share of the query's distinct words (case folded) the document holds: 0.0 .. 1.0."""
    asked = set(query.casefold().split())
    if not asked:
        return 0.0
    return round(len(asked & set(document.casefold().split())) / len(asked), 6)


def rerank(body: dict[str, Any], model: str) -> dict[str, Any]:
    """llama.cpp's rerank answer: results by score (highest first), `top_n` of them, usage in words."""
    query, documents, top_n = body.get("query"), body.get("documents"), body.get("top_n")
    if not isinstance(query, str):
        raise OpenAIError(400, "invalid_request_error", "\"query\" must be provided", param="query")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise OpenAIError(400, "invalid_request_error", "\"documents\" must be a non-empty string array",
                          param="documents")
    results = [{"index": i, "relevance_score": relevance(query, d)} for i, d in enumerate(documents)]
    results.sort(key=lambda r: -r["relevance_score"])
    if isinstance(top_n, int) and not isinstance(top_n, bool) and top_n > 0:
        results = results[:top_n]
    tokens = sum(len(query.split()) + len(d.split()) for d in documents)
    return {"model": model, "object": "list", "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results}
