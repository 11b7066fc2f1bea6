"""What a role is waiting for while it starts, so a stop before it is ready can say why,
and the error a start step raises when it cannot finish."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class CannotStart(Exception):
    """A start step gave up; the message says what did not happen and the likely cause."""


class Progress:
    """The start steps in progress, each with a function that says, when asked, why it is not done."""

    def __init__(self) -> None:
        self._waits: dict[int, Callable[[], str]] = {}
        self._next = 0

    def describe(self) -> str:
        """Why the start is not done, from the steps still waiting ("" if none is)."""
        return "; ".join(why() for why in list(self._waits.values()))

    @contextmanager
    def waiting(self, why: Callable[[], str]) -> Iterator[None]:
        key, self._next = self._next, self._next + 1
        self._waits[key] = why
        try:
            yield
        finally:
            del self._waits[key]


# Set by the lifecycle around a role's start; tasks it spawns inherit the same object.
_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("llmgw_startup", default=None)


def track() -> Progress:
    """Start tracking in this task (and the tasks it spawns from now on)."""
    progress = Progress()
    _current.set(progress)
    return progress


@contextmanager
def waiting_for(why: Callable[[], str]) -> Iterator[None]:
    """Mark a start step as in progress; `why()` says what it waits for, if the start is stopped."""
    progress = _current.get()
    if progress is None:  # not under a lifecycle (tests, embedding): nobody asks
        yield
        return
    with progress.waiting(why):
        yield
