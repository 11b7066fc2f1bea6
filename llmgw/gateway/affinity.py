"""Prefix affinity: the replica a conversation goes to, the same from every gateway with no shared state.
Owns `affinity_key` (a stable hash of a request's leading text) and `Ring` with `Ring.pick` (consistent
hashing with bounded load).

A replica's engine keeps the KV cache of the prompts it saw (vLLM's prefix caching, llama.cpp's slots): a
conversation whose turns all reach one replica has its history's prefill done once. The key hashes what every
turn of a conversation starts with: the messages up to and including the first user message (the system
prompt and the first turn), at most `limit` characters of their text. The hash is blake2b, never Python's
`hash()`: gateways are separate processes, each with its own hash seed. Replicas sit on a ring of points
derived from their ids alone, so every gateway builds the same ring from the same route table, and a
replica that joins or leaves moves only the keys of its own arcs. Bounded load (Mirrokni et al.,
"Consistent Hashing with Bounded Loads"): walking clockwise from the key's point, a replica whose count of
requests in flight would pass ceil((1 + ε) × the mean) is passed over, so a hot prefix spills over to the
next replicas instead of queueing on one. A client may name the key itself with OpenAI's `prompt_cache_key`
(requests that share a long prefix beyond the first turn, or whose first turn differs).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from hashlib import blake2b
from typing import Any

__all__ = ["DEFAULT_LOAD_FACTOR", "POINTS_PER_REPLICA", "Ring", "affinity_key", "load_bound"]

POINTS_PER_REPLICA = 100  # virtual nodes: each replica's share of keys within ~10% of 1/n
DEFAULT_LOAD_FACTOR = 0.25  # ε, the setting `gateway.affinity_load_factor`'s default

_SEP = b"\x1f"  # between a message's role and its text
_END = b"\x1e"  # after each message
_KEYED = b"\x1dprompt_cache_key"  # before a client's own key: never the hash of a text


def affinity_key(kind: str, body: Mapping[str, Any], limit: int) -> int | None:
    """A 64-bit key of the request's leading text, at most `limit` characters of it; None when `limit` is 0
    (affinity off) or the request has no text. `kind`: "chat" (messages up to and including the first user
    message, role and text each), "completion" (the prompt, or its first string) or "embedding" (the input's
    first string). Reads no further than `limit` characters, whatever the body's size. A request that names
    its own `prompt_cache_key` (OpenAI's field for requests that share a prefix) is keyed by it instead."""
    if limit <= 0:
        return None
    named = body.get("prompt_cache_key")
    if isinstance(named, str) and named:
        return _point(_KEYED + named.encode("utf-8", "surrogatepass"))
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        digest = blake2b(digest_size=8)
        taken = 0
        for message in messages:
            if not isinstance(message, dict):
                break
            role = message.get("role")
            text = _text(message.get("content"))
            piece = text[: limit - taken]
            taken += len(piece)
            digest.update((role if isinstance(role, str) else "").encode("utf-8", "surrogatepass") + _SEP
                          + piece.encode("utf-8", "surrogatepass") + _END)
            if taken >= limit or role == "user":
                break
        if not taken:
            return None
        return int.from_bytes(digest.digest(), "big")
    field = "prompt" if kind == "completion" else "input"
    value = body.get(field)
    if isinstance(value, list):
        value = value[0] if value else None
    if not isinstance(value, str) or not value:
        return None
    return _point(value[:limit].encode("utf-8", "surrogatepass"))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: only text counts (an image's bytes are not a prefix an engine shares)
        return " ".join(p["text"] for p in content
                        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def _point(data: bytes) -> int:
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


def load_bound(total: int, replicas: int, load_factor: float) -> int:
    """The most requests one of `replicas` may hold once one more joins the `total` in flight:
    ceil((1 + ε) × (total + 1) / replicas), never below 1 (so a replica at exactly its share is allowed)."""
    # The tiny slack keeps 1.25 * 8 / 4 from rounding up past 2.5's ceiling through a float error.
    return max(1, math.ceil((1.0 + load_factor) * (total + 1) / replicas - 1e-9))


class Ring:
    """The consistent-hash ring of a set of replica ids: `POINTS_PER_REPLICA` points each, from the id alone
    (`ids`: sorted, so the order a table lists them in does not matter)."""

    __slots__ = ("ids", "_points", "_owners")

    def __init__(self, ids: Sequence[str], points_per_replica: int = POINTS_PER_REPLICA) -> None:
        self.ids = tuple(sorted(ids))
        pairs = sorted((_point(f"{rid}#{i}".encode("utf-8", "surrogatepass")), n)
                       for n, rid in enumerate(self.ids) for i in range(points_per_replica))
        self._points = [p for p, _ in pairs]
        self._owners = [n for _, n in pairs]

    def owner(self, key: int) -> str:
        """The replica id whose arc holds `key` (load aside)."""
        i = bisect_left(self._points, key)
        return self.ids[self._owners[i if i < len(self._points) else 0]]

    def walk(self, key: int) -> Iterator[int]:
        """Each replica once, as its index in `ids`, clockwise from `key`'s point: its owner first, then the
        replicas a request passes to when the ones before are full (bounded load) or out of rotation."""
        points, owners = self._points, self._owners
        size = len(points)
        start = bisect_left(points, key)
        first = owners[start if start < size else 0]
        yield first  # the usual case ends here: the walk below is for a spill
        seen = bytearray(len(self.ids))
        seen[first] = 1
        left = len(self.ids) - 1
        for step in range(1, size):
            if not left:
                return
            n = owners[(start + step) % size]
            if not seen[n]:
                seen[n] = 1
                left -= 1
                yield n
