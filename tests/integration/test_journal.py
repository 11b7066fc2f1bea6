"""The store owns its bytes on disk: llmgw's journal (checksummed records, truncation and
compaction, term and vote), what each kind of damage does at start, a full disk, JSON
snapshots, the fresh-cluster decision, and a SIGKILL of `llmgw up` in the middle of writes.
Real files in tmp_path; the full disk is a real tmpfs."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.control.service import Seed, seed_cluster
from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.startup import CannotStart
from llmgw.store import RaftStore, StoreUnavailable
from llmgw.store.journal import (JournalDamaged, JournalShort, MetaFile, RaftJournal, encode_record, open_journal,
                                 recorded_commit_index)
from llmgw.store.snapshot import SnapshotDamaged
from llmgw.store.snapshot import read as read_snapshot
from llmgw.testing import MemoryStore
from tests.support.fsync_cost import measure_commits
from tests.support.processes import UpProcess, free_port

pytestmark = pytest.mark.slow  # real Raft members (each start elects itself), a real tmpfs, a real `llmgw up`

# A lone member elects itself after an election timeout: short ones keep each start short.
FAST = dataclasses.replace(TIMEOUTS, raft_election_min_s=0.16, raft_election_max_s=0.25)  # > 3 heartbeats

WHAT_TO_DO = ("rejoin it from its peers' copy (stop it; llmgw ctl members remove RAFT_ADDR; llmgw control --rejoin "
              "...; llmgw ctl members add RAFT_ADDR: docs/ha.md, \"A damaged journal\"); a lone member (llmgw up): "
              "restore STATE_DIR/raft from a backup, or move it aside to start empty (seeded again)")


def demo(name: str, args: tuple[str, ...] = ()) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", "args": list(args)})


def records(path: Path) -> list[tuple[int, int]]:
    """(offset, whole size) of each record in a journal file, read by hand."""
    data = path.read_bytes()
    found, offset = [], 16
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        found.append((offset, 12 + length))
        offset += 12 + length
    return found


def patch_byte(path: Path, offset: int, xor: int = 0x5A) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= xor
    path.write_bytes(bytes(data))


async def open_store(state_dir: Path, **kwargs: Any) -> RaftStore:
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=state_dir, timeouts=FAST, **kwargs)
    await store.start()
    try:
        await store.wait_ready(timeout=10)
    except BaseException:
        store.close()
        raise
    return store


async def store_with_models(state_dir: Path, count: int) -> int:
    """A journal holding `count` model commands; returns the state's revision."""
    store = await open_store(state_dir)
    try:
        for i in range(count):
            await store.submit(commands.put_model(demo(f"m{i}"), float(i)))
        return store.snapshot().revision
    finally:
        store.close()


# --- the journal itself ---------------------------------------------------------------


def entries(n: int, start: int = 1, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(f"command {i}".encode(), i, term) for i in range(start, start + n)]


def reopen(journal: RaftJournal) -> RaftJournal:
    journal.close()
    return open_journal(journal.path, "always")


