"""One state dir, one process: an exclusive `flock` on STATE_DIR/lock, taken before
anything else in the dir is read or written, holding the owner's pid and role."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_NAME = "lock"


class StateDirBusy(Exception):
    """Another live process holds the state dir; `pid` and `owner` say who (None/"" if unknown)."""

    def __init__(self, state_dir: Path, pid: int | None, owner: str) -> None:
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"state dir {state_dir} is in use by {holder}{f' ({owner})' if owner else ''}; "
                         "stop it first or use --state-dir")
        self.state_dir = state_dir
        self.pid = pid
        self.owner = owner


class StateDirLock:
    """A held lock. The kernel drops it when the process ends, however it ends (SIGKILL
    included), so a lock file left behind by a dead process never blocks the next one."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> StateDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(state_dir: Path, owner: str) -> StateDirLock:
    """Create `state_dir` if needed and lock it for this process, or raise `StateDirBusy`.

    The lock file is the first thing created in the dir. Its descriptor is not inherited
    by child processes (engines), so they can never keep the dir locked after we exit.
    """
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid, holder = _read_holder(fd)
        os.close(fd)
        raise StateDirBusy(state_dir, pid, holder) from None
    except BaseException:
        os.close(fd)
        raise
    # Ours now: replace whatever a previous (dead) owner left.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {owner}\n".encode(), 0)
    return StateDirLock(state_dir, fd)


def _read_holder(fd: int) -> tuple[int | None, str]:
    """(pid, owner) from the lock file; (None, "") if the holder never writes it.

    A holder writes its pid right after taking the lock: give it a moment.
    """
    for _ in range(20):
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        pid_text, _, owner = text.partition(" ")
        if pid_text.isdigit():
            return int(pid_text), owner
        time.sleep(0.01)
    return None, ""


def acquire_or_exit(state_dir: Path, owner: str) -> StateDirLock:
    """`acquire` for a command's first line: a busy or unusable dir ends the process (exit 1)."""
    try:
        return acquire(state_dir, owner)
    except StateDirBusy as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:
        raise SystemExit(f"error: cannot use state dir {state_dir}: {e.strerror or e}") from None
