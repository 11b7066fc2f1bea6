"""A real `llmgw control` on a state dir the operator made with 0755 (as usual under /var/lib), started by a
shell whose umask is 022: every dir in it ends 0700 and every file 0600, at the first start and again at a
start after someone widened them, and the control plane's log names what it fixed."""

from __future__ import annotations

import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.processes import free_port

pytestmark = pytest.mark.slow


def modes(state: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(state.lstat().st_mode)}
    for root, dirs, files in os.walk(state):
        for name in (*dirs, *files):
            path = Path(root) / name
            found[str(path.relative_to(state))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def run_control(state: Path, until: str) -> list[str]:
    """Start `llmgw control` on `state`, read its output until a line holds `until`, stop it; its lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "control", "--state-dir", str(state), "--raft-addr",
         f"127.0.0.1:{free_port()}", "--admin-addr", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "LLMGW_ADMIN_KEY": "sk-modes-admin"}, preexec_fn=lambda: os.umask(0o022))
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while not any(until in line for line in seen):
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError("llmgw control exited:\n" + "".join(seen))
            seen.append(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        assert proc.stdout is not None
        proc.stdout.close()
    return seen


def test_control_makes_a_0755_state_dir_its_own(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    first = run_control(state, "admin API on")
    assert any("llmgw.statedir: state dir" in line and ". (0755 -> 0700)" in line for line in first), first
    made = modes(state)
    assert {"raft", "raft/journal.bin", "logs/control.log", "cluster.secret"} <= set(made)
    wide = {p: oct(m) for p, m in made.items() if m & 0o077}
    assert wide == {}, f"open to other users after the first start: {wide}"

    # What an older llmgw (or an operator's chmod -R) left: raft/ 0755, journal.bin 0644, the log 0644.
    for path, wider in (("raft", 0o755), ("raft/journal.bin", 0o644), ("logs/control.log", 0o644)):
        (state / path).chmod(wider)
    again = run_control(state, "admin API on")
    [warning] = [line for line in again if "llmgw.statedir" in line]
    assert "3 path(s) other users could read or enter were made the owner's alone" in warning
    for named in ("raft (0755 -> 0700)", "raft/journal.bin (0644 -> 0600)", "logs/control.log (0644 -> 0600)"):
        assert named in warning
    assert {p: oct(m) for p, m in modes(state).items() if m & 0o077} == {}
    assert all(m in (0o700, 0o600) for m in modes(state).values()), modes(state)
