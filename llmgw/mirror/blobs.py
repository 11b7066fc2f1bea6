"""The model mirror's blobs on one control plane's disk: `<state dir>/mirror/blobs/<sha256>` (complete, verified
files only, named by their lowercase hex sha256) and uploads in progress under `<state dir>/mirror/uploads/<id>`
(the bytes so far) beside `<id>.json` (what the upload is for: name, size, the sha256 promised if any).

An upload is resumable: its offset is the length of its file on disk, whatever cut the connection, so a client
asks it and continues there; a write at any other offset is refused with the offset held (`MirrorError.offset`).
Its id comes from what it uploads (name, size, sha256), so starting the same upload again finds it. The commit
hashes the file, has it inspected (`inspect`), and moves it into `blobs/`; a refused file is deleted.

Blocking file work (hashing, renames, listing) runs here in plain functions; the callers run them in a thread.
Nothing here holds a file in memory: bodies are written as their chunks arrive, hashes read 1 MiB at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from llmgw.domain.mirror import is_sha256, name_problem
from llmgw.mirror.inspect import FileFacts
from llmgw.diskfiles import fsync_dir, sha256_of

CHUNK = 1 << 20
ID_CHARS = 32


class MirrorError(Exception):
    """A refusal of the blob store: an admin error's code, words and status; `offset`: the offset an upload holds
    (a write at another one, so the client continues there)."""

    def __init__(self, status: int, code: str, message: str, *, offset: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.offset = offset


@dataclass(frozen=True)
class Upload:
    """An upload in progress: its id, what it is for, and how many bytes it holds."""

    id: str
    name: str
    size: int
    sha256: str | None
    offset: int
    started_at: float

    def to_doc(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "size": self.size, "sha256": self.sha256, "offset": self.offset,
                "started_at": self.started_at}


# Reads a complete file's header (its path, and the name the operator gave it): its facts, or
# `llmgw.weights.WeightsError` with the reason it is refused (`llmgw.mirror.inspect.inspect_file`).
Inspect = Callable[[Path, str], FileFacts]


def upload_id(name: str, size: int, sha256: str | None) -> str:
    """The id of the upload of `name` (`size` bytes, `sha256` when known): the same for the same upload, so a
    client that lost its id starts it again and is handed the offset reached."""
    return hashlib.sha256(f"{name}\n{size}\n{sha256 or ''}".encode()).hexdigest()[:ID_CHARS]


class BlobStore:
    """One member's blobs and uploads, under `root` (`<state dir>/mirror`)."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.uploads = root / "uploads"
        self.clock = clock

    def make_dirs(self) -> None:
        for d in (self.blobs, self.uploads):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- blobs ------------------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        if not is_sha256(sha256):
            raise MirrorError(400, "invalid_sha256", "a blob is named by 64 lowercase hex digits")
        return self.blobs / sha256

    def has(self, sha256: str) -> bool:
        return self.blob_path(sha256).is_file()

    def held(self) -> dict[str, int]:
        """The blobs on disk: sha256 -> size (anything else in `blobs/` is not a blob and is left alone)."""
        if not self.blobs.is_dir():
            return {}
        out = {}
        for p in self.blobs.iterdir():
            if is_sha256(p.name) and p.is_file():
                out[p.name] = p.stat().st_size
        return out

    def verify(self, sha256: str) -> bool:
        """Whether the blob's bytes still hash to its name (a damaged disk, a hand-edited file)."""
        path = self.blob_path(sha256)
        return path.is_file() and sha256_of(path) == sha256

    def collect(self, keep: frozenset[str]) -> list[str]:
        """Delete every blob whose sha256 is not in `keep` (no name of the catalog refers to it): their names."""
        gone = []
        for sha in self.held():
            if sha not in keep:
                (self.blobs / sha).unlink(missing_ok=True)
                gone.append(sha)
        return sorted(gone)

    def adopt(self, path: Path, sha256: str) -> Path:
        """Move a complete, verified file into the blobs (an identical blob already there is kept; `path` goes)."""
        self.make_dirs()
        target = self.blob_path(sha256)
        if target.is_file():
            path.unlink(missing_ok=True)
        else:
            os.chmod(path, 0o600)
            os.replace(path, target)
            fsync_dir(self.blobs)
        return target

    # -- uploads ----------------------------------------------------------------------------------

    def start(self, name: str, size: int, sha256: str | None) -> Upload:
        """The upload of this file, begun or found again (with its offset)."""
        problem = name_problem(name)
        if problem is not None:
            raise MirrorError(400, "invalid_request", problem)
        if type(size) is not int or size <= 0:
            raise MirrorError(400, "invalid_request", "size must be a whole, positive number of bytes")
        if sha256 is not None and not is_sha256(sha256):
            raise MirrorError(400, "invalid_request", "sha256 must be 64 lowercase hex digits")
        self.make_dirs()
        uid = upload_id(name, size, sha256)
        found = self.upload(uid)
        if found is not None:
            return found
        started = self.clock()
        self._data(uid).touch(mode=0o600)
        tmp = self.uploads / f"{uid}.json.tmp"
        tmp.write_text(json.dumps({"name": name, "size": size, "sha256": sha256, "started_at": started}))
        os.replace(tmp, self._meta(uid))
        return Upload(uid, name, size, sha256, 0, started)

    def upload(self, uid: str) -> Upload | None:
        """The upload with this id, as on disk; None when there is none."""
        if not (len(uid) == ID_CHARS and all(c in "0123456789abcdef" for c in uid)):
            return None
        try:
            meta = json.loads(self._meta(uid).read_text())
            offset = self._data(uid).stat().st_size
        except (OSError, ValueError):
            return None
        return Upload(uid, meta["name"], meta["size"], meta.get("sha256"), offset, meta.get("started_at", 0.0))

    def in_progress(self) -> list[Upload]:
        if not self.uploads.is_dir():
            return []
        found = (self.upload(p.name[:-5]) for p in self.uploads.glob("*.json"))
        return sorted((u for u in found if u is not None), key=lambda u: (u.started_at, u.id))

    def get(self, uid: str) -> Upload:
        found = self.upload(uid)
        if found is None:
            raise MirrorError(404, "upload_not_found", f"no upload {uid[:40]!r} on this control plane: start it "
                              "(POST /api/v1/mirror/uploads; `ctl mirror add` does), or it was committed or dropped")
        return found

    def discard(self, uid: str) -> None:
        self._data(uid).unlink(missing_ok=True)
        self._meta(uid).unlink(missing_ok=True)

    async def write(self, uid: str, start: int, total: int, chunks: AsyncIterator[bytes],
                    end: int | None = None) -> Upload:
        """Append the body (bytes `start`..`end` of `total`) to the upload, as it arrives. A start other than the
        upload's offset is refused (409 `upload_offset_mismatch`, with the offset held); bytes past the file's size
        likewise (400). A cut body leaves what arrived: the offset says where to go on."""
        up = await trio.to_thread.run_sync(self.get, uid)
        if total != up.size:
            raise MirrorError(400, "invalid_request", f"the upload is of {up.size} bytes, not {total}")
        if start != up.offset:
            raise MirrorError(409, "upload_offset_mismatch", f"the upload holds {up.offset} of {up.size} bytes: send "
                              f"from byte {up.offset}, not {start}", offset=up.offset)
        limit = up.size if end is None else min(end + 1, up.size)
        offset = start
        async with await trio.open_file(self._data(uid), "r+b") as f:
            await f.seek(offset)
            async for data in chunks:
                if offset + len(data) > limit:
                    await f.write(data[: max(0, limit - offset)])
                    await f.truncate(limit)
                    raise MirrorError(400, "invalid_request", f"the body runs past byte {limit - 1} of the range "
                                      "it names (or the file's size)", offset=limit)
                await f.write(data)
                offset += len(data)
        return await trio.to_thread.run_sync(self.get, uid)

    def finish(self, uid: str, inspect: Inspect) -> tuple[Upload, str, FileFacts, Path]:
        """The complete upload hashed, checked against the sha256 it promised, inspected and moved into the blobs:
        (the upload, its sha256, its facts, the blob's path). A refused file is deleted (400 `invalid_file` with the
        reason; 422 `sha256_mismatch`); an upload short of its size is refused (409, the offset held) and kept."""
        from llmgw.weights import WeightsError

        up = self.get(uid)
        if up.offset != up.size:
            raise MirrorError(409, "upload_incomplete", f"the upload holds {up.offset} of {up.size} bytes: send the "
                              "rest before committing", offset=up.offset)
        data = self._data(uid)
        sha = sha256_of(data)
        if up.sha256 is not None and sha != up.sha256:
            self.discard(uid)
            raise MirrorError(422, "sha256_mismatch", f"the uploaded bytes hash to {sha}, not the {up.sha256} promised"
                              ": the upload is dropped; upload it again")
        try:
            facts = inspect(data, up.name)
        except WeightsError as e:
            self.discard(uid)
            raise MirrorError(400, "invalid_file", f"{up.name}: {e.reason}; the file is not kept") from None
        path = self.adopt(data, sha)
        self._meta(uid).unlink(missing_ok=True)
        return up, sha, facts, path

    def reserved(self) -> int:
        """Bytes promised by the uploads in progress (counted against the budget from their start)."""
        return sum(u.size for u in self.in_progress())

    def _data(self, uid: str) -> Path:
        return self.uploads / uid

    def _meta(self, uid: str) -> Path:
        return self.uploads / f"{uid}.json"
