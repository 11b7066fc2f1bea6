"""How the store's own files take the place of pysyncobj's: the journal is opened and checked
by us, then handed to pysyncobj through `createJournal`; snapshots go through `SnapshotFiles`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
from pysyncobj.journal import MemoryJournal

from llmgw.store.journal import FsyncPolicy, RaftJournal, open_journal
from llmgw.store.snapshot import SnapshotFiles, fit_journal, read


def open_durable(journal_path: Path, snapshots: SnapshotFiles, fsync: FsyncPolicy) -> RaftJournal:
    """Read and check the snapshot, open the journal and fit it to the snapshot, and hand the
    journal over to pysyncobj: what `RaftStore.start` does before Raft runs. Damage raises
    `CannotStart` (JournalDamaged, SnapshotDamaged) naming the file."""
    snapshots.loaded = read(snapshots.path) if snapshots.path.exists() else None
    journal = open_journal(journal_path, fsync)
    try:
        fit_journal(journal, snapshots.loaded)
    except BaseException:
        journal.close()
        raise
    hand_over(journal)
    return journal


# pysyncobj builds its journal with `createJournal(conf.journalFile)`.
# The store opens the journal itself (so damage is an error with words, raised before Raft
# starts) and hands it over here; pysyncobj's SyncObj.__init__ then picks it up by path.
# Replacing the module's function is the narrowest seam pysyncobj offers: the call sits in
# the middle of SyncObj.__init__, and its result goes into a name-mangled attribute.

_handed_over: dict[str, RaftJournal] = {}
_handed_over_lock = threading.Lock()


def hand_over(journal: RaftJournal) -> None:
    """Make `journal` the one pysyncobj gets for its path (once)."""
    with _handed_over_lock:
        _handed_over[str(journal.path)] = journal


def take_back(journal: RaftJournal) -> None:
    """Undo `hand_over` when pysyncobj was never built (a failed start)."""
    with _handed_over_lock:
        if _handed_over.get(str(journal.path)) is journal:
            del _handed_over[str(journal.path)]


def _create_journal(journalFile: str | None = None) -> Any:
    if journalFile is None:
        return MemoryJournal()
    with _handed_over_lock:
        journal = _handed_over.pop(journalFile, None)
    if journal is None:
        # Never pysyncobj's own FileJournal (mmap, no checksums, no fsync) behind our back.
        raise RuntimeError(f"the journal {journalFile} was not opened by llmgw.store.durable.open_durable")
    return journal


pysyncobj.syncobj.createJournal = _create_journal
