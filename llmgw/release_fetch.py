"""A machine's side of `ctl upgrade` (an agent's `upgrade_agent`, a gateway's `upgrade_gateway`): fetch a release
by its sha256 from the control plane it follows (over its own mutually authenticated connection), write it beside
the file it runs, and name the file to run next.

The restart itself is the caller's: the agent ends its run as for `restart_agent` and `llmgw agent` execs the
file (same pid, same flags; its engines keep serving and are adopted); a gateway drains and `llmgw gateway` execs
the file, its listening socket kept open for it (as for `restart_gateway`)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import trio

from llmgw import release

log = logging.getLogger("llmgw.release")


async def prepare(control: str, tls: ssl.SSLContext | None, state_dir: Path, sha256: str | None, rollback: bool,
                  timeout_s: float) -> tuple[Path, str]:
    """The release file to run next and its sha256: the one ran before (`rollback`), or `sha256` fetched from
    `control` (kept when already beside the running file). Raises `release.ReleaseError` with the reason."""
    now = release.running()
    if now.path is None or now.sha256 is None:
        raise release.ReleaseError("not_a_zipapp", f"this machine cannot be upgraded by ctl upgrade: {now.reason}")
    if rollback:
        return await trio.to_thread.run_sync(release.prepare, state_dir, now, None, "", True)
    assert sha256 is not None
    target = now.path.parent / release.file_name(sha256)
    if sha256 != now.sha256 and not await trio.to_thread.run_sync(release.present, target, sha256):
        await fetch(control, tls, sha256, target, timeout_s)
    return await trio.to_thread.run_sync(release.prepare, state_dir, now, target, sha256, False)


async def receive(receiver: release.Receiver, chunks: AsyncIterator[bytes]) -> Path:
    """`chunks` (an upload, a fetch) written through `receiver` in a worker thread, about `release.CHUNK` at a
    time, then checked and renamed into place (`Receiver.finish`); the caller aborts it on failure."""
    buffered: list[bytes] = []
    size = 0
    async for chunk in chunks:
        buffered.append(chunk)
        size += len(chunk)
        if size >= release.CHUNK:
            data, buffered, size = b"".join(buffered), [], 0
            await trio.to_thread.run_sync(receiver.write, data)
    if buffered:
        await trio.to_thread.run_sync(receiver.write, b"".join(buffered))
    return await trio.to_thread.run_sync(receiver.finish)


async def fetch(control: str, tls: ssl.SSLContext | None, sha256: str, target: Path, timeout_s: float) -> Path:
    """GET /api/v1/releases/SHA256 from `control` into `target`, checked (`release.Receiver`)."""
    url = control.rstrip("/") + f"/api/v1/releases/{sha256}"
    receiver = await trio.to_thread.run_sync(lambda: release.Receiver(target.parent, target, sha256))
    try:
        with trio.fail_after(timeout_s):
            async with httpx.AsyncClient(verify=tls if tls is not None else True, timeout=timeout_s) as client:
                async with client.stream("GET", url) as response:
                    if response.status_code != 200:
                        body = (await response.aread())[:500].decode(errors="replace")
                        raise release.ReleaseError("fetch_failed", f"the control plane at {control} answered "
                                                                   f"{response.status_code} for the release: {body}")
                    path = await receive(receiver, response.aiter_bytes())
    except (httpx.HTTPError, trio.TooSlowError, OSError) as e:
        receiver.abort()
        raise release.ReleaseError("fetch_failed", f"fetching the release from {control} failed: "
                                                   f"{type(e).__name__}: {e}") from None
    except BaseException:
        receiver.abort()
        raise
    log.info("release %s fetched from %s into %s", sha256[:12], control, path)
    return path
