"""A damaged journal is never silently shorter (issue 19, point 3): what opening the journal and
its meta file does when the journal was cut at a record boundary, inside record 1 or 2, deleted
beside its meta file or snapshot, or has a torn last record (fsync always / off), and when the
meta file is gone. Real files in tmp_path; no Raft."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.domain.state import ClusterState
from llmgw.store.durable import move_raft_aside, open_durable, take_back
from llmgw.store.journal import (WHAT_TO_DO, FsyncPolicy, JournalShort, RaftJournal, open_journal,
                                 recorded_commit_index)
from llmgw.store.snapshot import Snapshot, SnapshotFiles, write

NO_OP = b"\x01"  # pysyncobj's no-op entry: what records 1 and 2 of a new cluster hold


def a_journal(path: Path, count: int, committed: int, fsync: FsyncPolicy = "always") -> list[int]:
    """A journal as a lone member leaves it: two no-ops, then commands; entries up to `committed`
    recorded as committed. Returns each record's offset, and the file's end last."""
    journal = open_journal(path, fsync)
    offsets = []
    for idx in range(1, count + 1):
        offsets.append(journal._end)
        journal.add(NO_OP if idx <= 2 else f"command {idx}".encode(), idx, 1)
    offsets.append(journal._end)
    journal.setRaftCommitIndex(committed)
    journal.close()
    return offsets


def cut(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(at)


def short_words(path: Path, where: str, missing: str) -> str:
    return (f"journal {path} {where}, but its meta file journal.meta records entries up to 10 as committed: "
            f"{missing} missing (the file was cut or lost its end); the member will not start on it: {WHAT_TO_DO}")


def test_a_cut_at_a_record_boundary_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    offsets = a_journal(path, 10, committed=10)
    cut(path, offsets[6])  # entries 7..10 gone, the file ends cleanly after entry 6
    before = (path.read_bytes(), (tmp_path / "journal.meta").read_bytes())
    with pytest.raises(JournalShort) as e:
        open_journal(path, "always")
    assert str(e.value) == short_words(path, "ends at entry 6", "entries 7..10 are")
    assert "\n" not in str(e.value)
    assert (path.read_bytes(), (tmp_path / "journal.meta").read_bytes()) == before, "a refused open changes nothing"
    assert recorded_commit_index(tmp_path / "journal.meta") == 10, "never lowered"


@pytest.mark.parametrize(("record", "into"), [(1, 5), (2, 20), (6, 3)])
def test_a_cut_inside_a_committed_record_is_refused_not_called_a_torn_tail(tmp_path: Path, record: int,
                                                                           into: int) -> None:
    """Inside record 1 or 2 (the no-ops: what is left would look like a cluster that never logged
    a command, and be seeded again), or inside any record the member knew was committed."""
    path = tmp_path / "journal.bin"
    offsets = a_journal(path, 10, committed=10)
    at = offsets[record - 1] + into
    cut(path, at)
    with pytest.raises(JournalShort) as e:
        open_journal(path, "always")
    where = f"ends inside a record at offset {offsets[record - 1]}, after entry {record - 1}"
    assert str(e.value) == short_words(path, where,
                                       f"entries {record}..10 are")
    assert path.stat().st_size == at, "the torn bytes are kept for whoever restores the member"


def test_a_deleted_journal_beside_its_meta_file_is_refused(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    raft.mkdir()
    path = raft / "journal.bin"
    a_journal(path, 10, committed=10)
    path.unlink()
    snapshots = SnapshotFiles(raft / "snapshot.json")
    with pytest.raises(JournalShort) as e:
        open_durable(path, snapshots, "always")
    assert str(e.value) == (f"journal {path} is missing, but its meta file journal.meta is there (entries up to 10 "
                            "committed): this member had a journal, and the entries in it are missing; the member "
                            f"will not start without it: {WHAT_TO_DO}")
    assert not path.exists(), "no empty journal is made in its place"


def test_a_deleted_journal_beside_a_snapshot_alone_is_refused(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    raft.mkdir()
    write(raft / "snapshot.json", Snapshot(ClusterState(), (b"x", 7, 1), (b"w", 6, 1)))
    path = raft / "journal.bin"
    with pytest.raises(JournalShort) as e:
        open_durable(path, SnapshotFiles(raft / "snapshot.json"), "always")
    assert str(e.value) == (f"journal {path} is missing, but a snapshot of entries up to 7 is there: this member had "
                            "a journal, and the entries in it are missing; the member will not start without it: "
                            f"{WHAT_TO_DO}")


def test_no_journal_no_meta_no_snapshot_is_a_new_member(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    raft.mkdir()
    journal = open_durable(raft / "journal.bin", SnapshotFiles(raft / "snapshot.json"), "always")
    try:
        assert len(journal) == 0 and journal.found_whole and not journal.holds_commands()
    finally:
        take_back(journal)
        journal.close()


def test_a_deleted_meta_file_beside_a_journal_starts_with_a_warning_and_is_never_fresh(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whether the journal lost committed entries cannot be checked then: it opens (the meta file
    is rebuilt; the term comes from the last entry, as pysyncobj does), says so, and is not
    whole, so not a fresh cluster even if it holds only no-ops."""
    path = tmp_path / "journal.bin"
    a_journal(path, 2, committed=2)
    (tmp_path / "journal.meta").unlink()
    caplog.set_level(logging.WARNING, "llmgw.store")
    journal = open_journal(path, "always")
    try:
        assert len(journal) == 2 and not journal.found_whole
        assert (f"journal {path}: its meta file {tmp_path / 'journal.meta'} was missing or empty; this member's term "
                "and vote are taken from the journal's last entry, and whether the journal lost entries that were "
                "committed cannot be checked") in caplog.text
    finally:
        journal.close()


