"""An agent's fetch of a mirror file (`agent/mirror_fetch.fetch`, issue 24 point 4) against real HTTP servers on
loopback (tests/support/mirror_server.py): a transfer dropped mid-body goes on from where it stopped, a `.part`
left by an earlier agent too; a corrupt byte is caught by the sha256 and the file fetched again; a failing or busy
URL gives way to the next one; the cache makes room by removing its least recently used file; a file already held
is used at once."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest
import trio

from llmgw.agent.mirror_fetch import FetchError, MirrorCache, fetch
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.wire.protocol_agent import MirrorSource
from tests.support.mirror_server import MirrorServer

DATA = os.urandom(300_000)
SHA = hashlib.sha256(DATA).hexdigest()
FAST = dataclasses.replace(TIMEOUTS, mirror_fetch_retry_s=0.01, mirror_fetch_connect_s=5.0, mirror_fetch_read_s=10.0)


def source(*servers: MirrorServer | str) -> MirrorSource:
    urls = tuple(s if isinstance(s, str) else f"{s.base}/mirror/blobs/{SHA}" for s in servers)
    return MirrorSource("model.gguf", SHA, len(DATA), urls)


async def test_a_dropped_transfer_goes_on_from_where_it_stopped(tmp_path: Path) -> None:
    server = MirrorServer(DATA, script=["drop:100000", "drop:50000"])
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        cache = MirrorCache(tmp_path / "cache", 10 << 20)
        path = await fetch(source(server), cache, tls=None, local=None, on_bytes=seen.append, timeouts=FAST)
        nursery.cancel_scope.cancel()
    assert path.read_bytes() == DATA and path == tmp_path / "cache" / SHA
    assert server.ranges == [None, "bytes=100000-", "bytes=150000-"], "each request asks for the rest only"
    assert seen[-1] == len(DATA) and seen == sorted(seen)
    assert not cache.part(SHA).exists()


async def test_a_part_file_left_by_an_earlier_agent_is_resumed(tmp_path: Path) -> None:
    server = MirrorServer(DATA)
    cache = MirrorCache(tmp_path, 10 << 20)
    cache.part(SHA).write_bytes(DATA[:123_456])
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        path = await fetch(source(server), cache, tls=None, local=None, timeouts=FAST)
        nursery.cancel_scope.cancel()
    assert path.read_bytes() == DATA and server.ranges == ["bytes=123456-"]


async def test_a_corrupt_byte_is_caught_and_the_file_fetched_again_from_scratch(tmp_path: Path) -> None:
    server = MirrorServer(DATA, script=["corrupt"])
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        cache = MirrorCache(tmp_path, 10 << 20)
        path = await fetch(source(server), cache, tls=None, local=None, on_bytes=seen.append, timeouts=FAST)
        nursery.cancel_scope.cancel()
    assert path.read_bytes() == DATA
    assert server.ranges == [None, None], "the damaged copy was removed: the second fetch starts at byte 0"
    assert 0 in seen[1:], "the progress went back to 0 for the second fetch"


async def test_a_file_that_never_hashes_right_fails_with_the_reason(tmp_path: Path) -> None:
    server = MirrorServer(DATA, script=["corrupt"] * 5)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        with pytest.raises(FetchError, match="never hashed to its sha256"):
            await fetch(source(server), MirrorCache(tmp_path, 10 << 20), tls=None, local=None, timeouts=FAST)
        nursery.cancel_scope.cancel()
    assert not list(tmp_path.iterdir()) or not (tmp_path / SHA).exists()


async def test_the_next_url_is_used_when_one_fails_is_busy_or_lacks_the_file(tmp_path: Path) -> None:
    busy, lacking, good = MirrorServer(DATA, script=["503"]), MirrorServer(DATA, script=["404"]), MirrorServer(DATA)
    async with trio.open_nursery() as nursery:
        for s in (busy, lacking, good):
            await nursery.start(s.run)
        dead = f"http://127.0.0.1:{_closed_port()}/mirror/blobs/{SHA}"
        path = await fetch(source(dead, busy, lacking, good), MirrorCache(tmp_path, 10 << 20), tls=None, local=None,
                           timeouts=FAST)
        nursery.cancel_scope.cancel()
    assert path.read_bytes() == DATA
    assert (len(busy.ranges), len(lacking.ranges), len(good.ranges)) == (1, 1, 1)


async def test_no_url_that_answers_fails_the_fetch_saying_why(tmp_path: Path) -> None:
    server = MirrorServer(DATA, script=["404"] * 10)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        with pytest.raises(FetchError, match="could not be fetched from any control plane.*404"):
            await fetch(source(server), MirrorCache(tmp_path, 10 << 20), tls=None, local=None, timeouts=FAST)
        nursery.cancel_scope.cancel()
    assert len(server.ranges) == 3, "three rounds of the list, then it gives up"


async def test_room_is_made_lru_first_never_removing_a_file_in_use_and_a_held_file_is_used_at_once(
        tmp_path: Path) -> None:
    in_use = {"1" * 64}
    cache = MirrorCache(tmp_path, len(DATA) + 250_000, in_use=lambda: in_use)
    for sha, at in (("1" * 64, 1.0), ("2" * 64, 2.0)):  # the oldest is in use: the other one goes
        cache.path(sha).write_bytes(b"x" * 200_000)
        os.utime(cache.path(sha), (at, at))
    server = MirrorServer(DATA)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await fetch(source(server), cache, tls=None, local=None, timeouts=FAST)
        assert cache.path("1" * 64).exists() and not cache.path("2" * 64).exists()
        again = await fetch(source(server), cache, tls=None, local=None, timeouts=FAST)
        nursery.cancel_scope.cancel()
    assert again.read_bytes() == DATA and len(server.ranges) == 1, "held and verified: no second request"
    assert [c.name for c in cache.files()] == ["", "model.gguf"]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_two_replicas_fetching_one_file_at_once_fetch_it_once(tmp_path: Path) -> None:
    server = MirrorServer(DATA)
    cache = MirrorCache(tmp_path, 10 << 20)
    paths: list[Path] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)

        async def one() -> None:
            paths.append(await fetch(source(server), cache, tls=None, local=None, timeouts=FAST))

        async with trio.open_nursery() as both:
            both.start_soon(one)
            both.start_soon(one)
        nursery.cancel_scope.cancel()
    assert paths[0] == paths[1] and paths[0].read_bytes() == DATA and server.ranges == [None]
