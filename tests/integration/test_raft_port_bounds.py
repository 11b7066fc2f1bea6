"""The Raft port of real `llmgw control` members, against strangers and insiders: a frame over the
bound is refused before it is buffered (memory stays flat, the group keeps committing), idle and
unauthenticated connections are dropped and counted per address (descriptors stay bounded under a
1,024 limit), and a pickle sealed with the right secret is refused without running. Each refusal
is logged at most once a minute per address (docs/security.md, "The Raft port").

The members speak TLS to each other (docs/security.md, "Between control planes"), so a stranger is
refused at its first byte; the attacks on what lies under TLS come from an insider: one who holds a
control certificate of the cluster (another member's files), and the secret where the attack needs
it."""

from __future__ import annotations

import os
import pickle
import resource
import select
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pysyncobj.encryptor import getEncryptor

from llmgw.domain import commands
from llmgw.domain.commands import CommandError
from llmgw.domain.model import ModelDef
from tests.support.processes import free_port
from llmgw.store import RaftStore
from llmgw.store.secret import raft_password
from llmgw.store.wire import MAX_COMMAND_BYTES
from llmgw.trust import tls
from llmgw.trust.files import MachineFiles
from tests.support.cluster import Cluster, Member

pytestmark = pytest.mark.slow

ATTACK_S = 6.0  # how long each attack runs while the group is written to
# The connection timeout of `llmgw control` (raft_connection_timeout_s), which also bounds a handshake.
HANDSHAKE_S = 2.0
PER_ADDRESS = 8  # connections from one address waiting for their handshake (llmgw/store/wire.py)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("bounds"), 3)
    try:
        trio.run(c.start)
        yield c
    finally:
        c.close()


def pid(m: Member) -> int:
    assert m.proc is not None
    return m.proc.pid