@pytest.mark.parametrize(("fsync", "words"), [
    ("always", "a record this member never acknowledged (fsync policy always: it was never flushed, so never counted "
               "or answered for); safe to drop"),
    ("off", "it may have been acknowledged (fsync policy off: this member may have answered for it before it reached "
            "the disk); in a group the others hold it if it was committed and this member catches up; a lone member "
            "may have lost that write: check the last writes (llmgw ctl status, the request log), or restore "
            "STATE_DIR/raft from a backup"),
])
def test_a_torn_last_record_past_the_commit_index_is_cut_with_true_words(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, fsync: FsyncPolicy, words: str) -> None:
    """The words follow the policy the journal was written under (recorded in the meta file),
    not the one it is opened with now."""
    path = tmp_path / "journal.bin"
    offsets = a_journal(path, 6, committed=5, fsync=fsync)
    cut(path, offsets[5] + 9)  # inside record 6, which was never committed
    caplog.set_level(logging.WARNING, "llmgw.store")
    journal = open_journal(path, "always" if fsync == "off" else "off")
    try:
        assert [e[1] for e in journal[:]] == [1, 2, 3, 4, 5] and not journal.found_whole
        assert path.stat().st_size == offsets[5]
        assert (f"journal {path}: cut a torn last record (9 bytes at offset {offsets[5]}, past the recorded commit "
                f"index): {words}") in caplog.text
    finally:
        journal.close()


def test_a_meta_file_that_records_no_policy_says_it_cannot_know(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.bin"
    offsets = a_journal(path, 4, committed=3)
    journal = open_journal(path, "always")
    journal._meta.fsync = None  # type: ignore[assignment]  # an older llmgw's meta file: no policy in it
    journal._meta.save(sync=True)
    journal.close()
    cut(path, offsets[3] + 2)
    caplog.set_level(logging.WARNING, "llmgw.store")
    open_journal(path, "always").close()
    assert "it may have been acknowledged (the meta file does not say which fsync policy wrote it)" in caplog.text


def test_an_empty_journal_beside_a_snapshot_that_covers_the_commit_index_opens(tmp_path: Path) -> None:
    """A crash between pysyncobj's clear of the journal and its two appends of the snapshot's
    entries (a snapshot received from the leader): the snapshot holds what was committed."""
    path = tmp_path / "journal.bin"
    a_journal(path, 8, committed=8)
    journal = open_journal(path, "always")
    journal.clear()
    journal.close()
    with pytest.raises(JournalShort):
        open_journal(path, "always")
    open_journal(path, "always", covered=8).close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(2, 8), data=st.data())
