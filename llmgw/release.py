"""The release file this process runs (a zipapp) and the others kept beside it, for `llmgw ctl upgrade`: the
file's sha256 (computed once, at start), a new file written beside it (checked, atomic), and which one ran before.

A release is judged by its file's sha256 only, never by a version string: a binary installed by hand is another
release whatever it says its version is (docs/operations.md, "Upgrade"). Blocking file I/O: callers in trio run
`install`, `Receiver.write` and `sha256_of` in a thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import zipfile
from llmgw.diskfiles import fsync_dir, sha256_of
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("llmgw.release")

CHUNK = 1 << 20
SHA256 = re.compile(r"[0-9a-f]{64}")
NOT_A_ZIPAPP = "not a zipapp: this process runs from the llmgw package, not a release file"
# In the state dir: which file this machine ran before the last upgrade (for `--rollback`).
RECORD_NAME = "release.json"
# Under a control plane's state dir: the files uploaded by `ctl upgrade`, by sha256, served to its machines.
STORE_DIR = "releases"
# What an upload or a fetch may hold at most.
MAX_RELEASE_BYTES = 1 << 30


class ReleaseError(Exception):
    """A release that cannot be taken: `code` (as the admin API says it) and the words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Running:
    """The file this process runs: its path and sha256, or why there is none (`reason`)."""

    path: Path | None
    sha256: str | None
    reason: str = ""

    def to_doc(self) -> dict[str, Any]:
        return {"file": str(self.path) if self.path is not None else None, "sha256": self.sha256,
                "sha256_reason": self.reason or None}


_running: Running | None = None


def running(argv0: str | None = None) -> Running:
    """This process's release file, hashed at the first call (each role calls it as it starts: the hash is of
    the file it started from, even if the file is replaced on disk later)."""
    global _running
    if _running is None or argv0 is not None:
        found = of_file(sys.argv[0] if argv0 is None else argv0)
        if argv0 is not None:
            return found
        _running = found
        log.info("this process runs %s", f"{found.path} (sha256 {found.sha256})" if found.sha256 else found.reason)
    return _running


def of_file(path_text: str) -> Running:
    """What runs from `path_text` (the program's sys.argv[0], as `engines.base.self_command` reads it)."""
    path = Path(path_text) if path_text else None
    if path is None or not path.is_file() or not zipfile.is_zipfile(path):
        return Running(None, None, NOT_A_ZIPAPP)
    path = path.resolve()
    try:
        return Running(path, sha256_of(path))
    except OSError as e:
        return Running(path, None, f"cannot read {path}: {e.strerror or e}")


def checked_sha256(value: Any, what: str = "sha256") -> str:
    """`value` as a sha256 (64 lowercase hex digits); ReleaseError `invalid_sha256` otherwise."""
    if not isinstance(value, str) or not SHA256.fullmatch(value):
        raise ReleaseError("invalid_sha256", f"{what} must be a file's sha256: 64 lowercase hex digits")
    return value


def file_name(sha256: str) -> str:
    """The name a release takes beside the running one."""
    return f"llmgw-{sha256[:12]}.pyz"


def stored(state_dir: Path, sha256: str) -> Path:
    """Where a control plane keeps an uploaded release (0700, as everything in a state dir is the owner's alone)."""
    return state_dir / STORE_DIR / f"{sha256}.pyz"


class Receiver:
    """A release being received in chunks (an upload, a fetch): written to a hidden file in `directory`,
    hashed as it comes, and renamed to `target` by `finish` only if its sha256 is the one expected."""

    def __init__(self, directory: Path, target: Path, sha256: str, *, limit: int = MAX_RELEASE_BYTES,
                 mode: int = 0o755) -> None:
        directory.mkdir(mode=0o700 if mode == 0o700 else 0o777, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".incoming-", suffix=".pyz", dir=directory)
        self._file = os.fdopen(fd, "wb")
        self.tmp = Path(name)
        self.target = target
        self.sha256 = sha256
        self.limit = limit
        self.mode = mode  # 0755 beside the running file; 0700 in a state dir (the owner's alone)
        self.size = 0
        self._digest = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            self.abort()
            raise ReleaseError("release_too_large", f"a release file may hold at most {self.limit} bytes")
        self._digest.update(chunk)
        self._file.write(chunk)

    def finish(self) -> Path:
        """Check, fsync, make executable and rename into place; ReleaseError `sha256_mismatch` (nothing kept)
        or `not_a_zipapp`."""
        got = self._digest.hexdigest()
        if got != self.sha256:
            self.abort()
            raise ReleaseError("sha256_mismatch", f"the file received ({self.size} bytes) has sha256 {got}, not "
                                                  f"{self.sha256}: cut short or changed on the way; nothing was kept")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if not zipfile.is_zipfile(self.tmp):
            self.tmp.unlink(missing_ok=True)
            raise ReleaseError("not_a_zipapp", "the file is not a zipapp (a zip archive, as `make zipapp` builds)")
        os.chmod(self.tmp, self.mode)
        os.replace(self.tmp, self.target)
        fsync_dir(self.target.parent)
        return self.target

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.tmp.unlink(missing_ok=True)


