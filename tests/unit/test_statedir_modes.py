"""The state dir is its owner's alone: `tighten` takes group and other bits off every dir and file under it
(a dir the operator made 0755 once left raft/ 0755 and journal.bin 0644, and a local user read a webhook
token from it), keeps the owner's bits (an executable stays one), follows no symlink, leaves sockets alone,
and the role's one warning names what it fixed. A role's umask makes what it creates 0600 and 0700."""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw import statedir


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def made_by_an_operator(tmp_path: Path) -> Path:
    """A state dir made beforehand with 0755, and what a wider umask left in it."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    (state / "raft").mkdir()
    (state / "raft").chmod(0o755)
    (state / "raft" / "journal.bin").write_bytes(b"webhook token")
    (state / "raft" / "journal.bin").chmod(0o644)
    (state / "engines").mkdir(mode=0o700)
    (state / "engines" / "run.sh").write_text("#!/bin/sh\n")
    (state / "engines" / "run.sh").chmod(0o755)
    (state / "credentials.json").write_text("{}")
    (state / "credentials.json").chmod(0o600)  # already right: not named
    return state


def test_every_dir_becomes_0700_and_every_file_0600_keeping_the_owners_bits(tmp_path: Path) -> None:
    state = made_by_an_operator(tmp_path)
    outside = tmp_path / "weights.gguf"
    outside.write_bytes(b"GGUF")
    outside.chmod(0o644)
    (state / "weights.gguf").symlink_to(outside)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(state / "engine.sock"))
        os.chmod(state / "engine.sock", 0o777)

        done = statedir.tighten(state)

        assert mode(state / "engine.sock") == 0o777, "a socket is left alone"
    assert sorted(done.changed) == [(".", 0o755, 0o700), ("engines/run.sh", 0o755, 0o700), ("raft", 0o755, 0o700),
                                    ("raft/journal.bin", 0o644, 0o600)]
    assert (mode(state), mode(state / "raft"), mode(state / "raft" / "journal.bin")) == (0o700, 0o700, 0o600)
    assert mode(state / "engines" / "run.sh") == 0o700, "an executable stays one, for its owner"
    assert mode(outside) == 0o644, "a symlink is not followed out of the state dir"
    assert done.failed == []
    assert statedir.tighten(state).changed == [], "a second start has nothing to fix"


def test_the_warning_names_what_was_fixed_count_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = made_by_an_operator(tmp_path)
    for i in range(6):
        (state / f"seg-{i}.log").write_text("")
        (state / f"seg-{i}.log").chmod(0o644)
    with statedir.acquire(state, "llmgw test") as lock:
        lock.tightened = statedir.tighten(lock.state_dir)
        with caplog.at_level(logging.WARNING, logger="llmgw.statedir"):
            lock.warn_tightened()
    [record] = caplog.records
    assert record.getMessage().startswith(
        f"state dir {state.resolve()}: 10 path(s) other users could read or enter were made the owner's alone: "
        f". (0755 -> 0700), ")
    assert record.getMessage().endswith(" and 5 more")
    caplog.clear()
    with statedir.acquire(state, "llmgw test") as lock:
        lock.tightened = statedir.tighten(lock.state_dir)
        lock.warn_tightened()
    assert caplog.records == [], "nothing fixed: no line"


ROLE_START = """
import os, sys
from pathlib import Path
from llmgw import statedir
with statedir.acquire_or_exit(Path(sys.argv[1]), "llmgw test") as lock:
    (lock.state_dir / "logs").mkdir()
    (lock.state_dir / "logs" / "x.log").write_text("")
    print(len(lock.tightened.changed))
"""


def test_a_role_start_tightens_and_what_it_creates_is_private(tmp_path: Path) -> None:
    state = made_by_an_operator(tmp_path)
    out = subprocess.run([sys.executable, "-c", ROLE_START, str(state)], capture_output=True, text=True, check=True,
                         env={**os.environ}, preexec_fn=lambda: os.umask(0o022))
    assert out.stdout.strip() == "4"
    assert (mode(state / "logs"), mode(state / "logs" / "x.log"), mode(state / "lock")) == (0o700, 0o600, 0o600)