def rss_mib(m: Member) -> float:
    for line in Path(f"/proc/{pid(m)}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def descriptors(m: Member) -> int:
    return len(os.listdir(f"/proc/{pid(m)}/fd"))


def raft_port(m: Member) -> int:
    return int(m.raft_addr.rpartition(":")[2])


def log_lines(m: Member, text: str) -> list[str]:
    return [line for line in m.log.read_text(errors="replace").splitlines() if text in line]


async def logged(m: Member, text: str) -> list[str]:
    """The lines of `m`'s log that hold `text`, once there is one (a member writes its log from a
    thread of its own), or none after a few seconds; and a moment more for any later ones."""
    with trio.move_on_after(5.0):
        while not log_lines(m, text):
            await trio.sleep(0.05)
    await trio.sleep(0.2)
    return log_lines(m, text)


class Writes:
    """Writes to the leader, one after another, until stopped: how many were acknowledged, and the
    longest any took."""

    def __init__(self, c: Cluster, leader: Member, tag: str) -> None:
        self.c, self.leader, self.tag = c, leader, tag
        self.acknowledged = 0
        self.failed: list[str] = []
        self.longest_s = 0.0

    async def run(self, duration_s: float) -> None:
        deadline = trio.current_time() + duration_s
        async with httpx.AsyncClient(timeout=10.0, headers=self.c.headers) as client:
            n = 0
            while trio.current_time() < deadline:
                n += 1
                name = f"{self.tag}-{n}"
                started = time.monotonic()
                try:
                    r = await client.post(self.leader.url + "/api/v1/models",
                                          json={"name": name, "engine": "sim", "source": f"sim://{name}"})
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                    continue
                finally:
                    self.longest_s = max(self.longest_s, time.monotonic() - started)
                if r.status_code in (200, 201):
                    self.acknowledged += 1
                else:
                    self.failed.append(f"{r.status_code} {r.text[:200]}")


def closed_by_peer(conn: socket.socket) -> bool:
    """Whether the other end closed `conn` (EOF or reset), without waiting (poll, not select: this
    process may hold descriptors past 1,024)."""
    poll = select.poll()
    poll.register(conn, select.POLLIN | select.POLLHUP | select.POLLERR)
    if not poll.poll(0):
        return False
    if isinstance(conn, ssl.SSLSocket):  # readable: a record (a session ticket), an alert, or the end
        timeout = conn.gettimeout()
        conn.settimeout(0.0)
        try:
            return conn.recv(1) == b""
        except ssl.SSLWantReadError:
            return False
        except OSError:
            return True
        finally:
            try:
                conn.settimeout(timeout)
            except OSError:
                pass
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""  # readable: it does not wait
    except OSError:
        return True


def insider(c: Cluster, target: Member) -> ssl.SSLContext:
    """TLS with a control certificate of the cluster: another member's, which `target` accepts."""
    other = next(m for m in c.members if m is not target)
    files = MachineFiles.of(other.state_dir)
    context = tls.client_context(files.ca, files.cert, files.key)
    context.check_hostname = False
    return context


def dial(port: int, context: ssl.SSLContext | None = None) -> socket.socket:
    """A connection to a member's Raft port: TCP, or TLS with `context`."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(conn) if context is not None else conn


def recv_exactly(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


class Dripper(threading.Thread):
    """An insider without the secret (a control certificate, over TLS) who announces a 2^31-1 byte
    frame, sends 32 MiB of it at once, then drips random bytes; when the member drops the connection
    it dials again."""

    def __init__(self, port: int, stop: threading.Event, context: ssl.SSLContext | None = None) -> None:
        super().__init__(daemon=True)
        self.port, self.stop, self.context = port, stop, context
        self.connections = 0
        self.dropped = 0  # connections the member closed
        self.sent = 0

    def run(self) -> None:
        while not self.stop.is_set():
            with dial(self.port, self.context) as conn:
                self.connections += 1
                if self._drip(conn):
                    self.dropped += 1
            self.stop.wait(0.05)

    def _drip(self, conn: socket.socket) -> bool:
        try:
            conn.sendall(struct.pack("i", 2**31 - 1))
            burst = os.urandom(65536)
            for _ in range(512):  # 32 MiB
                if self.stop.is_set() or closed_by_peer(conn):
                    return closed_by_peer(conn)
                conn.sendall(burst)
                self.sent += len(burst)
            while not self.stop.is_set():
                if closed_by_peer(conn):
                    return True
                conn.sendall(os.urandom(1024))
                self.sent += 1024
                self.stop.wait(0.01)
        except OSError:  # reset, broken pipe, or a send that timed out behind a full window
            return closed_by_peer(conn)
        return False


async def test_a_2_gib_frame_from_a_stranger_is_refused_before_it_is_buffered(group: Cluster) -> None:
    """One dripping insider per member: before the bound, each member buffered what it was sent (the
    length word allows 2 GiB) and re-copied it at every read, and the group acknowledged no write. (A
    stranger without a certificate is refused at its first byte: tests/integration/test_raft_tls.py.)"""
    leader = await group.leader()
    assert leader is not None
    before = {m.name: rss_mib(m) for m in group.members}
    stop = threading.Event()
    drippers = [Dripper(raft_port(m), stop, insider(group, m)) for m in group.members]
    for d in drippers:
        d.start()
    writes = Writes(group, leader, "drip")
    peak = dict(before)

    async def watch() -> None:
        while not stop.is_set():
            for m in group.members:
                peak[m.name] = max(peak[m.name], rss_mib(m))
            await trio.sleep(0.1)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await writes.run(ATTACK_S)
            stop.set()
    finally:
        stop.set()
        for d in drippers:
            d.join(10)
    growth = {name: round(peak[name] - before[name], 1) for name in before}
    print(f"RSS before (MiB): {before}; growth at peak: {growth}; acknowledged writes: {writes.acknowledged} "
          f"(longest {writes.longest_s:.2f} s); stranger connections per member: "
          f"{[d.connections for d in drippers]}, dropped: {[d.dropped for d in drippers]}, "
          f"bytes sent: {[d.sent for d in drippers]}")
    assert all(d.dropped >= 1 and d.dropped >= d.connections - 1 for d in drippers), "each member drops the stranger"
    assert all(g < 24 for g in growth.values()), f"memory stays flat: {growth} MiB"
    assert writes.acknowledged >= 10 and writes.longest_s < 3.0, (writes.acknowledged, writes.failed[:3])
    assert await group.leader() is leader, "the leader keeps leading"
    for m in group.members:  # many refusals, one warning per minute
        lines = await logged(m, "refused a Raft connection from 127.0.0.1: it announced a frame of 2147483647 bytes")
        assert len(lines) == 1, (m.name, lines)


def open_idle(port: int, count: int) -> list[socket.socket]:
    conns = []
    for _ in range(count):
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    return conns


async def test_idle_connections_are_dropped_and_bounded_per_address(group: Cluster) -> None:
    """1,000 idle connections from one address, under a 1,024-descriptor limit: before the limits,
    each held a descriptor until the member had none left."""
    leader = await group.leader()
    assert leader is not None
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.prlimit(pid(leader), resource.RLIMIT_NOFILE, (1024, hard))
    baseline = descriptors(leader)
    conns: list[socket.socket] = []
    peak = baseline
    stop = threading.Event()

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, descriptors(leader))
            await trio.sleep(0.02)

    writes = Writes(group, leader, "idle")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            nursery.start_soon(writes.run, HANDSHAKE_S + 2.0)
            conns = await trio.to_thread.run_sync(open_idle, raft_port(leader), 1000)
            opened = time.monotonic()
            await trio.sleep(HANDSHAKE_S + 1.5)
            closed = sum(closed_by_peer(c) for c in conns)
            stop.set()
        after = descriptors(leader)
    finally:
        stop.set()
        for c in conns:
            c.close()
    print(f"descriptors: baseline {baseline}, peak {peak}, after {after}; closed by the member "
          f"{closed}/1000 within {time.monotonic() - opened:.1f} s; acknowledged writes: {writes.acknowledged}")
    assert peak <= baseline + PER_ADDRESS + 8, f"descriptors stay bounded: {baseline} -> {peak}"
    assert closed == 1000, "each idle connection is closed: refused at once, or dropped after the handshake bound"
    assert after <= baseline + 2
    assert writes.acknowledged >= 5, writes.failed[:3]
    assert await group.leader() is leader, "the leader keeps leading"
    assert len(await logged(leader, "refused a Raft connection from 127.0.0.1: it has 8 connections waiting")) == 1
    assert len(await logged(leader, "dropped a Raft connection from 127.0.0.1: no handshake")) == 1


def sealed_frame(password: str, message: object) -> bytes:
    data = getEncryptor(password).encrypt_at_time(zlib.compress(pickle.dumps(message, 2), 3), int(time.monotonic()))
    return struct.pack("i", len(data)) + data


def key_exchange(port: int, password: str, context: ssl.SSLContext) -> tuple[socket.socket, bytes]:
    """Connect (TLS with `context`) and do the first half of the handshake with the right secret: the
    member's key."""
    conn = dial(port, context)
    conn.sendall(sealed_frame(password, os.urandom(32)))
    head = recv_exactly(conn, 4)
    body = recv_exactly(conn, struct.unpack("i", head)[0])
    _, theirs = pickle.loads(zlib.decompress(getEncryptor(password).decrypt(body)))
    return conn, theirs


def wait_closed(conn: socket.socket, within_s: float) -> float | None:
    """Seconds until the member closed `conn`; None if it did not within `within_s`."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if closed_by_peer(conn):
            return time.monotonic() - started
        time.sleep(0.02)
    return None


async def test_a_silent_connection_that_holds_the_secret_is_dropped(group: Cluster) -> None:
    """A key exchange with the right secret, then silence: it never names a member, and nothing is
    ever sent on it, so pysyncobj alone kept it forever."""
    leader = await group.leader()
    assert leader is not None
    password = raft_password(group.secret_file.read_text().strip())
    conn, _ = await trio.to_thread.run_sync(key_exchange, raft_port(leader), password, insider(group, leader))
    with conn:
        took = await trio.to_thread.run_sync(wait_closed, conn, HANDSHAKE_S + 3.0)
    assert took is not None and took <= HANDSHAKE_S + 1.5, took


async def test_a_read_only_node_is_refused(group: Cluster) -> None:
    """pysyncobj accepts any number of read-only nodes and sends each the log; llmgw runs none."""
    leader = await group.leader()
    assert leader is not None
    password = raft_password(group.secret_file.read_text().strip())

    def name_readonly() -> float | None:
        conn, theirs = key_exchange(raft_port(leader), password, insider(group, leader))
        with conn:
            conn.sendall(sealed_frame(password, (theirs, "readonly")))
            return wait_closed(conn, 5.0)

    assert await trio.to_thread.run_sync(name_readonly) is not None
    assert len(await logged(leader, "refused a read-only Raft node (from 127.0.0.1)")) == 1


class Marker:
    """Unpickling this makes the directory `path`: what an attacker's `__reduce__` would do, harmlessly."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


async def test_a_pickle_sealed_with_the_secret_is_refused_without_running(group: Cluster, tmp_path: Path) -> None:
    """A leaked secret is not code execution: a `__reduce__` payload, sealed as the handshake's first
    frame and as a message after the key exchange, is refused, the peer dropped and logged."""
    leader = await group.leader()
    assert leader is not None
    password = raft_password(group.secret_file.read_text().strip())
    first, second = tmp_path / "first", tmp_path / "second"
    port = raft_port(leader)

    context = insider(group, leader)

    def as_first_frame() -> float | None:
        with dial(port, context) as conn:
            conn.sendall(sealed_frame(password, Marker(first)))
            return wait_closed(conn, 5.0)

    def after_the_key_exchange() -> float | None:
        conn, theirs = key_exchange(port, password, context)
        with conn:
            conn.sendall(sealed_frame(password, (theirs, Marker(second))))
            return wait_closed(conn, 5.0)

    attempts: list[Callable[[], float | None]] = [as_first_frame, after_the_key_exchange]
    for attempt in attempts:
        assert await trio.to_thread.run_sync(attempt) is not None, f"{attempt.__name__}: the peer is dropped"
    assert not first.exists() and not second.exists(), "a sealed pickle ran in the member's process"
    lines = await logged(leader, "refused a Raft connection from 127.0.0.1: its message holds posix.mkdir")
    assert len(lines) == 1, lines  # two refusals, one warning
    writes = Writes(group, leader, "after-pickle")
    await writes.run(1.0)
    assert writes.acknowledged >= 1, writes.failed[:3]


async def test_a_command_over_the_bound_is_refused_before_it_is_logged(tmp_path: Path) -> None:
    """The frame bound is sized to carry the largest command, so no member ever refuses what its
    leader sends: a larger command is refused by `submit`, not logged."""
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path,
                      cluster_secret="the-right-secret-0123456789abcdef")
    await store.start()
    try:
        await store.wait_ready()
        before = store.status()["commit_index"]
        model = ModelDef.from_doc({"name": "big", "engine": "sim", "source": "sim://big"})
        command = {**commands.put_model(model, 1.0), "padding": "x" * MAX_COMMAND_BYTES}
        with pytest.raises(CommandError, match=f"a command is at most {MAX_COMMAND_BYTES} bytes") as refused:
            await store.submit(command)
        assert refused.value.code == "command_too_large"
        assert store.status()["commit_index"] == before and "big" not in store.snapshot().models
    finally:
        store.close()