def present(path: Path, sha256: str) -> bool:
    """Is `path` a file with this sha256 (a release already received)?"""
    try:
        return path.is_file() and sha256_of(path) == sha256
    except OSError:
        return False


def copy_in(source: Path, sha256: str, target: Path) -> Path:
    """Copy a release from `source` to `target` (checked as `Receiver` does); kept when already there."""
    if present(target, sha256):
        return target
    receiver = Receiver(target.parent, target, sha256)
    try:
        with open(source, "rb") as f:
            while chunk := f.read(CHUNK):
                receiver.write(chunk)
    except OSError as e:
        receiver.abort()
        raise ReleaseError("release_not_found", f"cannot read the release {source}: {e.strerror or e}") from None
    return receiver.finish()


# --- which file ran before: the rollback's target ------------------------------------------------------------


def record_switch(state_dir: Path, now: Running, into: Path, sha256: str) -> None:
    """Before running `into`: remember the file running now, so `--rollback` can go back to it."""
    doc = {"previous": now.to_doc(), "next": {"file": str(into), "sha256": sha256}}
    tmp = state_dir / (RECORD_NAME + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, state_dir / RECORD_NAME)
    fsync_dir(state_dir)


def previous(state_dir: Path) -> tuple[Path, str]:
    """The file this machine ran before its last upgrade, checked to be unchanged; ReleaseError
    `no_previous_release` otherwise."""
    try:
        doc = json.loads((state_dir / RECORD_NAME).read_text())
        prev = doc["previous"]
        path, sha = Path(prev["file"]), checked_sha256(prev["sha256"])
    except (OSError, ValueError, KeyError, TypeError, ReleaseError):
        raise ReleaseError("no_previous_release", f"this machine has no record of a release it ran before "
                                                  f"({state_dir / RECORD_NAME}): it was never upgraded") from None
    if not present(path, sha):
        raise ReleaseError("no_previous_release", f"the release this machine ran before ({path}) is gone or "
                                                  f"changed since (sha256 is no longer {sha[:12]})")
    return path, sha


def target_of(ask: Any, now: Running) -> tuple[str, bool]:
    """What an upgrade asks (`{"sha256": S}` or `{"rollback": true}`) as (sha256 or "", rollback);
    ReleaseError `invalid_request`, `invalid_sha256`, or `not_a_zipapp` when this process runs no release file."""
    if not isinstance(ask, dict) or set(ask) - {"sha256", "rollback"}:
        raise ReleaseError("invalid_request", 'send {"sha256": "<64 hex digits>"} or {"rollback": true}')
    rollback = ask.get("rollback", False)
    if not isinstance(rollback, bool) or rollback == ("sha256" in ask):
        raise ReleaseError("invalid_request", 'send either {"sha256": "<64 hex digits>"} or {"rollback": true}')
    if now.path is None or now.sha256 is None:
        raise ReleaseError("not_a_zipapp", f"this machine cannot be upgraded by ctl upgrade: {now.reason}")
    return ("", True) if rollback else (checked_sha256(ask["sha256"]), False)


def prepare(state_dir: Path, now: Running, source: Path | None, sha256: str, rollback: bool) -> tuple[Path, str]:
    """The file to run next and its sha256; blocking (run it in a thread).

    The next release takes the path that runs now (the rollback's: the file this machine ran before): a
    service (systemd's `llmgw-ROLE` unit, the built-in supervisor) starts that same path again after any
    later restart, so the upgrade outlives it (run from `llmgw-<sha12>.pyz` instead, a service's next
    restart went back to the old release). Both releases are kept beside it under their own names
    (`file_name`): the one running now for `--rollback`, the next one as received. A machine that runs a
    file of such a name runs the next one beside it instead (its own file is the rollback's copy)."""
    assert now.path is not None and now.sha256 is not None
    kept = copy_in(now.path, now.sha256, now.path.parent / file_name(now.sha256))
    if rollback:
        source, sha256 = previous(state_dir)
    assert source is not None
    beside = copy_in(source, sha256, now.path.parent / file_name(sha256))
    target = beside if kept == now.path else now.path
    record_switch(state_dir, Running(kept, now.sha256), target, sha256)
    if target != beside:
        copy_in(beside, sha256, target)  # atomic (`Receiver`): a start at any moment finds one whole file
    return target, sha256
