"""One state dir, one process: an exclusive `flock` on STATE_DIR/lock, taken before
anything else in the dir is read or written, holding the owner's pid and role; and the dir
the owner's alone (`tighten`: every dir 0700, every file 0600, or 0700 when owner-executable)."""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCK_NAME = "lock"
# `llmgw init` leaves the hash of the first admin key here for the control plane's first start (never the
# key); the control plane removes it once the group holds the key, so a key removed later stays removed.
FIRST_ADMIN_FILE = "first-admin-key.json"
PRIVATE_UMASK = 0o077  # what a role and its engines create is the owner's alone
NAMED = 5  # the paths a warning names; the rest are counted

log = logging.getLogger("llmgw.statedir")


class StateDirBusy(Exception):
    """Another live process holds the state dir; `pid` and `owner` say who (None/"" if unknown)."""

    def __init__(self, state_dir: Path, pid: int | None, owner: str) -> None:
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"state dir {state_dir} is in use by {holder}{f' ({owner})' if owner else ''}; "
                         "stop it first or use --state-dir")
        self.state_dir = state_dir
        self.pid = pid
        self.owner = owner


@dataclass
class Tightened:
    """What `tighten` changed: (path relative to the state dir, mode before, mode after), and the paths it
    could not change (another owner's, gone meanwhile) with why."""

    changed: list[tuple[str, int, int]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def words(self, state_dir: Path) -> str:
        """One line for the operator: how many, and the first few paths."""
        parts = []
        if self.changed:
            named = ", ".join(f"{p} ({old:04o} -> {new:04o})" for p, old, new in self.changed[:NAMED])
            more = f" and {len(self.changed) - NAMED} more" if len(self.changed) > NAMED else ""
            parts.append(f"{len(self.changed)} path(s) other users could read or enter were made the owner's "
                         f"alone: {named}{more}")
        if self.failed:
            named = ", ".join(f"{p} ({why})" for p, why in self.failed[:NAMED])
            more = f" and {len(self.failed) - NAMED} more" if len(self.failed) > NAMED else ""
            parts.append(f"{len(self.failed)} could not be changed: {named}{more}")
        return f"state dir {state_dir}: " + "; ".join(parts)


def tighten(state_dir: Path) -> Tightened:
    """Take group and other bits off every dir and regular file under `state_dir`, the dir included: a dir
    0755 becomes 0700, a file 0644 becomes 0600, and one 0755 0700 (the owner's bits are kept, so nothing
    an engine runs stops running, and nothing read-only becomes writable). Symlinks are neither followed
    nor changed (their target may lie outside); sockets, pipes and devices are left alone. A dir made beforehand with 0755, as usual under
    /var/lib, would otherwise let any local user read the journal (webhook tokens, key hashes)."""
    done = Tightened()
    for root, dirs, files in os.walk(state_dir, onerror=None, followlinks=False):
        base = Path(root)
        if base == state_dir:
            _tighten_one(state_dir, state_dir, done)
        for name in (*dirs, *files):
            _tighten_one(state_dir, base / name, done)
    return done


def _tighten_one(state_dir: Path, path: Path, done: Tightened) -> None:
    try:
        mode = os.lstat(path).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)) or not mode & 0o077:
            return
        tight = stat.S_IMODE(mode) & 0o700  # the owner's bits, as they were: 0755 -> 0700, 0644 -> 0600
        os.chmod(path, tight)  # not a symlink (lstat said so), in a dir only its owner could have swapped it in
        done.changed.append((_relative(state_dir, path), stat.S_IMODE(mode), tight))
    except OSError as e:
        done.failed.append((_relative(state_dir, path), e.strerror or str(e)))


def _relative(state_dir: Path, path: Path) -> str:
    return "." if path == state_dir else str(path.relative_to(state_dir))


class StateDirLock:
    """A held lock. The kernel drops it when the process ends, however it ends (SIGKILL
    included), so a lock file left behind by a dead process never blocks the next one.
    `tightened`: what `acquire_or_exit` made the owner's alone, for `warn_tightened`."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self._fd: int | None = fd
        self.tightened = Tightened()

    def warn_tightened(self) -> None:
        """Log, once the role's logging is set up, one warning naming what was tightened (nothing: no line)."""
        if self.tightened.changed or self.tightened.failed:
            log.warning("%s", self.tightened.words(self.state_dir))

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
    """`acquire` for a role's first line: a busy or unusable dir ends the process (exit 1). Then this
    process's umask becomes 077, so what it and its engines create is the owner's alone, and whatever
    an earlier mode left wider is tightened (`tighten`); the role logs it with `warn_tightened`."""
    try:
        held = acquire(state_dir, owner)
        os.umask(PRIVATE_UMASK)
        held.tightened = tighten(held.state_dir)
        return held
    except StateDirBusy as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:
        raise SystemExit(f"error: cannot use state dir {state_dir}: {e.strerror or e}") from None