def test_entries_survive_a_reopen(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.bin", "always")
    for entry in entries(5):
        journal.add(*entry)
    journal = reopen(journal)
    try:
        assert list(journal[:]) == entries(5) and len(journal) == 5 and journal[-1] == entries(5)[-1]
    finally:
        journal.close()


def test_delete_entries_from_drops_a_conflicting_suffix_for_good(tmp_path: Path) -> None:
    """A follower's entries that conflict with the leader's go; the leader's replace them, and a
    reopen sees exactly those (no remnant of the longer, older tail after them)."""
    journal = open_journal(tmp_path / "journal.bin", "always")
    for entry in entries(6):
        journal.add(*entry)
    journal.deleteEntriesFrom(3)  # positions 3.. (entries 4, 5, 6)
    assert [e[1] for e in journal[:]] == [1, 2, 3]
    journal.add(b"leader's 4", 4, 2)
    journal = reopen(journal)
    try:
        assert list(journal[:]) == [*entries(3), (b"leader's 4", 4, 2)]
        assert (tmp_path / "journal.bin").stat().st_size == 16 + sum(len(encode_record(*e)) for e in journal[:])
        journal.deleteEntriesFrom(10)  # past the end: nothing
        assert len(journal) == 4
    finally:
        journal.close()


def test_delete_entries_to_compacts_and_appends_follow(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.bin", "always")
    for entry in entries(8):
        journal.add(*entry)
    journal.deleteEntriesTo(5)  # the snapshot holds entries 1..5
    assert [e[1] for e in journal[:]] == [6, 7, 8]
    journal.add(b"next", 9, 1)
    journal.deleteEntriesFrom(2)  # offsets were rebuilt by the compaction: entry 8 on goes
    journal.add(b"other", 8, 2)
    journal = reopen(journal)
    try:
        assert list(journal[:]) == [*entries(2, start=6), (b"other", 8, 2)]
        assert not (tmp_path / "journal.bin.tmp").exists()
        journal.clear()
        assert len(journal) == 0
    finally:
        journal.close()
    journal = open_journal(tmp_path / "journal.bin", "always")
    assert len(journal) == 0
    journal.close()


def test_term_vote_and_commit_index_survive_and_a_torn_slot_falls_back(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.bin", "always")
    for entry in entries(4):
        journal.add(*entry)
    journal.setCurrentTerm(3, "10.0.0.1:4321")
    journal.setRaftCommitIndex(4)
    journal.onOneSecondTimer()
    journal.setCurrentTerm(4, None)
    journal = reopen(journal)
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.getRaftCommitIndex()) == (4, None, 4)
    journal.close()
    # The newest slot torn (a crash while writing it): the value before it, in the other slot.
    meta = tmp_path / "journal.meta"
    data = meta.read_bytes()
    newest = MetaFile.best_slot(data)
    assert newest is not None
    slot = 1024 * MetaFile._slot_of(data, newest[0])
    patch_byte(meta, slot + 30)
    journal = open_journal(tmp_path / "journal.bin", "always")
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (3, "10.0.0.1:4321")
    journal.close()
    patch_byte(meta, 1024 - slot + 30)
    with pytest.raises(JournalDamaged) as e:
        open_journal(tmp_path / "journal.bin", "always")
    assert str(e.value) == (f"journal meta file {meta} is damaged (neither slot is valid, at offsets 0 and 1024): "
                            "it holds this member's term and vote; the member will not start on it: restore the "
                            "journal and this file from a peer, or move both away to start this member empty")


def test_a_commit_index_past_the_journal_is_refused_never_lowered(tmp_path: Path) -> None:
    """Entries 4..9 lost (a power loss with fsync off, or a cut): the member knew they were
    committed, so it does not start on the rest; the meta file keeps its commit index (issue 19:
    it used to be lowered to the journal's end, quietly)."""
    journal = open_journal(tmp_path / "journal.bin", "off")
    for entry in entries(3):
        journal.add(*entry)
    journal.setRaftCommitIndex(9)
    journal.close()
    with pytest.raises(JournalShort) as e:
        open_journal(tmp_path / "journal.bin", "off")
    assert str(e.value) == (f"journal {journal.path} ends at entry 3, but its meta file journal.meta records entries "
                            "up to 9 as committed: entries 4..9 are missing (the file was cut or lost its end); the "
                            f"member will not start on it: {WHAT_TO_DO}")
    assert recorded_commit_index(tmp_path / "journal.meta") == 9


def test_an_old_pysyncobj_journal_is_refused_with_words(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    path.write_bytes(b"PYSYNCOBJ" + bytes(60))
    with pytest.raises(JournalDamaged) as e:
        open_journal(path, "always")
    assert str(e.value) == (f"journal {path} is damaged at offset 0: not an llmgw journal (pysyncobj's own format, "
                            f"written by an older llmgw); the member will not start on it: {WHAT_TO_DO}")


# --- damage at start: a clear error naming the file, never an empty state ------------------


def damaged_words(path: Path, offset: int, what: str) -> str:
    return f"journal {path} is damaged at offset {offset}: {what}; the member will not start on it: {WHAT_TO_DO}"


@pytest.mark.parametrize("which", ["middle", "last"])
async def test_a_damaged_length_word_is_an_error_naming_file_and_offset(tmp_path: Path, which: str) -> None:
    await store_with_models(tmp_path, 4)
    journal = tmp_path / "raft" / "journal.bin"
    found = records(journal)
    n = 2 if which == "middle" else len(found)
    offset = found[n - 1][0]
    patch_byte(journal, offset + 1)  # the length word grows by thousands: it would read as a torn tail
    before = journal.read_bytes()
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path)
    with pytest.raises(CannotStart) as e:
        await store.start()
    assert str(e.value) == damaged_words(journal, offset, f"the length word of record {n} does not match its check")
    assert journal.read_bytes() == before, "a refused start changes nothing"
    assert not store.fresh


@pytest.mark.parametrize("which", ["middle", "last"])
async def test_a_flipped_byte_in_a_record_is_an_error(tmp_path: Path, which: str) -> None:
    """In the middle or in the last complete record alike: a complete record was handed to the
    kernel whole, so a kill cannot damage it; only the disk (or a power loss) can, and it may
    have been acknowledged."""
    await store_with_models(tmp_path, 4)
    journal = tmp_path / "raft" / "journal.bin"
    found = records(journal)
    n = 3 if which == "middle" else len(found)
    offset, size = found[n - 1]
    patch_byte(journal, offset + size - 5)
    with pytest.raises(CannotStart) as e:
        await RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path).start()
    assert str(e.value) == damaged_words(journal, offset, f"record {n} ({size - 12} bytes) fails its checksum")


def torn_append(journal: Path, cut: int) -> int:
    """What a kill during the append of the next entry leaves: its record's first `cut` bytes.
    Returns the offset it starts at."""
    found = records(journal)
    offset, size = found[-1]
    data = journal.read_bytes()
    (idx, term) = struct.unpack_from("<QQ", data, offset + 12)
    record = encode_record(commands.encode(commands.put_model(demo("torn"), 50.0)), idx + 1, term)
    with open(journal, "ab") as f:
        f.write(record[:cut])
    return offset + size


@pytest.mark.parametrize("cut", [1, 11, 12, 30])
async def test_a_torn_last_record_is_cut_with_a_warning(tmp_path: Path, cut: int,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A kill during an append leaves the file ending inside the record (its header or its
    payload), past the commit index: with fsync always, this member never acknowledged it. It
    is cut off, saying so; everything before it stays."""
    await store_with_models(tmp_path, 3)
    journal = tmp_path / "raft" / "journal.bin"
    offset = torn_append(journal, cut)
    caplog.set_level(logging.WARNING, "llmgw.store")
    store = await open_store(tmp_path)
    try:
        assert set(store.snapshot().models) == {"m0", "m1", "m2"}
        assert (f"journal {journal}: cut a torn last record ({cut} bytes at offset {offset}, past the recorded "
                "commit index): a record this member never acknowledged (fsync policy always: it was never flushed, "
                "so never counted or answered for); safe to drop") in caplog.text
        assert not store.fresh
        await store.submit(commands.put_model(demo("m9"), 9.0))
    finally:
        store.close()
    again = await open_store(tmp_path)
    try:
        assert set(again.snapshot().models) == {"m0", "m1", "m2", "m9"}
    finally:
        again.close()


async def test_a_journal_with_entries_missing_before_it_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "raft").mkdir()
    journal = open_journal(tmp_path / "raft" / "journal.bin", "always")
    for entry in entries(3, start=40):
        journal.add(*entry)
    journal.close()
    with pytest.raises(CannotStart) as e:
        await RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path).start()
    assert str(e.value) == (f"journal {journal.path} starts at entry 40 but there is no snapshot of the entries "
                            "before it: restore the snapshot from a peer, or move the journal away to start "
                            "this member empty")


# --- snapshots: JSON, compaction, restarts ----------------------------------------------


@pytest.mark.parametrize("fsync", ["always", "off"])
async def test_a_restart_after_many_commits_and_compactions_has_the_same_state(tmp_path: Path, fsync: str) -> None:
    store = await open_store(tmp_path, fsync=fsync, compaction_min_entries=40)
    try:
        for i in range(150):
            await store.submit(commands.put_model(demo(f"m{i % 30}", (f"--n={i}",)), float(i)))
        await store.submit(commands.put_setting("notify.webhooks", ["https://x.example/h"], 200.0))
        state = store.snapshot()
        log_size = store.status()["log_size"]
    finally:
        store.close()
    snapshot = tmp_path / "raft" / "snapshot.json"
    assert snapshot.exists() and log_size < 100, "the journal was compacted into snapshots"
    assert json.loads(snapshot.read_bytes().partition(b"\n")[0])["format"] == "llmgw-snapshot"
    assert read_snapshot(snapshot).state.revision > 40
    again = await open_store(tmp_path, fsync=fsync, compaction_min_entries=40)
    try:
        assert again.snapshot() == state
        assert not again.fresh
    finally:
        again.close()


async def test_entries_after_a_snapshot_survive_a_crash_before_compaction(tmp_path: Path) -> None:
    """pysyncobj writes a snapshot, then compacts the journal a tick later. A crash between the
    two leaves the whole journal beside the snapshot; pysyncobj alone would then replace the
    journal by the snapshot's two entries, losing every entry written after the snapshot."""
    await store_with_models(tmp_path, 50)  # no compaction: 5000 entries are far
    whole = tmp_path / "raft" / "journal.bin"
    first_part = open_journal(whole, "always")
    early = list(first_part[:])
    first_part.close()
    store = await open_store(tmp_path, compaction_min_entries=30)  # compacts at its first ticks
    try:
        with trio.fail_after(10):
            while store.status()["log_size"] > 30:
                await trio.sleep(0.02)
        for i in range(20):
            await store.submit(commands.put_model(demo(f"late{i}"), 100.0 + i))
        state = store.snapshot()
    finally:
        store.close()
    snap = read_snapshot(tmp_path / "raft" / "snapshot.json")
    late = open_journal(whole, "always")
    tail = list(late[:])
    late.close()
    assert snap.state.revision < state.revision and tail[0][1] <= early[-1][1] + 1
    # The files as that crash leaves them: the snapshot, and the journal not yet compacted
    # (written beside, then moved over the compacted one; its meta file stays).
    crashed = open_journal(tmp_path / "crashed.bin", "always")
    for entry in [*early, *(e for e in tail if e[1] > early[-1][1])]:
        crashed.add(*entry)
    crashed.close()
    os.replace(crashed.path, whole)
    again = await open_store(tmp_path)
    try:
        assert again.snapshot() == state
    finally:
        again.close()


async def test_a_damaged_snapshot_is_an_error_naming_the_file(tmp_path: Path) -> None:
    store = await open_store(tmp_path, compaction_min_entries=5)
    try:
        for i in range(20):
            await store.submit(commands.put_model(demo(f"m{i}"), float(i)))
    finally:
        store.close()
    snapshot = tmp_path / "raft" / "snapshot.json"
    patch_byte(snapshot, snapshot.stat().st_size - 10, 0x01)
    with pytest.raises(SnapshotDamaged) as e:
        await RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path).start()
    assert str(e.value) == (f"snapshot {snapshot} is damaged: the body's sha256 does not match its header; the member "
                            f"will not start on it: {WHAT_TO_DO}")
    assert isinstance(e.value, CannotStart)


async def test_a_journal_moved_away_beside_its_snapshot_and_meta_is_refused(tmp_path: Path) -> None:
    """Starting from the snapshot alone would forget the entries after it, which this member
    acknowledged (issue 19: it used to start so, silently): refused, naming what is there, and
    nothing is created in its place."""
    store = await open_store(tmp_path, compaction_min_entries=5)
    try:
        for i in range(20):
            await store.submit(commands.put_model(demo(f"m{i}"), float(i)))
        committed = store.status()["commit_index"]
    finally:
        store.close()
    snapshot = read_snapshot(tmp_path / "raft" / "snapshot.json")
    journal = tmp_path / "raft" / "journal.bin"
    journal.rename(tmp_path / "journal.bin.damaged")
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path)
    with pytest.raises(JournalShort) as e:
        await store.start()
    assert str(e.value) == (f"journal {journal} is missing, but its meta file journal.meta is there (entries up to "
                            f"{committed} committed) and a snapshot of entries up to {snapshot.last[1]} is there: "
                            "this member had a journal, and the entries in it are missing; the member will not "
                            f"start without it: {WHAT_TO_DO}")
    assert not journal.exists() and not store.fresh


