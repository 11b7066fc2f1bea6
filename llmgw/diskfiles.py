"""Files on this machine's disk, as every role handles them: a file's sha256 read a chunk at a time (`sha256_of`:
releases, the mirror's blobs, an agent's fetched copies, `ctl mirror add`) and a directory's entries made durable
after a rename into it (`fsync_dir`: the store's journal and snapshots, engine records, releases, the mirror)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

HASH_CHUNK = 1 << 20  # read at a time: a multi-GiB checkpoint is hashed without holding it


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """The file's lowercase hex sha256; `progress` is told the bytes read so far after each chunk."""
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while data := f.read(HASH_CHUNK):
            h.update(data)
            done += len(data)
            if progress is not None:
                progress(done)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a file just renamed into it) survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
