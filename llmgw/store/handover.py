"""A leader that stops hands its leadership over first: asked (`ask_handover`, any thread), it sends Raft's
TimeoutNow to its most caught-up connected follower on its next tick (pysyncobj's `transferLeadership`),
and again each heartbeat while it still leads (a follower not yet caught up is refused by pysyncobj:
the next try finds it caught up). The follower starts its election at once, so a planned stop or restart
of the leader costs one election round trip instead of an election timeout of silence.

Nothing else changes: the old leader keeps serving until it sees the new term; what it appended after
the target caught up and did not commit is settled by the election as after any leader change (its
writers hear the commit is unknown, and retry with their idempotency keys).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pysyncobj import SyncObj


class HandsOver(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj that can be asked to hand its leadership over (a mixin: among the first bases)."""

    def __init__(self, *args: Any, handover_every_s: float, **kwargs: Any) -> None:
        # Before SyncObj.__init__: kept out of snapshots.
        self._handover_asked = threading.Event()
        self._handover_every_s = handover_every_s
        self._handover_sent_at = 0.0
        super().__init__(*args, **kwargs)
        self.addOnTickCallback(self._handover_tick)

    def ask_handover(self) -> None:
        """Any thread: hand leadership over while this member leads (until `cancel_handover`)."""
        self._handover_asked.set()
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()

    def cancel_handover(self) -> None:
        self._handover_asked.clear()

    def _handover_tick(self) -> None:
        if not self._handover_asked.is_set() or not self._isLeader():
            return
        now = time.monotonic()
        if now - self._handover_sent_at < self._handover_every_s:
            return
        self._handover_sent_at = now
        self.transferLeadership(None, None)  # the most caught-up connected follower; refused if none is