def test_up_on_a_damaged_journal_exits_1_with_the_words(tmp_path: Path) -> None:
    trio.run(store_with_models, tmp_path, 3)
    journal = tmp_path / "raft" / "journal.bin"
    offset, size = records(journal)[1]
    patch_byte(journal, offset + size - 3)
    done = subprocess.run([sys.executable, "-m", "llmgw", "up", "--state-dir", str(tmp_path), "--gateway-port",
                           str(free_port()), "--admin-port", str(free_port())],
                          capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert (f"cannot start: journal {journal} is damaged at offset {offset}: record 2 ({size - 12} bytes) fails "
            f"its checksum; the member will not start on it: {WHAT_TO_DO}") in output
    assert "Traceback" not in output


# --- fresh or not: only a cluster that never logged a command is seeded --------------------


async def test_fresh_means_no_command_was_ever_logged(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    assert store.fresh
    store.close()
    store = await open_store(tmp_path)  # a first start stopped before it seeded: still fresh
    assert store.fresh
    await store.submit(commands.put_model(demo("a"), 1.0))
    store.close()
    store = await open_store(tmp_path)
    assert not store.fresh
    store.close()


async def test_seed_cluster_seeds_only_a_fresh_cluster() -> None:
    seed = Seed(admin_key="admin-key", client_key="client-key", models=[demo("a"), demo("b")])
    store = MemoryStore()
    await seed_cluster(store, seed, 1.0, fresh=True)
    assert set(store.snapshot().models) == {"a", "b"} and len(store.snapshot().keys) == 2
    store.submit_nowait(commands.remove_model("a", 2.0))
    await seed_cluster(store, seed, 3.0, fresh=False)
    assert set(store.snapshot().models) == {"b"}, "a model the operator removed stays removed"
    other = MemoryStore()  # not fresh, yet empty (never happens now: damage is an error): no models
    await seed_cluster(other, seed, 1.0, fresh=False)
    assert other.snapshot().models == {} and len(other.snapshot().keys) == 2, "keys are re-added if missing"


# --- a full disk: writes refused with words, reads served, never SIGBUS ------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk refuses another byte."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, bytes(size))
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


async def test_a_full_disk_refuses_writes_with_words_and_reads_go_on(small_disk: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    state_dir = small_disk / "state"
    store = await open_store(state_dir)
    big = ("x" * 6000,)  # larger than a page: a full tmpfs has no room for it
    try:
        await store.submit(commands.put_model(demo("before", big), 1.0))
        filler = fill(small_disk)
        before = store.snapshot()
        for attempt in range(3):  # each refused at once, not after the commit timeout
            with trio.fail_after(5), pytest.raises(StoreUnavailable) as e:
                await store.submit(commands.put_model(demo(f"refused{attempt}", big), 2.0))
            journal = state_dir / "raft" / "journal.bin"
            assert str(e.value).startswith(f"the write was not committed: the disk is full: cannot append entry ")
            assert str(e.value).endswith(f" to {journal} (this member still serves reads)")
        assert store.snapshot() == before and "before" in store.snapshot().models, "reads are served"
        assert store.is_leader()
        assert caplog.text.count("the disk is full") <= 4, "logged at its 1st, 2nd, 4th... time, not every tick"
        filler.unlink()
        await store.submit(commands.put_model(demo("after", big), 3.0))
        state = store.snapshot()
    finally:
        store.close()
    again = await open_store(state_dir)
    try:
        assert again.snapshot() == state and {"before", "after"} <= set(state.models)
        assert not any(name.startswith("refused") for name in state.models)
    finally:
        again.close()


# --- the fsync policy's cost, measured (the benchmark calls the same function) -------------


@pytest.mark.parametrize("fsync", ["always", "off"])
async def test_the_fsync_cost_can_be_measured(tmp_path: Path, fsync: str) -> None:
    cost = await measure_commits(tmp_path, fsync, commits=20, timeouts=FAST)  # type: ignore[arg-type]
    assert cost.commits == 20 and cost.per_s > 0 and 0 < cost.p50_ms <= cost.p99_ms


# --- SIGKILL in the middle of writes: every acknowledged one is there after the restart -----


def test_sigkill_of_up_mid_writes_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text("")  # no engines: the test is about the store
    state_dir = tmp_path / "state"
    up = UpProcess(state_dir, extra_args=["--catalog", str(catalog)]).start()
    acked: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        creds = up.credentials
        with httpx.Client(base_url=creds["admin_url"], timeout=5,
                          headers={"authorization": f"Bearer {creds['admin_key']}"}) as client:
            for i in range(100_000):
                if stop.is_set():
                    return
                name = f"w{i}"
                try:
                    r = client.post("/api/v1/models", json={"name": name, "engine": "sim", "source": f"sim://{name}",
                                                           "mode": "on-demand", "replicas": {"min": 0, "max": 1}})
                except httpx.HTTPError:
                    return  # the process is gone: this write's outcome is unknown, not acknowledged
                if 200 <= r.status_code < 300:
                    acked.append(name)

    thread = threading.Thread(target=writer)
    thread.start()
    deadline = time.monotonic() + 20
    while len(acked) < 60 and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    assert up.proc is not None
    up.proc.kill()  # SIGKILL, mid-write
    up.proc.wait()
    stop.set()
    thread.join(10)
    up.kill()
    assert len(acked) >= 60, f"only {len(acked)} writes were acknowledged before the kill"

    again = UpProcess(state_dir, extra_args=["--catalog", str(catalog)]).start()
    try:
        creds = again.credentials
        r = httpx.get(f"{creds['admin_url']}/api/v1/models", headers={"authorization": f"Bearer {creds['admin_key']}"},
                      timeout=10)
        r.raise_for_status()
        body = r.json()
        present = {m["name"] for m in (body["models"] if isinstance(body, dict) else body)}
        missing = [name for name in acked if name not in present]
        assert not missing, f"{len(missing)} acknowledged writes lost: {missing[:5]}"
    finally:
        again.kill()


# --- a cut or missing journal through `llmgw up`: refused with one line, nothing seeded ----


@pytest.fixture(scope="module")
def up_after_writes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The state dir of an `llmgw up` that acknowledged 20 writes and was then SIGKILLed (as the
    issue's operator did), and its catalog."""
    base = tmp_path_factory.mktemp("up")
    catalog = base / "catalog.toml"
    catalog.write_text("")
    state_dir = base / "state"
    up = UpProcess(state_dir, extra_args=["--catalog", str(catalog)]).start()
    try:
        creds = up.credentials
        with httpx.Client(base_url=creds["admin_url"], timeout=10,
                          headers={"authorization": f"Bearer {creds['admin_key']}"}) as client:
            for i in range(20):
                r = client.post("/api/v1/models", json={"name": f"w{i}", "engine": "sim", "source": f"sim://w{i}",
                                                       "mode": "on-demand", "replicas": {"min": 0, "max": 1}})
                assert r.status_code < 300, r.text
    finally:
        assert up.proc is not None
        up.proc.kill()
        up.proc.wait()
        up.kill()
    return state_dir, catalog


def entry_index(journal: Path, offset: int) -> int:
    (idx,) = struct.unpack_from("<Q", journal.read_bytes(), offset + 12)
    return int(idx)


@pytest.mark.parametrize("damage", ["cut at a record boundary", "cut inside record 2", "journal deleted"])
def test_up_on_a_cut_or_missing_journal_refuses_with_one_line_and_seeds_nothing(
        up_after_writes: tuple[Path, Path], tmp_path: Path, damage: str) -> None:
    """Issue 19's three cases: each used to start with acknowledged writes gone (the last two as
    a "fresh cluster seeded"). Each is refused now, naming what is missing; no file changes."""
    shutil.copytree(up_after_writes[0], tmp_path / "state")
    state_dir, catalog = tmp_path / "state", up_after_writes[1]
    journal, meta = state_dir / "raft" / "journal.bin", state_dir / "raft" / "journal.meta"
    committed = recorded_commit_index(meta)
    found = records(journal)
    assert committed is not None and committed >= 22 and entry_index(journal, found[-1][0]) >= committed
    if damage == "journal deleted":
        journal.unlink()
        expected = (f"journal {journal} is missing, but its meta file journal.meta is there (entries up to "
                    f"{committed} committed): this member had a journal, and the entries in it are missing; the "
                    f"member will not start without it: {WHAT_TO_DO}")
    else:
        offset = found[10][0] if damage == "cut at a record boundary" else found[1][0] + 15
        before = entry_index(journal, found[9][0]) if damage == "cut at a record boundary" else 1
        with open(journal, "r+b") as f:
            f.truncate(offset)
        where = (f"ends at entry {before}" if damage == "cut at a record boundary"
                 else f"ends inside a record at offset {found[1][0]}, after entry 1")
        expected = (f"journal {journal} {where}, but its meta file journal.meta records entries up to {committed} as "
                    f"committed: entries {before + 1}..{committed} are missing (the file was cut or lost its end); "
                    f"the member will not start on it: {WHAT_TO_DO}")
    files = {p.name: p.read_bytes() for p in (state_dir / "raft").iterdir()}
    done = subprocess.run([sys.executable, "-m", "llmgw", "up", "--state-dir", str(state_dir), "--catalog",
                           str(catalog), "--gateway-port", str(free_port()), "--admin-port", str(free_port())],
                          capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    lines = [line for line in output.splitlines() if "cannot start:" in line]
    assert len(lines) == 1 and lines[0].endswith(f"cannot start: {expected}"), output
    assert "cluster seeded" not in output and "state loaded" not in output and "Traceback" not in output, output
    assert {p.name: p.read_bytes() for p in (state_dir / "raft").iterdir()} == files, "a refused start changes nothing"
