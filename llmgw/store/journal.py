"""llmgw's Raft journal behind pysyncobj's journal interface: an append-only file of checksummed
records (no mmap), term/vote/commit index in a two-slot meta file, fsynced as the policy says.

File format (integers little-endian):

    journal.bin   header: b"LLMGWJNL", format version u32, crc32 of those 12 bytes (u32)
                  records: length u32 | length check u32 | crc32(payload) u32 | payload
                  payload: index u64 | term u64 | command bytes (pysyncobj's entry)
    journal.meta  two 1 KiB slots: b"LLMGWMET", seq u64, size u32, crc32(seq|size|body) u32,
                  body = JSON {"term", "voted_for", "commit_index", "fsync"} ("fsync": the policy
                  the journal is written under; older files lack it); the valid slot with the
                  highest seq wins. One slot keeps the last flushed save, every later one goes to
                  the other, so a torn or lost unflushed save (the commit index, at each change)
                  never costs a flushed term and vote.

What opening a damaged journal does is decided in `_scan` and `_check_end` (and written in
docs/operations.md, "Damage at start", and docs/ha.md, "A damaged journal"): a journal that
ends before the commit index its meta file records has lost entries this member knew were
committed: `JournalShort`, whether it ends at a record boundary or inside a record. Past that
index, the file ending inside a record is a torn tail (a kill or power loss during an append):
it is cut off, with a warning that says whether this member can have acknowledged it (the meta
file records the fsync policy the journal was written under). Anything else wrong is
`JournalDamaged`. The meta file's commit index is written (not flushed) at each change, so a
kill leaves it exact; it is never lowered to fit a shorter journal.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Any, Callable, Literal, get_args

from pysyncobj.journal import Journal

from llmgw import startup
from llmgw.store.failpoints import flushed
from llmgw.diskfiles import fsync_dir

log = logging.getLogger("llmgw.store")

FsyncPolicy = Literal["always", "off"]
FSYNC_POLICIES: tuple[str, ...] = get_args(FsyncPolicy)
DEFAULT_FSYNC: FsyncPolicy = "always"

Entry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj hands them over

_MAGIC = b"LLMGWJNL"
_VERSION = 1
_HEADER = struct.Struct("<8sII")
_RECORD = struct.Struct("<III")  # length, length check, crc32(payload)
_ENTRY = struct.Struct("<QQ")  # index, term
_LENGTH_SEED = 0x4C4C4D47  # the length check is crc32 of the length word, seeded apart from payload CRCs
_META_MAGIC = b"LLMGWMET"
_META_HEAD = struct.Struct("<8sQII")
_META_SLOT = 1024

WHAT_TO_DO = ("rejoin it from its peers' copy (stop it; llmgw ctl members remove RAFT_ADDR; llmgw control --rejoin "
              "...; llmgw ctl members add RAFT_ADDR: docs/ha.md, \"A damaged journal\"); a lone member (llmgw up): "
              "restore STATE_DIR/raft from a backup, or move it aside to start empty (seeded again)")


class JournalDamaged(startup.CannotStart):
    """The journal (or its meta file) cannot be trusted; the message names the file, the offset
    and what to do. Never answered with an empty state."""


class JournalShort(JournalDamaged):
    """The journal ends before an entry this member recorded as committed (or is missing beside
    a meta file or snapshot): entries it acknowledged are gone. Never started on, never "fresh"."""


class JournalWriteError(OSError):
    """An append, truncation or meta write failed; nothing of it was kept. `disk_full` says why."""

    def __init__(self, path: Path, cause: OSError, doing: str) -> None:
        self.disk_full = cause.errno in (errno.ENOSPC, errno.EDQUOT)
        why = "the disk is full" if self.disk_full else (cause.strerror or str(cause))
        super().__init__(cause.errno, f"{why}: cannot {doing} {path}")
        self.path = path


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def _length_check(length: int) -> int:
    return zlib.crc32(struct.pack("<I", length), _LENGTH_SEED) & 0xFFFFFFFF


def encode_record(command: bytes, idx: int, term: int) -> bytes:
    payload = _ENTRY.pack(idx, term) + command
    return _RECORD.pack(len(payload), _length_check(len(payload)), _crc(payload)) + payload


def _header() -> bytes:
    head = struct.pack("<8sI", _MAGIC, _VERSION)
    return head + struct.pack("<I", _crc(head))


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class RaftJournal(Journal):  # type: ignore[misc]
    """pysyncobj's `Journal`: called from the Raft thread only. Entries are kept in memory too
    (pysyncobj indexes and slices the journal on every tick), and each record's offset, so a
    truncation is one `ftruncate`."""

    def __init__(self, path: Path, fd: int, entries: list[Entry], offsets: list[int], end: int,
                 meta: MetaFile, fsync: FsyncPolicy) -> None:
        self.path = path
        self._fd = fd
        self._entries = entries
        self._offsets = offsets  # where each entry's record starts
        self._end = end
        self._meta = meta
        self._always = fsync == "always"
        self._commit_dirty = False
        self._broken = ""  # set when the file may no longer match memory: every write is refused
        # False when this open cut a torn tail or found the meta file missing beside the journal:
        # something was lost or cannot be checked, so this is never a fresh cluster.
        self.found_whole = True
        # Called (in the Raft thread) with the command whose append failed and the error:
        # the store answers that write's client at once, with why.
        self.on_append_failed: Callable[[bytes, JournalWriteError], None] | None = None

    # -- pysyncobj's interface ---------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        command = bytes(command)
        record = encode_record(command, idx, term)
        try:
            self._write(record, f"append entry {idx} to")
        except JournalWriteError as e:
            if self.on_append_failed is not None:
                self.on_append_failed(command, e)
            raise
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)

    def clear(self) -> None:
        self._truncate(_HEADER.size, 0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop entries from position `entryFrom` on (a conflict with the leader's log)."""
        if entryFrom < len(self._entries):
            self._truncate(self._offsets[entryFrom], entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop entries before position `entryTo` (they are in the snapshot): the file is
        rewritten beside the old one and renamed over it, so a crash leaves one or the other."""
        if entryTo <= 0:
            return
        self._check_writable()
        keep = self._entries[entryTo:]
        tmp = self.path.with_name(self.path.name + ".tmp")
        records = [encode_record(*entry) for entry in keep]
        try:
            # The snapshot that covers the dropped entries was renamed into this directory:
            # make that rename durable before the entries are gone.
            fsync_dir(self.path.parent)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise JournalWriteError(self.path, e, "compact") from e
        try:
            _write_all(fd, _header() + b"".join(records), 0)
            os.fsync(fd)  # whatever the policy: a lost compaction would lose more than a tail
            os.replace(tmp, self.path)
            flushed(self.path, fd)
        except OSError as e:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise JournalWriteError(self.path, e, "compact") from e
        os.close(self._fd)
        self._fd = fd
        self._entries = keep
        self._offsets = []
        offset = _HEADER.size
        for record in records:
            self._offsets.append(offset)
            offset += len(record)
        self._end = offset
        try:
            fsync_dir(self.path.parent)
        except OSError as e:
            self._broken = f"could not make a compaction durable ({e.strerror}); restart the member"
            raise JournalWriteError(self.path, e, "compact") from e

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        """Written at each change (one in-place write, not flushed): a restart applies its log at
        once, and a journal that comes back shorter than this is refused (`open_journal`)
        instead of quietly losing what this member knew was committed. A kill leaves it exact;
        a power loss may leave an older value (the check then sees less, never too much with
        fsync `always`: the entries were flushed before they could count as committed)."""
        if raftCommitIndex != self._meta.commit_index:
            self._meta.commit_index = raftCommitIndex
            self._commit_dirty = True
            self._save_commit_index()

    def getRaftCommitIndex(self) -> int:
        stored = self._meta.commit_index
        if self._entries and stored > self._entries[-1][1]:
            # Only an empty journal beside a snapshot that covers the index gets here (a crash
            # between pysyncobj's clear and its two appends); `open_journal` refuses the rest.
            return int(self._entries[-1][1])
        return stored

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        # Raft: term and vote are durable before any message that reflects them leaves.
        self._check_writable()
        self._meta.term, self._meta.voted_for = term, votedForNodeId
        self._meta.save(sync=self._always)
        self._commit_dirty = False

    def getCurrentTerm(self) -> int:
        return self._meta.term

    def getVotedForNodeId(self) -> Any:
        return self._meta.voted_for

    def onOneSecondTimer(self) -> None:
        if self._commit_dirty:
            self._save_commit_index(retrying=True)

    def _save_commit_index(self, *, retrying: bool = False) -> None:
        if self._broken:
            return
        try:
            self._meta.save(sync=False)
            self._commit_dirty = False
        except JournalWriteError as e:
            if retrying:
                log.warning("cannot save the commit index (retried each second): %s", e)

    # -- ours --------------------------------------------------------------------------

    def holds_commands(self) -> bool:
        """Whether any entry is more than Raft's own no-op (pysyncobj's command type 1): a journal
        that never logged a command is a cluster that never had state."""
        return any(command[:1] != b"\x01" for command, _, _ in self._entries)

    @property
    def write_error(self) -> str:
        """Why this journal refuses every write until the member restarts ("" when it does not)."""
        return self._broken

    def close(self) -> None:
        if self._commit_dirty and self._fd >= 0:
            self._save_commit_index()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._meta.close()

    def _check_writable(self) -> None:
        if self._broken:
            raise JournalWriteError(self.path, OSError(errno.EIO, self._broken), "write")

    def _write(self, data: bytes, doing: str) -> None:
        self._check_writable()
        try:
            _write_all(self._fd, data, self._end)
        except OSError as e:
            self._give_back(doing)
            raise JournalWriteError(self.path, e, doing) from e
        if self._always:
            try:
                os.fdatasync(self._fd)
                flushed(self.path, self._fd)
            except OSError as e:
                # After a failed fsync the kernel may have dropped the pages: whether the file
                # holds what was written is unknown, so no later write is trusted either.
                self._broken = f"fsync failed ({e.strerror}); restart the member"
                self._give_back(doing)
                raise JournalWriteError(self.path, e, doing) from e

    def _give_back(self, doing: str) -> None:
        """Cut what a failed write left, so the file ends where the last kept record ends."""
        try:
            os.ftruncate(self._fd, self._end)
        except OSError as e:
            self._broken = f"could not cut a failed write ({e.strerror}); restart the member"

    def _truncate(self, offset: int, keep: int) -> None:
        self._check_writable()
        try:
            os.ftruncate(self._fd, offset)
            if self._always:
                os.fsync(self._fd)  # before the next append lands where the dropped records were
                flushed(self.path, self._fd)
        except OSError as e:
            self._broken = f"could not truncate ({e.strerror}); restart the member"
            raise JournalWriteError(self.path, e, "truncate") from e
        del self._entries[keep:]
        del self._offsets[keep:]
        self._end = offset


def open_journal(path: Path, fsync: FsyncPolicy, *, covered: int = 0) -> RaftJournal:
    """Open (creating if absent) the journal at `path` and its meta file beside it.

    `covered`: the last index the member's snapshot holds (0: none), which an empty journal may
    stand on. Raises `JournalShort` when the journal ends before the commit index its meta file
    records, `JournalDamaged` for other damage, and `CannotStart` when the files cannot be read.
    A refused open changes no file."""
    if fsync not in FSYNC_POLICIES:
        raise startup.CannotStart(f"unknown fsync policy {fsync!r}; choose one of {', '.join(FSYNC_POLICIES)}")
    meta = MetaFile(path.with_name(path.stem + ".meta"), fsync)
    meta_existed = meta.path.exists()
    try:
        if not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(_header())
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        flushed(path, fd)  # (failpoints: what a start finds is what a power loss goes back to)
    except OSError as e:
        raise startup.CannotStart(f"cannot open the journal {path}: {e.strerror or e}") from None
    try:
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        entries, offsets, end = _scan(path, data)
        meta.load()
        written_under = meta.found_fsync
        _check_end(path, meta, entries, covered, torn_at=end if end < len(data) else None)
        if end < len(data):
            log.warning("%s", torn_tail_words(path, len(data) - end, end, written_under))
            os.ftruncate(fd, end)
            os.fsync(fd)
            flushed(path, fd)
        if meta.blank and entries:
            log.warning("journal %s: its meta file %s was missing or empty; this member's term and vote "
                        "are taken from the journal's last entry, and whether the journal lost entries that "
                        "were committed cannot be checked", path, meta.path)
        if written_under != fsync and not meta.blank:  # (a blank one was just written with it)
            meta.save(sync=True)  # the policy the next records are written under, before any is
    except BaseException:
        os.close(fd)
        meta.close()
        raise
    journal = RaftJournal(path, fd, entries, offsets, end, meta, fsync)
    journal.found_whole = end == len(data) and (meta_existed or not entries)
    return journal


def _check_end(path: Path, meta: MetaFile, entries: list[Entry], covered: int, torn_at: int | None) -> None:
    """`JournalShort` when the journal (or the snapshot it stands on) ends before the commit
    index the meta file records: entries this member knew were committed are gone. Index 1 is
    pysyncobj's first no-op, committed by definition: a commit index of 1 claims nothing."""
    last = max(entries[-1][1] if entries else 0, covered)
    committed = meta.commit_index
    if committed <= max(last, 1):
        return
    where = (f"ends inside a record at offset {torn_at}, after entry {last}" if torn_at is not None
             else f"ends at entry {last}")
    raise JournalShort(f"journal {path} {where}, but its meta file {meta.path.name} records entries up to {committed} "
                       f"as committed: {_entries_words(last + 1, committed)} missing (the file was cut or lost its "
                       f"end); the member will not start on it: {WHAT_TO_DO}")


