"""Who a busy replica serves next: the waiting requests of one endpoint, by priority class and, within a
class, fairly across keys. Pure and synchronous (the pool, llmgw/gateway/pool.py, owns the waiting).

- Classes are strict: a request of a higher class (llmgw/domain/priority.py, `system` first) is served
  before any of a lower one, except a promoted one (below).
- Within a class, keys take turns: round robin over the keys that have requests waiting, each key's own
  requests first come first served. It is deficit round robin with a cost and a quantum of one request:
  a replica's scarce resource is its slot, which a request holds from its first byte to its last whatever
  its size, and a request's tokens are unknown until it ends (`max_tokens` is a ceiling a client chooses,
  often absent); a key's tokens are bounded by its own tokens/min. So a key with 100 requests waiting and
  a key with one are served alternately: the second waits at most one turn of the first.
- Each class holds at most its bound of waiting requests; one more is refused (`Full`, the gateway's 503
  `overloaded`). A promoted request is never refused, so a class may hold more than its bound for a while.
- Promotion: a request that has waited `promote_s` in its class moves up one class (to the end of its
  key's line there), and again after `promote_s` more, up to the top: a lower class is slowed, never
  starved. Checked when a slot frees (`pop`), so a promotion is late by at most the time between two.
- Nothing is preempted: a request that holds a slot keeps it to its end.

Every operation is O(1) (promotions amortized: a request moves at most `len(CLASSES) - 1` times): ordered
dicts give the oldest of a class, the next key in turn and the removal of a cancelled request alike.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

from llmgw.domain.priority import CLASSES

__all__ = ["Entry", "FairQueue", "Full"]

T = TypeVar("T")


class Full(Exception):
    """The class's bound of waiting requests is reached: `rank` (its index in CLASSES), `bound`."""

    def __init__(self, rank: int, bound: int) -> None:
        super().__init__(f"{bound} requests of class {CLASSES[rank]} already waiting")
        self.rank = rank
        self.bound = bound


class Entry(Generic[T]):
    """One waiting request: its `item` (what the pool hands a slot to), key, class and when it arrived."""

    __slots__ = ("item", "key", "rank", "asked", "arrived", "since")

    def __init__(self, item: T, key: str, rank: int, now: float) -> None:
        self.item = item
        self.key = key
        self.rank = rank  # the class it waits in now (promotion lowers it)
        self.asked = rank  # the class it was asked in
        self.arrived = now
        self.since = now  # when it entered its current class


class _Class(Generic[T]):
    """One class's waiting requests: per key in arrival order, the keys in turn, all in arrival order."""

    __slots__ = ("by_key", "turns", "oldest")

    def __init__(self) -> None:
        self.by_key: dict[str, OrderedDict[Entry[T], None]] = {}
        self.turns: OrderedDict[str, None] = OrderedDict()  # keys with requests waiting; the next in turn first
        self.oldest: OrderedDict[Entry[T], None] = OrderedDict()  # by `since`: entries are appended as they enter

    def add(self, entry: Entry[T]) -> None:
        line = self.by_key.get(entry.key)
        if line is None:
            line = self.by_key[entry.key] = OrderedDict()
            self.turns[entry.key] = None  # a key that had none waiting takes its turn after the others'
        line[entry] = None
        self.oldest[entry] = None

    def discard(self, entry: Entry[T]) -> None:
        del self.oldest[entry]
        line = self.by_key[entry.key]
        del line[entry]
        if not line:
            del self.by_key[entry.key]
            del self.turns[entry.key]

    def next(self) -> Entry[T] | None:
        """The first request of the key whose turn it is; that key goes to the end of the turns."""
        if not self.turns:
            return None
        key = next(iter(self.turns))
        line = self.by_key[key]
        entry = next(iter(line))
        del line[entry]
        del self.oldest[entry]
        if line:
            self.turns.move_to_end(key)
        else:
            del self.by_key[key]
            del self.turns[key]
        return entry


class FairQueue(Generic[T]):
    """One endpoint's waiting requests. `bounds[rank]`: the most of each class waiting (at least one);
    `promote_s`: how long a request waits in a class before it moves up one."""

    __slots__ = ("promote_s", "bounds", "_classes", "_count", "promotions")

    def __init__(self, promote_s: float, bounds: Sequence[int]) -> None:
        if len(bounds) != len(CLASSES):
            raise ValueError(f"one bound per class ({len(CLASSES)}), not {len(bounds)}")
        self.promote_s = promote_s
        self.bounds = tuple(bounds)
        self._classes: tuple[_Class[T], ...] = tuple(_Class() for _ in CLASSES)
        self._count = [0] * len(CLASSES)  # waiting in each class now (promoted ones in their new class)
        self.promotions = 0

    def __len__(self) -> int:
        return sum(self._count)

    def waiting(self, rank: int) -> int:
        return self._count[rank]

    def push(self, item: T, key: str, rank: int, now: float) -> Entry[T]:
        """Queue `item` for `key` in class `rank`; its entry (to `remove` it). Raises Full at the bound."""
        if self._count[rank] >= self.bounds[rank]:
            raise Full(rank, self.bounds[rank])
        entry = Entry(item, key, rank, now)
        self._classes[rank].add(entry)
        self._count[rank] += 1
        return entry

    def remove(self, entry: Entry[T]) -> None:
        """Take a waiting entry out (its request was cancelled). Not for an entry `pop` gave."""
        self._classes[entry.rank].discard(entry)
        self._count[entry.rank] -= 1

    def pop(self, now: float) -> Entry[T] | None:
        """The entry to serve next (None: none waits), after promoting those that have waited long enough."""
        self._promote(now)
        for rank, klass in enumerate(self._classes):
            if self._count[rank]:
                entry = klass.next()
                assert entry is not None
                self._count[rank] -= 1
                return entry
        return None

    def _promote(self, now: float) -> None:
        due = now - self.promote_s
        classes = self._classes
        for rank in range(1, len(classes)):
            oldest = classes[rank].oldest
            while oldest:
                entry = next(iter(oldest))
                if entry.since > due:
                    break
                classes[rank].discard(entry)
                self._count[rank] -= 1
                entry.rank, entry.since = rank - 1, now
                classes[rank - 1].add(entry)
                self._count[rank - 1] += 1
                self.promotions += 1
