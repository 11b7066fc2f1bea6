"""The state dir lock: one holder at a time, named by pid; gone with its process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw import statedir
from llmgw.statedir import StateDirBusy

HOLD = """
import sys, time
from pathlib import Path
from llmgw import statedir
held = statedir.acquire(Path(sys.argv[1]), "holder in a child")
print("locked", flush=True)
time.sleep(60)
"""


def test_the_lock_file_is_created_first_and_names_its_holder(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    with statedir.acquire(state, "llmgw test"):
        assert [p.name for p in state.iterdir()] == ["lock"]
        assert (state / "lock").read_text() == f"{os.getpid()} llmgw test\n"
        assert oct(state.stat().st_mode & 0o777) == oct(0o700)


def test_a_second_acquire_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    with statedir.acquire(tmp_path, "llmgw up"):
        with pytest.raises(StateDirBusy) as e:
            statedir.acquire(tmp_path, "llmgw control")
        assert e.value.pid == os.getpid() and e.value.owner == "llmgw up"
        assert str(e.value) == (f"state dir {tmp_path.resolve()} is in use by pid {os.getpid()} (llmgw up); "
                                "stop it first or use --state-dir")
        assert (tmp_path / "lock").read_text() == f"{os.getpid()} llmgw up\n", "a refused acquire writes nothing"


def test_released_after_the_holder_closes(tmp_path: Path) -> None:
    first = statedir.acquire(tmp_path, "first")
    first.release()
    with statedir.acquire(tmp_path, "second"):
        assert (tmp_path / "lock").read_text() == f"{os.getpid()} second\n"


def test_a_killed_holder_leaves_a_lock_file_that_does_not_block(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        with pytest.raises(StateDirBusy) as e:
            statedir.acquire(tmp_path, "me")
        assert e.value.pid == child.pid and e.value.owner == "holder in a child"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert (tmp_path / "lock").read_text() == f"{child.pid} holder in a child\n", "the stale file is still there"
    with statedir.acquire(tmp_path, "me"):
        assert (tmp_path / "lock").read_text() == f"{os.getpid()} me\n"


def test_child_processes_do_not_inherit_the_lock(tmp_path: Path) -> None:
    """Engines outlive nothing, but even one that did must not keep the dir locked."""
    held = statedir.acquire(tmp_path, "parent")
    child = subprocess.Popen(["sleep", "30"], close_fds=False)
    try:
        held.release()
        with statedir.acquire(tmp_path, "next"):
            pass
    finally:
        child.kill()
        child.wait()


def test_acquire_or_exit_says_who_holds_it(tmp_path: Path) -> None:
    with statedir.acquire(tmp_path, "llmgw agent"):
        with pytest.raises(SystemExit) as e:
            statedir.acquire_or_exit(tmp_path, "llmgw agent")
    assert str(e.value.code).startswith(f"error: state dir {tmp_path.resolve()} is in use by pid {os.getpid()}")