def test_never_silently_shorter(tmp_path_factory: pytest.TempPathFactory, count: int, data: st.DataObject) -> None:
    """Any cut of any journal: the open either refuses, or keeps every entry up to the commit
    index and the meta file's commit index as it was."""
    committed = data.draw(st.integers(2, count), label="committed")
    path = tmp_path_factory.mktemp("j") / "journal.bin"
    offsets = a_journal(path, count, committed)
    at = data.draw(st.integers(offsets[0], offsets[-1]), label="cut at")
    cut(path, at)
    try:
        journal: RaftJournal = open_journal(path, "always")
    except JournalShort:
        assert at < offsets[committed], "refused only when a committed entry was cut"
        return
    try:
        whole = sum(1 for end in offsets[1:] if end <= at)
        assert whole >= committed and [e[1] for e in journal[:]] == list(range(1, whole + 1))
        assert journal.getRaftCommitIndex() == committed
        assert journal.found_whole == (at in offsets)
    finally:
        journal.close()


def test_rejoin_moves_the_raft_files_aside_and_leaves_a_new_member(tmp_path: Path) -> None:
    """`llmgw control --rejoin`: the damaged files are kept aside, the secret stays, and what is
    left opens as a member with nothing (it gets the group's state from the leader once added)."""
    raft = tmp_path / "raft"
    raft.mkdir()
    (tmp_path / "cluster.secret").write_text("secret")
    offsets = a_journal(raft / "journal.bin", 10, committed=10)
    cut(raft / "journal.bin", offsets[4])
    aside = move_raft_aside(tmp_path, now=0.0)
    assert aside == tmp_path / "raft.damaged-19700101T000000Z"
    assert sorted(p.name for p in aside.iterdir()) == ["journal.bin", "journal.meta"]
    assert (tmp_path / "cluster.secret").read_text() == "secret" and not raft.exists()
    assert move_raft_aside(tmp_path) is None
    raft.mkdir()
    journal = open_durable(raft / "journal.bin", SnapshotFiles(raft / "snapshot.json"), "always")
    try:
        assert len(journal) == 0 and journal.found_whole
    finally:
        take_back(journal)
        journal.close()
    assert move_raft_aside(tmp_path, now=0.0) == tmp_path / "raft.damaged-19700101T000000Z-2"


# --- the meta file: an unflushed save never costs a flushed vote ----------------------------------


SLOT = 1024


def _power_losses(durable: bytes, now: bytes) -> list[bytes]:
    """What the disk may hold after a power loss: each slot written since `durable` was flushed holds
    its flushed bytes, what was written since, or that write torn halfway."""
    images = [b""]
    for slot in range(2):
        old, new = durable[slot * SLOT:(slot + 1) * SLOT], now[slot * SLOT:(slot + 1) * SLOT]
        # Torn: the new head (seq, size, crc) over the old body, or a slot of zeros (a sector lost).
        choices = [old] if old == new else [old, new, new[:24] + old[24:], bytes(SLOT)]
        images = [image + choice for image in images for choice in choices]
    return images


@pytest.mark.parametrize("unflushed", [1, 2, 3, 5])
def test_a_power_loss_after_unflushed_commit_saves_keeps_the_flushed_term_and_vote(tmp_path: Path,
                                                                                   unflushed: int) -> None:
    """The commit index is saved at each change without a flush; the term and vote were flushed before any
    message told them. Whatever a power loss leaves of the saves since, the vote reads back."""
    from llmgw.store.journal import MetaFile

    path = tmp_path / "journal.meta"
    meta = MetaFile(path, "always")
    meta.load()
    meta.term, meta.voted_for, meta.commit_index = 7, "10.0.0.2:7000", 40
    meta.save(sync=True)
    durable = path.read_bytes()
    for i in range(unflushed):
        meta.commit_index = 41 + i
        meta.save(sync=False)
    meta.close()
    for image in _power_losses(durable, path.read_bytes()):
        best = MetaFile.best_slot(image)
        assert best is not None, "neither slot valid"
        assert (best[1]["term"], best[1]["voted_for"]) == (7, "10.0.0.2:7000")
        assert best[1]["commit_index"] >= 40