def _entries_words(first: int, last: int) -> str:
    return f"entry {first} is" if first == last else f"entries {first}..{last} are"


def torn_tail_words(path: Path, size: int, offset: int, written_under: str | None) -> str:
    """The warning for a torn last record cut off at start: true to what this member can know.
    With fsync `always` a record is flushed before it counts, so a torn one was never
    acknowledged by this member; with `off` (or a meta file that does not say) it may have been."""
    head = f"journal {path}: cut a torn last record ({size} bytes at offset {offset}, past the recorded commit index)"
    if written_under == "always":
        return (f"{head}: a record this member never acknowledged (fsync policy always: it was never flushed, "
                "so never counted or answered for); safe to drop")
    why = ("fsync policy off: this member may have answered for it before it reached the disk" if written_under == "off"
           else "the meta file does not say which fsync policy wrote it")
    return (f"{head}: it may have been acknowledged ({why}); in a group the others hold it if it was committed and "
            "this member catches up; a lone member may have lost that write: check the last writes "
            "(llmgw ctl status, the request log), or restore STATE_DIR/raft from a backup")


def _scan(path: Path, data: bytes) -> tuple[list[Entry], list[int], int]:
    """(entries, their offsets, where the last whole record ends), or `JournalDamaged`."""

    def damaged(offset: int, what: str) -> JournalDamaged:
        return JournalDamaged(f"journal {path} is damaged at offset {offset}: {what}; "
                              f"the member will not start on it: {WHAT_TO_DO}")

    if len(data) < _HEADER.size:
        raise damaged(0, f"the file is {len(data)} bytes, shorter than its header")
    magic, version, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        hint = " (pysyncobj's own format, written by an older llmgw)" if data.startswith(b"PYSYNCOBJ") else ""
        raise damaged(0, f"not an llmgw journal{hint}")
    if crc != _crc(data[:12]):
        raise damaged(0, "the header's checksum does not match")
    if version != _VERSION:
        raise damaged(0, f"journal format version {version} is not one this llmgw reads ({_VERSION})")
    entries: list[Entry] = []
    offsets: list[int] = []
    offset = _HEADER.size
    while offset < len(data):
        if len(data) - offset < _RECORD.size:
            break  # torn: the file ends inside a record's header
        length, check, crc = _RECORD.unpack_from(data, offset)
        if check != _length_check(length):
            raise damaged(offset, f"the length word of record {len(entries) + 1} does not match its check")
        start = offset + _RECORD.size
        if start + length > len(data):
            break  # torn: the file ends inside the record's payload
        payload = data[start:start + length]
        if crc != _crc(payload):
            raise damaged(offset, f"record {len(entries) + 1} ({length} bytes) fails its checksum")
        if length < _ENTRY.size:
            raise damaged(offset, f"record {len(entries) + 1} is too short to hold an entry")
        idx, term = _ENTRY.unpack_from(payload)
        if entries and (idx != entries[-1][1] + 1 or term < entries[-1][2]):
            raise damaged(offset, f"entry {idx} (term {term}) follows entry {entries[-1][1]} "
                                  f"(term {entries[-1][2]}) out of order")
        entries.append((payload[_ENTRY.size:], idx, term))
        offsets.append(offset)
        offset = start + length
    return entries, offsets, offset


