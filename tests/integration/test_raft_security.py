"""The Raft port of a running store (real pysyncobj on loopback): a pickle from a stranger is
never unpickled, a frame sealed with another secret is refused and logged (once per peer per
interval), a member with another secret never joins, one outside the group is refused and
logged, Raft listens on its own address only, and `llmgw control` refuses a wildcard Raft
address and another cluster's state dir."""

from __future__ import annotations

import logging
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from pysyncobj.encryptor import getEncryptor

from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.startup import CannotStart
from llmgw.store import RaftStore
from llmgw.store.secret import FILE_NAME, raft_password
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

SECRET = "the-right-secret-0123456789abcdef"
OTHER = "another-secret-0123456789abcdefgh"
# How long a test waits for something that happens within milliseconds: a hang guard, not a measure.
PATIENCE_S = 20.0


class Marker:
    """Unpickling this makes the directory `path`: what an attacker's `__reduce__` would do, harmlessly."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


def plain_frame(message: object) -> bytes:
    """A frame as pysyncobj reads one without a password: length, then zlib(pickle)."""
    data = zlib.compress(pickle.dumps(message, 2), 3)
    return struct.pack("i", len(data)) + data


def sealed_frame(secret: str, message: object) -> bytes:
    """A frame as a member with `secret` sends one: the same, sealed (Fernet) with its key."""
    data = getEncryptor(raft_password(secret)).encrypt_at_time(zlib.compress(pickle.dumps(message, 2), 3),
                                                               int(time.monotonic()))
    return struct.pack("i", len(data)) + data


def exchange(port: int, payload: bytes) -> bytes:
    """Send `payload` to the Raft port; return all it answers until it closes the connection,
    or what it answered within a moment if it keeps the connection (an accepted peer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as conn:
        conn.sendall(payload)
        received = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                return received
            if not chunk:
                return received
            received += chunk
            conn.settimeout(0.5)  # it answered: a moment more for the rest of the answer


async def open_store(path: Path, port: int, *, secret: str | None = SECRET, peers: list[str] | None = None,
                     ready: bool = True) -> RaftStore:
    store = RaftStore(self_addr=f"127.0.0.1:{port}", peers=peers or [], state_dir=path, cluster_secret=secret)
    await store.start()
    if ready:
        await store.wait_ready()
    return store


async def commits(store: RaftStore, name: str) -> bool:
    model = ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}"})
    return bool((await store.submit(commands.put_model(model, 1.0)))["created"])


async def until(check: Callable[[], bool]) -> None:
    with trio.fail_after(PATIENCE_S):
        while not check():
            await trio.sleep(0.02)


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.getMessage()]


