"""Engine logs: one file per replica that the engine writes itself, kept under a size cap by the
agent (copy-truncate into one `.1` file), its last lines read for failure reports, removed with it.

Why a file the engine holds, not a pipe through the agent: a pipe dies with the agent, and an
engine that outlives its agent (adoption) would then get SIGPIPE on its next line of output. The
engine's descriptor is opened with O_APPEND, so after the agent truncates the file the engine's
next write lands at the new end (no hole). The lines written between the copy and the truncate
are lost; that is the price of rotating a file another process holds open.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("llmgw.agent.supervisor")

# Past this size a log is copied to `NAME.log.1` (replacing the previous one) and truncated: an
# engine's output costs at most about twice this on disk, plus what it writes between two checks.
LOG_CAP_BYTES = 8 * 1024 * 1024
TAIL_LINES = 8  # the last lines of output that go into a failure's reason
TAIL_CHARS = 1200  # ... cut to this many characters (a report's error holds at most 2,000)
_TAIL_READ = 16 * 1024  # bytes read from the end of the file to find those lines


def rotated(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def open_for_engine(path: Path) -> BinaryIO:
    """The file an engine's stdout and stderr go to: appended to (O_APPEND), never truncated here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("ab")


def rotate_if_large(path: Path, cap: int = LOG_CAP_BYTES) -> bool:
    """Copy-truncate `path` once it is over `cap` bytes; True when it did. Missing files are fine."""
    try:
        if path.stat().st_size <= cap:
            return False
        shutil.copyfile(path, rotated(path))
        with path.open("r+b") as f:
            f.truncate(0)
    except FileNotFoundError:
        return False
    except OSError as e:  # a full disk: the engine keeps running, its log grows until the next try
        log.warning("engine log %s could not be rotated: %s", path, e)
        return False
    return True


def tail(path: Path | None, lines: int = TAIL_LINES, limit: int = TAIL_CHARS) -> str:
    """The last non-blank lines of an engine's output, joined with " | ", at most `limit` characters;
    the rotated file fills in when the current one was just truncated. "" when there is none."""
    if path is None:
        return ""
    text = ""
    for part in (path, rotated(path)):
        chunk = _read_end(part)
        text = chunk + text
        if len([ln for ln in text.splitlines() if ln.strip()]) >= lines:
            break
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[-limit:]


def _read_end(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - _TAIL_READ)
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return ""
    if start > 0:  # the first line read is a piece of a longer one
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", "replace")


def remove(path: Path) -> None:
    """Delete a replica's log and its rotated copy."""
    for part in (path, rotated(path)):
        part.unlink(missing_ok=True)
