"""Work a request leaves once its answer is out (its request log record, its metrics), done when the event loop
has nothing else to run.

On a kept-alive connection a client may send its next request the moment an answer ends: an agent's loop does,
and so does a benchmark at c=1. Done in the request's own task, this work stood between that request's bytes and
the connection's read of them. Here it waits for the first moment every task is blocked (usually while the next
request waits for its engine), in one task of the gateway's. `settle` does what is waiting at once, for whoever
reads what it makes (the request log's writer, `/metrics`). Bounded: with `limit` pieces waiting, the next one is
done where it is asked for, so a loop that never idles does the work as before rather than piling it up; and
with no task running `run` (an app served by another server, a test's), each piece is done at once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import trio
from trio.testing import wait_all_tasks_blocked

__all__ = ["IdleWork"]

_log = logging.getLogger("llmgw.gateway.idle")


class IdleWork:
    __slots__ = ("limit", "_queue", "_more", "_running")

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._queue: deque[Callable[[], None]] = deque()
        self._more = trio.Event()  # set when the queue gains its first piece
        self._running = False

    def __len__(self) -> int:
        return len(self._queue)

    def defer(self, work: Callable[[], None]) -> None:
        """Do `work` (it never waits) once the loop is idle; at once when nothing runs the queue or it is full."""
        queue = self._queue
        if not self._running or len(queue) >= self.limit:
            self.settle()  # (the waiting pieces first: their order is kept)
            _do(work)
            return
        queue.append(work)
        if len(queue) == 1:
            self._more.set()

    def settle(self) -> None:
        """Do every piece waiting, oldest first."""
        queue = self._queue
        while queue:
            _do(queue.popleft())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the queue until cancelled; what is left is done on the way out."""
        self._running = True
        task_status.started()
        try:
            while True:
                await self._more.wait()
                self._more = trio.Event()
                await wait_all_tasks_blocked()
                self.settle()
        finally:
            self._running = False
            self.settle()


def _do(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception:  # one record's failure is logged; the others, and the loop, go on
        _log.exception("work left by a request failed")