async def test_a_pickle_sent_to_the_raft_port_is_never_unpickled(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    proof, marker = tmp_path / "proof", tmp_path / "marker"
    pickle.loads(zlib.decompress(plain_frame(Marker(proof))[4:]))  # the payload is live: unpickled, it runs
    assert proof.exists()

    port = free_port()
    store = await open_store(tmp_path / "member", port)
    try:
        # As the first frame (the handshake), and after a well-sealed handshake frame.
        for payload in (plain_frame(Marker(marker)), sealed_frame(SECRET, os.urandom(32)) + plain_frame(Marker(marker))):
            await trio.to_thread.run_sync(exchange, port, payload)
        assert not marker.exists(), "a stranger's pickle ran in the store's process"
        assert await commits(store, "after-attack"), "the store keeps committing"
        assert any("refused a Raft connection from 127.0.0.1" in line for line in refusals(caplog)), caplog.text
    finally:
        store.close()


async def test_another_secret_is_refused_and_logged_once_per_peer(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    store = await open_store(tmp_path, port)
    try:
        # The right secret: the member answers the handshake with its own key, sealed.
        answer = await trio.to_thread.run_sync(exchange, port, sealed_frame(SECRET, os.urandom(32)))
        assert len(answer) > 4 and getEncryptor(raft_password(SECRET)).decrypt(answer[4:])
        assert refusals(caplog) == []

        for payload in (sealed_frame(OTHER, os.urandom(32)), b"\x10\x00\x00\x00" + os.urandom(16),
                        struct.pack("i", -4) + b"junk"):
            assert await trio.to_thread.run_sync(exchange, port, payload) == b"", "closed without an answer"
        lines = refusals(caplog)
        assert len(lines) == 1, "one warning per peer per interval, not one per connection"
        assert lines[0].startswith("refused a Raft connection from 127.0.0.1: its message is not sealed with "
                                   "this cluster's secret"), lines
        assert SECRET not in caplog.text and OTHER not in caplog.text and raft_password(SECRET) not in caplog.text
        assert await commits(store, "still-serving")
    finally:
        store.close()


def name_as(port: int, secret: str, member: str) -> bytes:
    """Do the handshake with the right secret, then name ourselves `member`; return what follows."""
    fernet = getEncryptor(raft_password(secret))
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as conn:
        mine = os.urandom(32)
        conn.sendall(sealed_frame(secret, mine))
        head = conn.recv(4, socket.MSG_WAITALL)
        body = conn.recv(struct.unpack("i", head)[0], socket.MSG_WAITALL)
        echoed, theirs = pickle.loads(zlib.decompress(fernet.decrypt(body)))
        assert echoed == mine
        conn.sendall(sealed_frame(secret, (theirs, member)))
        return conn.recv(65536)


async def test_a_member_outside_the_group_is_refused_and_logged(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    store = await open_store(tmp_path, port)
    try:
        assert await trio.to_thread.run_sync(name_as, port, SECRET, "127.0.0.1:9") == b"", "closed"
        assert refusals(caplog) == ["refused Raft member '127.0.0.1:9' (from 127.0.0.1): it is not in this "
                                    "member's group (no other member); check both members' --peer lists"]
    finally:
        store.close()


async def test_a_member_with_another_secret_never_joins(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    addr_a, addr_b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    a = await open_store(tmp_path / "a", int(addr_a.rpartition(":")[2]), peers=[addr_b], ready=False)
    b = await open_store(tmp_path / "b", int(addr_b.rpartition(":")[2]), secret=OTHER, peers=[addr_a], ready=False)
    try:
        await until(lambda: any("127.0.0.1" in line for line in refusals(caplog)))
        await trio.sleep(2 * a.timeouts.raft_election_max_s)  # time enough to elect, were they one group
        assert a.leader() is None and b.leader() is None, "a group of two with a stranger has no quorum"
    finally:
        b.close()
    # The control: the same member, given the right secret (a fresh state dir), joins.
    b = await open_store(tmp_path / "b2", int(addr_b.rpartition(":")[2]), peers=[addr_a], ready=False)
    try:
        await a.wait_ready()
        await b.wait_ready()
        assert a.leader() == b.leader() is not None
        leader = a if a.is_leader() else b
        assert await commits(leader, "joined")
    finally:
        a.close()
        b.close()


async def test_raft_listens_on_its_own_address_only(tmp_path: Path) -> None:
    port = free_port()
    store = await open_store(tmp_path, port)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S).close()
        with pytest.raises(ConnectionRefusedError):  # 127.0.0.2 reaches this machine: 0.0.0.0 would answer
            socket.create_connection(("127.0.0.2", port), timeout=PATIENCE_S).close()
    finally:
        store.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]"])
async def test_a_wildcard_raft_address_is_refused(tmp_path: Path, host: str) -> None:
    store = RaftStore(self_addr=f"{host}:{free_port()}", peers=[], state_dir=tmp_path, cluster_secret=SECRET)
    with pytest.raises(CannotStart, match=f"the Raft address {re.escape(host)}:[0-9]+ names no machine"):
        await store.start()
    assert list(tmp_path.iterdir()) == [], "nothing written"


async def test_a_state_dir_of_another_cluster_does_not_start(tmp_path: Path) -> None:
    store = await open_store(tmp_path, free_port())
    store.close()
    again = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path, cluster_secret=OTHER)
    with pytest.raises(CannotStart, match="belongs to another cluster"):
        await again.start()
    assert (tmp_path / FILE_NAME).read_text().strip() == SECRET


def control(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", "control", "--admin-addr", f"127.0.0.1:{free_port()}",
                           *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_control_refuses_a_wildcard_raft_address(tmp_path: Path) -> None:
    done = control(["--state-dir", str(tmp_path), "--raft-addr", "0.0.0.0:7001"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: --raft-addr 0.0.0.0:7001: give this member's address on the cluster's "
                                   "network (its peers dial it, and Raft listens there only), not 0.0.0.0")


def test_control_refuses_the_state_dir_of_another_cluster(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / FILE_NAME).write_text(OTHER + "\n")
    (state / FILE_NAME).chmod(0o600)
    given = tmp_path / "given.secret"
    given.write_text(SECRET + "\n")
    done = control(["--state-dir", str(state), "--raft-addr", f"127.0.0.1:{free_port()}",
                    "--cluster-secret-file", str(given)], tmp_path)
    assert done.returncode == 1, done.stderr
    errors = [line for line in (done.stdout + done.stderr).splitlines() if "ERROR" in line or "error" in line]
    assert len(errors) == 1 and f"the state dir {state} belongs to another cluster" in errors[0], done.stderr
    assert SECRET not in done.stderr + done.stdout and OTHER not in done.stderr + done.stdout
    assert not (state / "raft").exists(), "nothing of the journal is touched"

    done = control(["--state-dir", str(state), "--raft-addr", f"127.0.0.1:{free_port()}"], tmp_path,
                   {"LLMGW_CLUSTER_SECRET": "short"})
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error: LLMGW_CLUSTER_SECRET: a cluster secret has at least 16 characters")