class MetaFile:
    """Term, vote and commit index in two fixed slots, overwritten in place: no write ever needs a
    new block, so a full disk cannot stop a vote being recorded.

    One slot holds the last flushed save (`sync=True`: a term and vote that messages already told);
    every later save, flushed or not, goes to the other slot, so an unflushed one (the commit index,
    saved at each change) never overwrites what a flush made durable: torn by a power loss, it costs
    only itself, and the flushed slot it leaves is read instead."""

    def __init__(self, path: Path, fsync: FsyncPolicy = DEFAULT_FSYNC) -> None:
        self.path = path
        self.term = 0
        self.voted_for: Any = None
        self.commit_index = 1
        self.fsync = fsync  # the policy the journal is written under now: recorded with every save
        self.found_fsync: str | None = None  # the policy `load` found recorded (None: blank, or an older file)
        self._seq = 0
        self._fd = -1
        self._durable = 0  # the slot holding the last flushed save: no unflushed save overwrites it
        self.blank = False  # found missing or never written

    def load(self) -> None:
        existed = self.path.exists()
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            data = os.pread(self._fd, 2 * _META_SLOT, 0)
        except OSError as e:
            raise startup.CannotStart(f"cannot open the journal's meta file {self.path}: {e.strerror or e}") from None
        if not existed or not data.strip(b"\0"):
            # New (or created but never written): make both slots now, while there is room.
            self.blank = True
            self.save(sync=True, fill=True)
            return
        best = self.best_slot(data)
        if best is None:
            raise JournalDamaged(f"journal meta file {self.path} is damaged (neither slot is valid, "
                                 f"at offsets 0 and {_META_SLOT}): it holds this member's term and vote; "
                                 "the member will not start on it: restore the journal and this file from "
                                 "a peer, or move both away to start this member empty")
        self._seq, body = best
        self.term, self.voted_for, self.commit_index = body["term"], body["voted_for"], body["commit_index"]
        # What was read is made durable before anything overwrites the other slot: from here the slot
        # read is the flushed one, whatever a crash before this start left unflushed.
        try:
            os.fdatasync(self._fd)
            flushed(self.path, self._fd)
        except OSError as e:
            raise JournalWriteError(self.path, e, "record the term and vote in") from e
        self._durable = self._slot_of(data, self._seq)
        recorded = body.get("fsync")
        self.found_fsync = recorded if recorded in FSYNC_POLICIES else None

    @classmethod
    def _slot_of(cls, data: bytes, seq: int) -> int:
        """Which slot of `data` holds the valid save numbered `seq`."""
        for slot in range(2):
            found = cls._read_slot(data[slot * _META_SLOT:(slot + 1) * _META_SLOT])
            if found is not None and found[0] == seq:
                return slot
        raise AssertionError(f"no slot holds save {seq}")

    @classmethod
    def best_slot(cls, data: bytes) -> tuple[int, dict[str, Any]] | None:
        """(seq, body) of the valid slot with the highest seq, or None when neither is valid."""
        best: tuple[int, dict[str, Any]] | None = None
        for slot in range(2):
            found = cls._read_slot(data[slot * _META_SLOT:(slot + 1) * _META_SLOT])
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        return best

    @staticmethod
    def _read_slot(slot: bytes) -> tuple[int, dict[str, Any]] | None:
        if len(slot) < _META_HEAD.size:
            return None
        magic, seq, size, crc = _META_HEAD.unpack_from(slot)
        body = slot[_META_HEAD.size:_META_HEAD.size + size]
        if magic != _META_MAGIC or len(body) != size or crc != _crc(slot[8:20] + body):
            return None  # a torn write of this slot: the other one holds the value before it
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        ok = (isinstance(doc, dict) and type(doc.get("term")) is int and type(doc.get("commit_index")) is int
              and (doc.get("voted_for") is None or isinstance(doc.get("voted_for"), str)))
        return (seq, doc) if ok else None

    def save(self, *, sync: bool, fill: bool = False) -> None:
        body = json.dumps({"term": self.term, "voted_for": self.voted_for, "commit_index": self.commit_index,
                           "fsync": self.fsync}, separators=(",", ":")).encode()
        if len(body) > _META_SLOT - _META_HEAD.size:
            raise ValueError(f"node id too long for the journal's meta file: {self.voted_for!r:.80}")
        seq = self._seq + 1
        head = struct.pack("<QI", seq, len(body))
        slot = (_META_MAGIC + head + struct.pack("<I", _crc(head + body)) + body).ljust(_META_SLOT, b"\0")
        target = 1 - self._durable  # never the slot of the last flushed save
        if fill:  # both slots, the other one empty
            data, offset = (bytes(_META_SLOT) + slot, 0) if target else (slot + bytes(_META_SLOT), 0)
        else:
            data, offset = slot, target * _META_SLOT
        try:
            _write_all(self._fd, data, offset)
            if sync:
                os.fdatasync(self._fd)
                flushed(self.path, self._fd)
            if fill:
                fsync_dir(self.path.parent)
        except OSError as e:
            raise JournalWriteError(self.path, e, "record the term and vote in") from e
        self._seq = seq
        if sync:
            self._durable = target

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def recorded_commit_index(meta_path: Path) -> int | None:
    """The commit index a meta file records, read without writing it (None: unreadable or blank)."""
    try:
        best = MetaFile.best_slot(meta_path.read_bytes()[:2 * _META_SLOT])
    except OSError:
        return None
    return None if best is None else int(best[1]["commit_index"])


class Repeats:
    """Says whether to log the nth occurrence of the same failure: the 1st, 2nd, 4th, 8th, ...
    A failure that repeats every tick is then logged a few dozen times a day, not 200 times a second."""

    def __init__(self) -> None:
        self._last = ""
        self._count = 0

    def count(self, what: str) -> int:
        """The failure's count if this occurrence should be logged, else 0."""
        if what != self._last:
            self._last, self._count = what, 0
        self._count += 1
        return self._count if self._count & (self._count - 1) == 0 else 0

    def reset(self) -> None:
        self._last, self._count = "", 0
