"""Group commit: the commands submitted in one pass of trio's scheduler go to Raft as ONE entry,
applied in order on every member, each with its own outcome; and applying an entry, one command
or a batch, totally (a command that fails to apply becomes a recorded no-op, never an exception).

One entry costs one journal append (one flush under `fsync=always`) and one message per
follower, whatever it holds: many writers at once then pay for one. No timer: the queue goes at
the end of the pass, and a lone submit goes as it is (a plain entry). A batch is our bytes, never
a pickle: `MAGIC`, a count, then each command's JSON blob with its length.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any

import trio

from llmgw.domain import commands
from llmgw.domain.state import ClusterState, Outcome

log = logging.getLogger("llmgw.store")

MAGIC = b"\x00llmgw-batch\x00"  # a command blob is JSON: it never starts with a NUL
_COUNT = struct.Struct("<I")
MAX_COMMANDS = 1024
MAX_BYTES = 48 * 1024  # under pysyncobj's appendEntriesBatchSizeBytes (64 KiB): one message, not chunks

# pysyncobj's commit callback: (apply's result, FAIL_REASON), called in the Raft thread.
Callback = Callable[[Any, Any], None]
Hand = Callable[..., None]  # hands one entry to Raft: `obj.apply`, called as hand(blob, callback=cb)


def pack(blobs: list[bytes]) -> bytes:
    return MAGIC + _COUNT.pack(len(blobs)) + b"".join(_COUNT.pack(len(b)) + b for b in blobs)


def unpack(entry: bytes, at: int = 0) -> list[bytes] | None:
    """The commands of a batch that starts at `entry[at:]`; None when none starts there or it is cut."""
    if not entry.startswith(MAGIC, at):
        return None
    at += len(MAGIC)
    try:
        (count,), at = _COUNT.unpack_from(entry, at), at + _COUNT.size
        parts = []
        for _ in range(count):
            (size,), at = _COUNT.unpack_from(entry, at), at + _COUNT.size
            if at + size > len(entry):
                return None
            parts.append(entry[at:at + size])
            at += size
    except struct.error:
        return None
    return parts


def apply_blob(state: ClusterState, blob: bytes) -> tuple[ClusterState, Outcome | tuple[Outcome, ...]]:
    """Apply one committed entry: a command (its outcome) or a batch (one outcome per command, in
    order). Total: the same on every member, never raising."""
    parts = unpack(blob)
    if parts is None:
        return _apply_one(state, blob)
    outcomes = []
    for part in parts:
        state, outcome = _apply_one(state, part)
        outcomes.append(outcome)
    return state, tuple(outcomes)


def _apply_one(state: ClusterState, blob: bytes) -> tuple[ClusterState, Outcome]:
    # A committed command that does not apply becomes a recorded no-op, the same on every member;
    # one whose cid was applied already changes nothing.
    try:
        state, outcome = commands.apply_entry(state, blob)
        if outcome.code == "apply_failed":
            log.error("a committed command failed to apply (recorded as a no-op): %s", outcome.message)
    except Exception as e:  # a bug in apply_entry itself must not kill the Raft thread
        log.exception("command failed to apply")
        outcome = Outcome(state.revision, False, None, "apply_failed", f"{type(e).__name__}: {e}")
    return state, outcome


class GroupCommit:
    """Submits queue here; at the end of the scheduler pass in which the first one came, the
    queue goes to Raft, as few entries as `max_commands`/`MAX_BYTES` allow. `max_commands = 1`:
    one entry per command (no group commit)."""

    def __init__(self, max_commands: int = MAX_COMMANDS) -> None:
        self.max_commands = max_commands
        self._queue: list[tuple[Hand, bytes, Callback]] = []

    def add(self, hand: Hand, blob: bytes, callback: Callback) -> None:
        """Queue one command; `callback` gets its own result. Call from trio's thread."""
        if not self._queue:
            trio.lowlevel.current_trio_token().run_sync_soon(self._flush)
        self._queue.append((hand, blob, callback))

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        batch: list[tuple[Hand, bytes, Callback]] = []
        size = 0
        for item in queue:
            if batch and (item[0] != batch[0][0] or len(batch) >= self.max_commands
                          or size + len(item[1]) > MAX_BYTES):
                _hand_over(batch)
                batch, size = [], 0
            batch.append(item)
            size += len(item[1]) + _COUNT.size
        if batch:
            _hand_over(batch)


def _hand_over(batch: list[tuple[Hand, bytes, Callback]]) -> None:
    hand = batch[0][0]
    callbacks = [cb for _, _, cb in batch]

    def each(result: Any, error: Any) -> None:  # runs in the Raft thread
        results = result if isinstance(result, tuple) and len(result) == len(callbacks) else [None] * len(callbacks)
        for cb, one in zip(callbacks, results):
            cb(one, error)

    try:
        if len(batch) == 1:
            hand(batch[0][1], callback=batch[0][2])
        else:
            hand(pack([blob for _, blob, _ in batch]), callback=each)
    except Exception as e:  # runs in trio's scheduler (run_sync_soon): answer the submitters instead
        log.exception("handing commands to Raft failed")
        for cb in callbacks:
            cb(None, e)


def failed_appends(entry: bytes, waiting: list[tuple[bytes, Callable[[Any], None]]]) -> list[Callable[[Any], None]]:
    """The waiting submits (blob, fail) whose commands are in `entry`, a journal record the journal
    could not append (pysyncobj's pickle of the call holds our bytes as they are): for a batch,
    the earliest waiting submit of each of its commands; else the earliest one whose blob is in it
    (pysyncobj appends in the order it was given)."""
    start = entry.find(MAGIC)
    parts = unpack(entry, start) if start >= 0 else None
    if parts is None:
        return next(([fail] for blob, fail in waiting if blob in entry), [])
    found: list[Callable[[Any], None]] = []
    taken: set[int] = set()
    for part in parts:
        for n, (blob, fail) in enumerate(waiting):
            if n not in taken and blob == part:
                taken.add(n)
                found.append(fail)
                break
    return found
