"""How the store's own files take the place of pysyncobj's: the journal is opened and checked
by us, then handed to pysyncobj through `createJournal`; snapshots go through `SnapshotFiles`."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
from pysyncobj.journal import MemoryJournal

from llmgw.store.journal import (WHAT_TO_DO, FsyncPolicy, JournalShort, RaftJournal, open_journal,
                                 recorded_commit_index)
from llmgw.store.snapshot import Snapshot, SnapshotFiles, fit_journal, read
from llmgw.diskfiles import fsync_dir


def open_durable(journal_path: Path, snapshots: SnapshotFiles, fsync: FsyncPolicy) -> RaftJournal:
    """Read and check the snapshot, open the journal and fit it to the snapshot, and hand the
    journal over to pysyncobj: what `RaftStore.start` does before Raft runs. Damage raises
    `CannotStart` (JournalDamaged, JournalShort, SnapshotDamaged) naming the file."""
    snapshots.loaded = read(snapshots.path) if snapshots.path.exists() else None
    check_journal_present(journal_path, snapshots.loaded)
    journal = open_journal(journal_path, fsync, covered=snapshots.loaded.last[1] if snapshots.loaded else 0)
    try:
        fit_journal(journal, snapshots.loaded)
    except BaseException:
        journal.close()
        raise
    hand_over(journal)
    return journal


def check_journal_present(journal_path: Path, snap: Snapshot | None) -> None:
    """`JournalShort` when the journal is missing but its meta file or a snapshot is there: this
    member had a journal (it is made at the first start, before either), so starting without it
    would forget entries it acknowledged; only no journal, no meta file and no snapshot is new."""
    if journal_path.exists():
        return
    meta = journal_path.with_name(journal_path.stem + ".meta")
    beside = []
    if meta.exists():
        committed = recorded_commit_index(meta)
        beside.append(f"its meta file {meta.name} is there" + (
            f" (entries up to {committed} committed)" if committed is not None and committed > 1 else ""))
    if snap is not None:
        beside.append(f"a snapshot of entries up to {snap.last[1]} is there")
    if beside:
        raise JournalShort(f"journal {journal_path} is missing, but {' and '.join(beside)}: this member had a "
                           f"journal, and the entries in it are missing; the member will not start without it: "
                           f"{WHAT_TO_DO}")


def move_raft_aside(state_dir: Path, now: float | None = None) -> Path | None:
    """`llmgw control --rejoin`: move the member's Raft files (`STATE_DIR/raft`) aside, to
    `STATE_DIR/raft.damaged-YYYYmmddTHHMMSSZ`, kept for inspection; the member then starts with no
    journal, no meta file and no snapshot, and gets the group's state from the leader once it is
    added again. Returns where they went (None: there was no `raft/`). The cluster secret and the
    rest of the state dir stay."""
    raft = state_dir / "raft"
    if not raft.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    aside = state_dir / f"raft.damaged-{stamp}"
    n = 1
    while aside.exists():
        n += 1
        aside = state_dir / f"raft.damaged-{stamp}-{n}"
    os.rename(raft, aside)
    fsync_dir(state_dir)
    return aside


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
