"""An agent's side of the model mirror (docs/mirror.md, "Fetching on the nodes"): a `mirror://NAME` source fetched
from the control planes' blob URLs (`StartReplica.mirror`) into this node's mirror cache, before its engine starts.

The cache (`MirrorCache`) holds complete, verified files only, named `<cache>/<sha256>` (with `<sha256>.name`: the
mirror's name for it, reported as held so placement prefers this node); a fetch writes `<sha256>.part` and renames
it once its sha256 is checked. Within its own byte budget: the least recently used files are removed to make room,
never one a replica uses.

A fetch (`fetch`) resumes with an HTTP Range from what its `.part` holds (after a dropped connection, or an agent
restart), goes to the next URL when one fails or answers 404 or 503 (the leader busy: the list has the leader
first, then the standbys), and starts over when the whole file does not hash to its sha256. It reports the bytes
it holds as it goes (`on_bytes`), and gives up, with the reason, after `ROUNDS` rounds of every URL without a
byte gained.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from llmgw.agent.supervisor import MirrorFetchFailed
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import describe
from llmgw.wire.protocol_agent import MirrorSource
from llmgw.diskfiles import sha256_of

log = logging.getLogger("llmgw.agent.mirror")

CHUNK = 1 << 20  # written to the .part file at a time
ROUNDS = 3  # rounds of every URL with no byte gained before a fetch gives up
MISMATCHES = 2  # whole files that did not hash to the sha256 before a fetch gives up


class FetchError(MirrorFetchFailed):
    """A fetch that cannot succeed now: the replica fails with this reason."""


# --- pure parts --------------------------------------------------------------------------------


def resume_offset(part_size: int, total: int) -> int:
    """Where a fetch goes on from, given what its `.part` file holds: its size, unless that is more than the file
    (another file's bytes: start over)."""
    return part_size if 0 <= part_size <= total else 0


def range_header(offset: int) -> dict[str, str]:
    """The request's headers to go on from `offset` (none from 0: the whole file)."""
    return {"range": f"bytes={offset}-"} if offset > 0 else {}


def answered_from(status: int, content_range: str | None, offset: int, total: int) -> int | None:
    """Where the bytes of an answer to a request from `offset` begin in the file: `offset` for a 206 whose
    Content-Range says so, 0 for a 200 (the server ignored the range: the whole file); None for an answer to
    take nothing from (another status, a range that is not the one asked, or another size)."""
    if status == 200:
        return 0
    if status != 206 or not content_range:
        return None
    unit, _, rest = content_range.strip().partition(" ")
    span, _, size = rest.partition("/")
    first, _, _last = span.partition("-")
    try:
        if unit != "bytes" or int(first) != offset or (size != "*" and int(size) != total):
            return None
    except ValueError:
        return None
    return offset


# --- the cache -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cached:
    sha256: str
    name: str
    size: int
    used_at: float  # the file's mtime: touched when a replica starts from it


class MirrorCache:
    """`<dir>/<sha256>` files, verified, within `budget_bytes`; `in_use()` names the sha256 of files replicas use
    now (never removed)."""

    def __init__(self, directory: Path, budget_bytes: int, in_use: Callable[[], Collection[str]] = frozenset) -> None:
        self.dir = directory
        self.budget_bytes = budget_bytes
        self.in_use = in_use
        self._locks: dict[str, trio.Lock] = {}  # one fetch of a file at a time (replicas of one model share it)

    def lock(self, sha256: str) -> trio.Lock:
        return self._locks.setdefault(sha256, trio.Lock())

    def path(self, sha256: str) -> Path:
        return self.dir / sha256

    def part(self, sha256: str) -> Path:
        return self.dir / f"{sha256}.part"

    def holds(self, sha256: str, size: int) -> bool:
        """The verified file is here (a file in the cache was checked before it was named so)."""
        try:
            return self.path(sha256).stat().st_size == size
        except OSError:
            return False

    def touch(self, sha256: str) -> None:
        try:
            os.utime(self.path(sha256))
        except OSError:
            pass

    def files(self) -> list[Cached]:
        """The verified files, the least recently used first."""
        found = []
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            return []
        for e in entries:
            if len(e.name) != 64 or not e.is_file():
                continue
            try:
                st = e.stat()
            except OSError:
                continue
            try:
                name = (self.dir / f"{e.name}.name").read_text(encoding="utf-8").strip()
            except OSError:
                name = ""
            found.append(Cached(e.name, name, st.st_size, st.st_mtime))
        return sorted(found, key=lambda c: (c.used_at, c.sha256))

    def used_bytes(self) -> int:
        total = 0
        for c in self.files():
            total += c.size
        for p in self.dir.glob("*.part"):
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return total

    def make_room(self, sha256: str, size: int) -> list[str]:
        """Remove the least recently used files (never one in use, nor this one) until `size` more bytes fit
        the budget; returns the sha256 of those removed. FetchError when they cannot."""
        if size > self.budget_bytes:
            raise FetchError(f"the file is {size} bytes, more than this node's mirror cache budget "
                             f"({self.budget_bytes} bytes: --mirror-cache-bytes)")
        part = self.part(sha256)
        held = part.stat().st_size if part.exists() else 0
        need = self.used_bytes() - held + size - self.budget_bytes
        busy = set(self.in_use()) | {sha256}
        # Complete files and the partial fetches of other files (an abandoned one holds bytes too), oldest first.
        candidates = [(c.used_at, c.sha256, self.path(c.sha256), c.size, c.name or "?") for c in self.files()]
        for p in self.dir.glob("*.part"):
            try:
                st = p.stat()
            except OSError:
                continue
            candidates.append((st.st_mtime, p.name[:-len(".part")], p, st.st_size, "a partial fetch"))
        removed = []
        for _, sha, path, size, what in sorted(candidates):
            if need <= 0:
                break
            if sha in busy:
                continue
            path.unlink(missing_ok=True)
            if path == self.path(sha):
                (self.dir / f"{sha}.name").unlink(missing_ok=True)
            removed.append(sha)
            need -= size
            log.info("mirror cache: removed %s (%s, %d bytes, the least recently used) to make room", sha[:12], what,
                     size)
        if need > 0:
            raise FetchError(f"no room in this node's mirror cache for {size} bytes: its budget is "
                             f"{self.budget_bytes} bytes and the files left are in use by replicas")
        return removed

    def keep(self, sha256: str, name: str) -> Path:
        """A checked `.part` becomes the cache's file (its name beside it)."""
        (self.dir / f"{sha256}.name").write_text(name + "\n", encoding="utf-8")
        os.replace(self.part(sha256), self.path(sha256))
        return self.path(sha256)

    def storage_report(self) -> dict[str, Any]:
        """The cache as a storage directory's report (`NodeInfo.storage`): each verified file held by its mirror
        name, so placement prefers this node for a `mirror://NAME` source (placement/holdings.py)."""
        models = [{"name": c.name, "path": str(self.path(c.sha256)), "kind": "mirror", "size": c.size,
                   "sha256": c.sha256} for c in self.files() if c.name]
        return {"path": str(self.dir), "fabric": "", "shared": False, "models": models, "not_weights": []}


# --- the fetch -------------------------------------------------------------------------------------


async def fetch(source: MirrorSource, cache: MirrorCache, *, tls: ssl.SSLContext | None, local: str | None,
                on_bytes: Callable[[int], None] = lambda n: None, timeouts: Timeouts = TIMEOUTS) -> Path:
    """The cache's verified file for `source`: at once when held, else fetched (see the module). `tls`: this
    machine's context (its certificate is its credential); `local`: the in-process credential (`llmgw up`)."""
    async with cache.lock(source.sha256):  # a second replica of the model waits for the first one's fetch
        return await _fetch(source, cache, tls=tls, local=local, on_bytes=on_bytes, timeouts=timeouts)


async def _fetch(source: MirrorSource, cache: MirrorCache, *, tls: ssl.SSLContext | None, local: str | None,
                 on_bytes: Callable[[int], None], timeouts: Timeouts) -> Path:
    sha, total = source.sha256, source.size
    if cache.holds(sha, total):
        cache.touch(sha)
        return cache.path(sha)
    await trio.to_thread.run_sync(cache.dir.mkdir, 0o700, True, True)
    await trio.to_thread.run_sync(cache.make_room, sha, total)
    headers = {"authorization": f"Bearer {local}"} if local else {}
    timeout = httpx.Timeout(timeouts.mirror_fetch_read_s, connect=timeouts.mirror_fetch_connect_s)
    mismatches = 0
    async with httpx.AsyncClient(verify=tls if tls is not None else True, timeout=timeout, headers=headers,
                                 follow_redirects=False) as http:
        while True:
            await _transfer(http, source, cache.part(sha), on_bytes, timeouts)
            got = await trio.to_thread.run_sync(sha256_of, cache.part(sha))
            if got == sha:
                path = await trio.to_thread.run_sync(cache.keep, sha, source.name)
                log.info("mirror file %s (%s, %d bytes) fetched and verified", source.name, sha[:12], total)
                return path
            mismatches += 1
            cache.part(sha).unlink(missing_ok=True)
            on_bytes(0)
            log.warning("mirror file %s: the %d bytes fetched hash to %s, not %s: removed, fetched again",
                        source.name, total, got[:12], sha[:12])
            if mismatches >= MISMATCHES:
                raise FetchError(f"mirror file {source.name}: fetched {mismatches} times, its bytes never hashed to "
                                 f"its sha256 {sha[:12]} (a damaged copy on a control plane?)")


async def _transfer(http: httpx.AsyncClient, source: MirrorSource, part: Path, on_bytes: Callable[[int], None],
                    timeouts: Timeouts) -> None:
    """Fill `part` up to the file's size, from the URLs in turn; FetchError after `ROUNDS` rounds of them all
    with no byte gained."""
    total = source.size
    idle_rounds = 0
    problems: list[str] = []
    while True:
        before = _size(part)
        for url in source.urls:
            held = resume_offset(_size(part), total)
            if held == total:
                return
            try:
                await _one(http, url, part, held, total, on_bytes)
            except _Next as e:
                problems.append(f"{url}: {e}")
                log.warning("mirror file %s: %s: %s; trying the next control plane", source.name, url, e)
                continue
            if _size(part) == total:
                return
        if _size(part) == total:
            return
        idle_rounds = 0 if _size(part) > before else idle_rounds + 1
        if idle_rounds >= ROUNDS:
            raise FetchError(f"mirror file {source.name} could not be fetched from any control plane: "
                             + "; ".join(problems[-len(source.urls):])[:1500])
        await trio.sleep(timeouts.mirror_fetch_retry_s)


class _Next(Exception):
    """This URL gives nothing now: the next one is tried."""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def _one(http: httpx.AsyncClient, url: str, part: Path, held: int, total: int,
               on_bytes: Callable[[int], None]) -> None:
    """One request: its bytes appended to `part` (or written over it, for a 200) until the answer ends or fails."""
    try:
        async with http.stream("GET", url, headers=range_header(held)) as response:
            if response.status_code == 416 and held == total:
                return
            start = answered_from(response.status_code, response.headers.get("content-range"), held, total)
            if start is None:
                body = (await response.aread())[:300].decode(errors="replace")
                raise _Next(f"answered {response.status_code}: {body}")
            done = start
            async with await trio.open_file(part, "r+b" if part.exists() else "wb") as f:
                await f.truncate(start)
                await f.seek(start)
                pending: list[bytes] = []  # received, not written yet: written every CHUNK, and when the answer ends
                size = 0
                try:
                    async for chunk in response.aiter_bytes():  # as received: a drop loses nothing received
                        if done + size + len(chunk) > total:
                            raise _Next(f"sent more than the file's {total} bytes")
                        pending.append(chunk)
                        size += len(chunk)
                        on_bytes(done + size)  # received: what the progress shows (written within CHUNK)
                        if size >= CHUNK:
                            await f.write(b"".join(pending))
                            done, pending, size = done + size, [], 0
                            on_bytes(done)
                finally:
                    with trio.CancelScope(shield=True):
                        if pending:
                            await f.write(b"".join(pending))
                            done += size
                            on_bytes(done)
    except httpx.HTTPError as e:
        raise _Next(describe(e)) from None
    except OSError as e:
        raise FetchError(f"the mirror cache cannot be written: {describe(e)}") from None
