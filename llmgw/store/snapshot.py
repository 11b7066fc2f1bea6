"""Snapshots as versioned JSON, never pickles: the state (`domain.codec`) with the two log
entries pysyncobj pairs it with, in one checksummed file; and how it must fit the journal.

File: one header line `{"format": "llmgw-snapshot", "version": 1, "body_bytes": N,
"body_sha256": HEX}`, then the body, a JSON object `{"state", "last", "prev", "members"}`.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pysyncobj.node import TCPNode

from llmgw import startup
from llmgw.domain.codec import CodecError, state_from_json, state_to_json
from llmgw.domain.state import ClusterState
from llmgw.store.journal import WHAT_TO_DO as JOURNAL_WHAT_TO_DO
from llmgw.store.journal import Entry, JournalDamaged, RaftJournal, Repeats
from llmgw.diskfiles import fsync_dir

log = logging.getLogger("llmgw.store")

FORMAT = "llmgw-snapshot"
VERSION = 1

WHAT_TO_DO = JOURNAL_WHAT_TO_DO  # moving only the snapshot (and journal) away is refused at the next start


class SnapshotDamaged(startup.CannotStart):
    """A snapshot file that cannot be read; the message names the file and what to do, `what` only
    what is wrong."""

    def __init__(self, message: str, what: str = "") -> None:
        super().__init__(message)
        self.what = what or message


@dataclass(frozen=True)
class Snapshot:
    """The state after entry `last` was applied; `prev` is the entry before it (pysyncobj keeps
    both at the head of the journal); `members` are the group's addresses then."""

    state: ClusterState
    last: Entry
    prev: Entry
    members: tuple[str, ...] = ()


