"""A value handed from pysyncobj's thread back to the trio loop: the Raft thread calls `give`, the
loop awaits `wait` (bounded by the caller); a value given after the loop has finished is dropped."""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class Handoff(Generic[T]):
    """One answer from the Raft thread: `give(value)` there, `await wait(timeout)` on the loop."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._done = trio.Event()
        self._values: list[T] = []

    def give(self, value: T) -> None:
        """Called in the Raft thread: deliver `value` on the loop (the first one given is kept)."""
        def deliver() -> None:
            self._values.append(value)
            self._done.set()

        try:
            self._token.run_sync_soon(deliver)
        except trio.RunFinishedError:
            pass

    async def wait(self, timeout: float) -> list[T]:
        """The value given, as a one-item list; [] when none came within `timeout`."""
        with trio.move_on_after(timeout):
            await self._done.wait()
        return self._values[:1]
