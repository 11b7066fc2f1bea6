"""Each control plane's mirror pass: pull every blob of the catalog it lacks from the leader, verify it, keep it; and
delete the blobs no name refers to any more. So a failover loses no file, and a removal frees every member's disk.

A pull streams into `<state dir>/mirror/pulls/<sha256>` and resumes there (an HTTP range request) after a cut; the
blob is kept only once its bytes hash to its name (a mismatch is deleted and pulled again). The leader serves them at
`GET /mirror/blobs/<sha256>` to the cluster's machines: a member pulls with its own client (its control
certificate when the group speaks TLS: the same client it forwards requests with).

Level-triggered: each pass recomputes from the catalog and the disk, so a missed change or a restart heals itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from llmgw.domain.mirror import referenced_blobs
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import StateReader
from llmgw.mirror.blobs import CHUNK, BlobStore
from llmgw.wire import protocol
from llmgw.diskfiles import sha256_of

log = logging.getLogger("llmgw.mirror")

BLOBS_PATH = protocol.MIRROR_BLOBS_PATH  # every machine of the cluster fetches there (control/api/mirror_blobs.py)


class PullFailed(Exception):
    """A pull that did not end in a verified blob; the words say why (tried again at the next pass)."""


@dataclass(eq=False)
class MirrorSync:
    """One member's pass over its blobs. `leader_url`: the leader's admin URL (None: no leader known, or this member
    leads); `lock`: the context's `mirror_lock`."""

    store: StateReader
    blobs: BlobStore
    http: httpx.AsyncClient
    leader_url: Callable[[], str | None]
    lock: trio.Lock = field(default_factory=trio.Lock)  # held while an upload commits: no collection meanwhile
    timeouts: Timeouts = TIMEOUTS
    errors: dict[str, str] = field(default_factory=dict)  # sha256 -> why its last pull failed
    pulling: dict[str, int] = field(default_factory=dict)  # sha256 -> bytes held of a pull in progress

    @property
    def pulls(self) -> Path:
        return self.blobs.root / "pulls"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            state = self.store.snapshot()
            try:
                await self.pass_once()
            except OSError as e:  # a full or failing disk: said, and tried again
                log.warning("mirror: a pass over this member's blobs failed: %s", e)
            with trio.move_on_after(self.timeouts.mirror_sync_s):
                await self.store.wait_changed(state.revision)

    async def pass_once(self) -> None:
        """Delete the blobs no name refers to; pull the ones this member lacks (one at a time, from the leader)."""
        async with self.lock:
            state = self.store.snapshot()
            gone = await trio.to_thread.run_sync(self.blobs.collect, referenced_blobs(state))
        for sha in gone:
            log.info("mirror: blob %s deleted (no name refers to it)", sha[:12])
        held = await trio.to_thread.run_sync(self.blobs.held)
        url = self.leader_url()
        for sha in sorted(referenced_blobs(state) - set(held)):
            if url is None:
                break
            try:
                await self.pull(url, sha)
            except PullFailed as e:
                self.errors[sha] = str(e)
                log.warning("mirror: pulling blob %s from the leader failed: %s (tried again in %g s)", sha[:12], e,
                            self.timeouts.mirror_sync_s)
            else:
                self.errors.pop(sha, None)
        for sha in set(self.pulling) - referenced_blobs(state):
            self.pulling.pop(sha, None)
        await trio.to_thread.run_sync(self._drop_stale_pulls, referenced_blobs(self.store.snapshot()))

    def _drop_stale_pulls(self, keep: frozenset[str]) -> None:
        """Delete what a pull of a blob no longer in the catalog left in `pulls/`."""
        if self.pulls.is_dir():
            for p in self.pulls.iterdir():
                if p.name not in keep:
                    p.unlink(missing_ok=True)

    async def pull(self, leader_url: str, sha: str) -> Path:
        """Fetch one blob from the leader into `pulls/`, resuming what an earlier pull left; verify; keep."""
        await trio.to_thread.run_sync(lambda: self.pulls.mkdir(parents=True, exist_ok=True, mode=0o700))
        part = self.pulls / sha
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        timeout = httpx.Timeout(self.timeouts.mirror_pull_read_s)
        try:
            async with self.http.stream("GET", leader_url + BLOBS_PATH + sha, headers=headers,
                                        timeout=timeout) as r:
                if r.status_code == 200:
                    have = 0  # the whole file (a server that ignores the range): start over
                elif r.status_code != 206:
                    await r.aread()
                    raise PullFailed(f"the leader answered {r.status_code}: {r.text[:200]}")
                async with await trio.open_file(part, "ab" if have else "wb") as f:
                    async for data in r.aiter_bytes(CHUNK):
                        await f.write(data)
                        have += len(data)
                        self.pulling[sha] = have
        except httpx.HTTPError as e:
            raise PullFailed(f"{type(e).__name__}: {e}") from None
        got = await trio.to_thread.run_sync(sha256_of, part)
        if got != sha:
            await trio.to_thread.run_sync(lambda: part.unlink(missing_ok=True))
            raise PullFailed(f"the bytes pulled hash to {got[:12]}, not {sha[:12]}: deleted, pulled again next")
        self.pulling.pop(sha, None)
        path = await trio.to_thread.run_sync(self.blobs.adopt, part, sha)
        log.info("mirror: blob %s pulled from the leader and verified (%d bytes)", sha[:12], os.path.getsize(path))
        return path