def write(path: Path, snap: Snapshot) -> None:
    """Write `snap` to `path` and fsync it (the caller renames it into place)."""
    body = json.dumps({
        "state": state_to_json(snap.state),
        "last": _entry_doc(snap.last),
        "prev": _entry_doc(snap.prev),
        "members": list(snap.members),
    }, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    header = json.dumps({"format": FORMAT, "version": VERSION, "body_bytes": len(body),
                         "body_sha256": hashlib.sha256(body).hexdigest()}, sort_keys=True).encode()
    with open(path, "wb") as f:
        f.write(header + b"\n" + body)
        f.flush()
        os.fsync(f.fileno())  # whatever the fsync policy: the journal is compacted on its word


def read(path: Path) -> Snapshot:
    """The snapshot in `path`, or `SnapshotDamaged` saying what is wrong with it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SnapshotDamaged(f"cannot read the snapshot {path}: {e.strerror or e}") from None

    def damaged(what: str) -> SnapshotDamaged:
        return SnapshotDamaged(f"snapshot {path} is damaged: {what}; the member will not start on it: {WHAT_TO_DO}",
                               what)

    head, newline, body = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        if data.startswith(b"\x1f\x8b"):
            raise damaged("it is a pysyncobj pickle, written by an older llmgw") from None
        raise damaged("its first line is not a JSON header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise damaged(f"it is not an llmgw snapshot (format {header.get('format') if isinstance(header, dict) else None!r})")
    version = header.get("version")
    if version != VERSION:
        raise damaged(f"snapshot format version {version!r} is not one this llmgw reads ({VERSION}): "
                      "run the llmgw version that wrote it, or a newer one")
    if not newline or header.get("body_bytes") != len(body):
        raise damaged(f"the body is {len(body)} bytes, the header says {header.get('body_bytes')!r} (cut short?)")
    if header.get("body_sha256") != hashlib.sha256(body).hexdigest():
        raise damaged("the body's sha256 does not match its header")
    try:
        doc = json.loads(body)
        return Snapshot(
            state=state_from_json(doc["state"]),
            last=_entry(doc["last"]),
            prev=_entry(doc["prev"]),
            members=tuple(_members(doc.get("members", []))),
        )
    except CodecError as e:
        raise damaged(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise damaged(f"its body is not a snapshot ({type(e).__name__}: {e})") from None


def _entry_doc(entry: Entry) -> dict[str, Any]:
    command, idx, term = entry
    return {"index": idx, "term": term, "command": base64.b64encode(bytes(command)).decode()}


def _entry(doc: Any) -> Entry:
    if not isinstance(doc, dict) or type(doc.get("index")) is not int or type(doc.get("term")) is not int:
        raise ValueError("an entry is {index, term, command}")
    return base64.b64decode(doc["command"], validate=True), doc["index"], doc["term"]


def _members(doc: Any) -> list[str]:
    if not isinstance(doc, list) or not all(isinstance(m, str) for m in doc):
        raise ValueError("members is a list of addresses")
    return doc


def fit_journal(journal: RaftJournal, snap: Snapshot | None) -> None:
    """Make the journal start where the snapshot ends, before pysyncobj reads them.

    pysyncobj writes the snapshot, then compacts the journal a tick later; a crash in between
    leaves the whole journal beside the snapshot, and pysyncobj would then replace that journal
    with the snapshot's two entries, losing every entry after them. Compacted here first, it
    keeps them. A journal that starts after what the snapshot covers (or that has no snapshot
    before its first entry) has lost entries: `JournalDamaged`.
    """
    first = journal[0][1] if len(journal) else None
    if snap is None:
        if first is not None and first > 1:
            raise JournalDamaged(f"journal {journal.path} starts at entry {first} but there is no snapshot "
                                 f"of the entries before it: restore the snapshot from a peer, or move the "
                                 f"journal away to start this member empty")
        return
    prev_idx = snap.prev[1]
    if first is None or first > prev_idx:
        if first is not None:
            raise JournalDamaged(f"journal {journal.path} starts at entry {first} but its snapshot ends at entry "
                                 f"{snap.last[1]}: entries between them are missing; restore both from a peer, "
                                 f"or move both away to start this member empty")
        return
    at = prev_idx - first
    if at + 1 < len(journal) and journal[at] == snap.prev and journal[at + 1] == snap.last:
        journal.deleteEntriesTo(at)
    # else: the journal differs from the snapshot where they overlap (a snapshot received from
    # the leader replaced an uncommitted branch): pysyncobj replaces it with the snapshot's entries.


class SnapshotFiles:
    """pysyncobj's `serializer` and `deserializer` for one member: its state in, its state out.

    With these set, pysyncobj writes no pickle and never forks for a snapshot; it hands over the
    two entries to keep and renames the file we wrote into place. `state_of`/`restore` read and
    replace the replicated object's one attribute (`_state`): set once that object exists.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loaded: Snapshot | None = None  # read (and checked) before Raft starts: given on the first load
        self.state_of: Callable[[], ClusterState] | None = None
        self.restore: Callable[[ClusterState], None] | None = None
        self._failures = Repeats()

    def save(self, tmp: str, data: tuple[Any, Any, Any]) -> None:
        """Called in the Raft thread right after the entries up to `last` were applied."""
        last, prev, cluster = data
        assert self.state_of is not None
        members = tuple(sorted(str(getattr(node, "id", node)) for node in cluster))
        try:
            write(Path(tmp), Snapshot(self.state_of(), tuple(last), tuple(prev), members))
        except OSError as e:
            n = self._failures.count(str(e))
            if n:
                log.error("cannot write a snapshot to %s (%s; failure %d, retried; the journal grows until it "
                          "works)", tmp, "the disk is full" if e.errno == errno.ENOSPC else e.strerror or e, n)
            raise
        self._failures.reset()

    def load(self, path: str) -> tuple[Entry, Entry, list[Any]]:
        """Called in the Raft thread: at the first tick, and when the leader sent a snapshot."""
        snap, self.loaded = self.loaded, None
        if snap is None:  # received from the leader: checked whole and flushed before it was renamed here
            try:
                snap = read(Path(path))
            except SnapshotDamaged as e:
                log.error("%s (received from the leader; not loaded)", e)
                raise
        assert self.restore is not None
        self.restore(snap.state)
        return snap.last, snap.prev, [TCPNode(m) for m in snap.members]


def check_received(serializer: Any, on_refused: Callable[[str], None] | None = None) -> None:
    """A snapshot the leader sends is checked whole, and flushed, before it replaces this member's own.

    pysyncobj writes the chunks of a received snapshot to `snapshot.json.1.tmp` and renames it over
    `snapshot.json` at the last chunk, unflushed, before anything reads it. Chunks of two transfers that
    interleave (a transfer restarted on a new connection while the old one's chunks were still queued)
    made a file longer than its header: it replaced the member's good snapshot, the load refused it, and
    at its next start the member refused to start (the fault campaign, seed 4101, round 108). Now a file
    that does not read whole is dropped where it lies, the member keeps its own, and the leader sends the
    snapshot again (its next index is not advanced); one that reads is flushed before the rename."""
    tmp_of = getattr(serializer, "_Serializer__fileName", None)
    if tmp_of is None:  # an in-memory serializer (no file): nothing on disk to protect
        return
    final = Path(tmp_of)
    tmp = final.with_name(final.name + ".1.tmp")
    original = serializer.setTransmissionData

    def set_transmission_data(data: Any) -> bool:
        if data is None or not data[2]:  # not the last chunk: pysyncobj writes it
            return bool(original(data))
        incoming = serializer._Serializer__incomingTransmissionFile
        if incoming is None:  # a last chunk of a transfer whose first this member never saw
            return False
        try:
            incoming.write(data[0])
            incoming.flush()
            os.fsync(incoming.fileno())
        except OSError as e:
            log.error("cannot write the snapshot received from the leader to %s: %s", tmp, e.strerror or e)
            _drop(serializer, tmp)
            return False
        incoming.close()
        serializer._Serializer__incomingTransmissionFile = None
        try:
            read(tmp)
        except SnapshotDamaged as e:
            log.error("a snapshot received from the leader does not read whole (%s): dropped; this member keeps "
                      "its own, and the leader sends it again", e.what)
            _drop(serializer, tmp)
            if on_refused is not None:
                on_refused(e.what)
            return False
        os.replace(tmp, final)
        fsync_dir(final.parent)
        return True

    serializer.setTransmissionData = set_transmission_data


def _drop(serializer: Any, tmp: Path) -> None:
    incoming = serializer._Serializer__incomingTransmissionFile
    if incoming is not None:
        incoming.close()
    serializer._Serializer__incomingTransmissionFile = None
    try:
        tmp.unlink()
    except OSError:
        pass


class _OursSaysWhy(logging.Filter):
    """pysyncobj's own lines for a snapshot that failed ("Failed to store full dump", and a
    traceback for a damaged one that did not load) say nothing useful, and the first repeats
    every tick; `SnapshotFiles` logs why instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message == "Failed to store full dump":
            return False
        error = record.exc_info[1] if record.exc_info else None
        return not (message == "failed to load full dump" and isinstance(error, SnapshotDamaged))


logging.getLogger("pysyncobj.syncobj").addFilter(_OursSaysWhy())
