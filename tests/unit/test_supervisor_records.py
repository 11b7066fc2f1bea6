"""The agent's engine records and logs (llmgw/agent/adoption.py, engine_log.py): ids that never
become paths, atomic records, a pid's identity by its start time, bounded logs and their tails."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from llmgw.agent import engine_log
from llmgw.agent.adoption import (EngineRecord, Records, file_stem, launch_hash, replica_id_problem, same_process,
                                  start_ticks)


def record(replica_id: str = "demo-r1", pid: int = 4242, ticks: int = 99) -> EngineRecord:
    return EngineRecord(replica_id, "demo", "sim", pid, ticks, "http://127.0.0.1:40001", "http", "/health", "abc",
                        1.0e9)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("rid", ["../../x", "/etc/passwd", "a/b", "..", ".hidden", "x\x00y", "", "é", "a b",
                                 "x" * 201])
def test_a_crafted_replica_id_is_refused_and_still_never_a_path(tmp_path: Path, rid: str) -> None:
    assert replica_id_problem(rid).startswith("replica id ")
    stem = file_stem(rid)
    assert "/" not in stem and not stem.startswith(".") and "\x00" not in stem and 0 < len(stem) <= 61
    records = Records(tmp_path / "engines")
    for path in (records.record_path(rid), records.log_path(rid)):
        assert path.parent == tmp_path / "engines"


@pytest.mark.parametrize("rid", ["demo-r1", "llama3:8b-r12", "Qwen2.5-7B-Instruct-r3", "a" * 200])
def test_model_names_make_good_replica_ids(rid: str) -> None:
    assert replica_id_problem(rid) == ""


def test_file_names_are_distinct_for_ids_that_clean_to_the_same_text() -> None:
    assert file_stem("a:b-r1") != file_stem("a_b-r1")
    assert file_stem("demo-r1").startswith("demo-r1.")


def test_launch_hash_ignores_nothing_control_asked_for() -> None:
    base = launch_hash("m1", "demo", [0], None)
    assert base == launch_hash("m1", "demo", (0,), None)
    assert len({base, launch_hash("m2", "demo", [0], None), launch_hash("m1", "other", [0], None),
                launch_hash("m1", "demo", [1], None), launch_hash("m1", "demo", [0], ("rank", 1))}) == 5


def test_records_are_written_whole_and_read_back(tmp_path: Path) -> None:
    records = Records(tmp_path / "engines")
    rec = record()
    records.write(rec)
    assert sorted(p.name for p in records.dir.iterdir()) == [f"{file_stem('demo-r1')}.json"]  # no .tmp left
    assert records.load() == [rec]
    records.write(record(pid=5000))
    assert [r.pid for r in records.load()] == [5000]
    records.delete("demo-r1")
    assert records.load() == []


def test_unreadable_records_and_orphan_files_are_removed(tmp_path: Path) -> None:
    records = Records(tmp_path / "engines")
    records.write(record())
    kept_log = records.log_path("demo-r1")
    kept_log.write_text("engine output\n")
    (records.dir / "broken.json").write_text("{not json")
    (records.dir / "wrong-version.json").write_text(json.dumps({**asdict(record()), "version": 99}))
    # A record whose file name is not its id's: a copy or a crafted file is not adopted.
    (records.dir / "elsewhere.json").write_text(json.dumps(asdict(record("other-r1"))))
    (records.dir / "old-r7.log").write_text("a log of a replica no record names\n")
    (records.dir / "old-r7.log.1").write_text("its rotated part\n")
    (records.dir / f"{file_stem('demo-r1')}.json.tmp").write_text("{")  # a write cut short
    (records.dir / "README").write_text("not ours: left alone\n")
    assert records.load() == [record()]
    assert sorted(p.name for p in records.dir.iterdir()) == sorted(
        ["README", kept_log.name, f"{file_stem('demo-r1')}.json"])


@pytest.mark.parametrize("doc", [
    {"pid": "12"}, {"pid": 1}, {"url": "file:///etc"}, {"health": "health"}, {"replica_id": "../x"},
    {"start_ticks": True}, {"probe": "ping"},
])
def test_a_record_with_a_bad_field_is_refused(doc: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EngineRecord.from_doc({**asdict(record()), **doc})


def test_a_pid_is_the_same_process_only_with_the_same_start_time(sleeper: subprocess.Popen[bytes]) -> None:
    ticks = start_ticks(sleeper.pid)
    assert ticks is not None and ticks > 0
    assert same_process(sleeper.pid, ticks)
    assert not same_process(sleeper.pid, ticks + 1), "a reused pid has another start time"
    sleeper.kill()
    sleeper.wait()
    assert start_ticks(sleeper.pid) is None and not same_process(sleeper.pid, ticks)


def test_start_time_is_read_past_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    fields = ["S"] + [str(n) for n in range(4, 22)] + ["777"] + ["0"] * 30  # field 22 is 777
    (tmp_path / "321").mkdir()
    (tmp_path / "321" / "stat").write_text(f"321 (a) b (c)) {' '.join(fields)}\n")
    assert start_ticks(321, tmp_path) == 777
    (tmp_path / "321" / "stat").write_text(f"321 (x) Z {' '.join(fields[1:])}\n")
    assert start_ticks(321, tmp_path) is None, "a zombie is gone"
    assert start_ticks(999, tmp_path) is None


def test_logs_rotate_at_their_cap_into_one_file(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    with engine_log.open_for_engine(path) as out:  # the engine's descriptor: O_APPEND
        out.write(b"".join(b"line %d\n" % n for n in range(200)))
        out.flush()
        assert engine_log.rotate_if_large(path, cap=100)
        assert path.stat().st_size == 0 and engine_log.rotated(path).stat().st_size > 100
        out.write(b"after the rotation\n")
        out.flush()
    assert path.read_bytes() == b"after the rotation\n", "the engine's next write lands at the new end"
    assert not engine_log.rotate_if_large(path, cap=100)
    assert engine_log.tail(path, lines=3) == "line 198 | line 199 | after the rotation"
    engine_log.remove(path)
    assert not path.exists() and not engine_log.rotated(path).exists()


def test_the_tail_keeps_the_last_lines_within_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    assert engine_log.tail(path) == "" and engine_log.tail(None) == ""
    path.write_bytes(b"x" * 50_000 + b"\n\nfirst\n  \nsecond\nthird \xff\n")
    assert engine_log.tail(path, lines=2) == "second | third \ufffd"
    assert len(engine_log.tail(path, lines=8, limit=10)) == 10
    os.truncate(path, 0)
    assert engine_log.tail(path) == ""
