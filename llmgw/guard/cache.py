"""The verdict cache: a judge's reading of a text, kept per (policy, judge, sha256 of the text judged) for
`guard_verdict_ttl_s`, at most `MAX_ENTRIES` of them, least recently used first out.

Only verdicts are kept, never a failure (a judge that was down is asked again next time), and never a
text: the key holds its digest. Times come in as arguments (trio's clock in the gateway, any in tests).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.guard.prompt import Verdict

__all__ = ["MAX_ENTRIES", "CacheStatistics", "VerdictCache", "cache_key"]

MAX_ENTRIES = 10_000  # ~200 bytes each: a few MB at most
Key = tuple[str, str, bytes]


def cache_key(policy: str, judge: str, text: str) -> Key:
    """What a verdict is kept under: the policy's name, its judge and the digest of the judge's prompt."""
    return policy, judge, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class CacheStatistics:
    entries: int
    hits: int
    misses: int


class VerdictCache:
    """A bounded LRU of verdicts with a time to live. Synchronous; one per gateway process."""

    __slots__ = ("_entries", "_ttl_s", "_max", "hits", "misses")

    def __init__(self, ttl_s: float = TIMEOUTS.guard_verdict_ttl_s, max_entries: int = MAX_ENTRIES) -> None:
        self._entries: OrderedDict[Key, tuple[float, Verdict]] = OrderedDict()
        self._ttl_s = ttl_s
        self._max = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, key: Key, now: float) -> Verdict | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        if entry[0] <= now:
            del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[1]

    def put(self, key: Key, verdict: Verdict, now: float) -> None:
        self._entries[key] = (now + self._ttl_s, verdict)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(len(self._entries), self.hits, self.misses)
