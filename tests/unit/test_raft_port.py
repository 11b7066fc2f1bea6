"""The Raft port's pure parts: the restricted unpickler's allowlist (every message pysyncobj sends
decodes; nothing else is called), the frame bounds (each legitimate frame fits; a stranger's length
word is refused before its frame is buffered) and the bounded inflate. A socket pair stands for a peer."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pysyncobj.config import SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE

from llmgw.store import unpickle
from llmgw.store.wire import (HANDSHAKE_FRAME_BYTES, MAX_COMMAND_BYTES, FrameRefused, RefusalLog, _BoundedConnection,
                              _SealCheck, address_key, inflate, payload_bound, sealed_size)

# What pysyncobj sends and logs, in the shapes syncobj.py and transport.py build them.
COMMAND = b"\x00" + pickle.dumps((0, (b'{"v":1,"op":"put_model"}',)), 2)  # _COMMAND_TYPE.REGULAR, (funcID, args)
MESSAGES: list[Any] = [
    os.urandom(32),  # the handshake's key
    (os.urandom(32), "10.0.0.1:7000"),  # the key and a member's address
    (os.urandom(32), "readonly"),
    {"type": "append_entries", "term": 3, "commit_index": 9, "entries": [(COMMAND, 10, 3), (b"", 11, 3)],
     "prevLogIdx": 9, "prevLogTerm": 3},
    {"type": "append_entries", "transmission": "start", "data": os.urandom(100), "term": 3, "commit_index": 9,
     "prevLogIdx": 9, "prevLogTerm": 3},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": (os.urandom(100), True, False)},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": None},
    {"type": "request_vote", "term": 4, "last_log_index": 10, "last_log_term": 3},
    {"type": "response_vote", "term": 4},
    {"type": "next_node_idx", "next_node_idx": 11, "reset": False, "success": True},
    {"type": "apply_command", "command": COMMAND, "request_id": 7},
    {"type": "apply_command_response", "request_id": 7, "log_idx": 12, "log_term": 3},
    {"type": "apply_command_response", "request_id": 7, "error": 2},
    {"type": "timeout_now", "term": 4},
    {"type": "llmgw_keepalive"},
    {"type": "llmgw_read_probe", "term": 4, "seq": 2**70},
    ["add", "10.0.0.4:7000", TCPNode("10.0.0.4:7000")],  # a membership change (in the log)
    (0, (b"\xff" * 3,), {"_doApply": True}),
    ["status"], 1.5, None,
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_pysyncobj_sends_decodes_as_it_was(message: Any) -> None:
    decoded = unpickle.loads(pickle.dumps(message, 2))
    assert decoded == message
    if isinstance(message, list) and message and message[0] == "add":
        node = decoded[2]
        assert (type(node), node.address, node.host, node.port) == (TCPNode, "10.0.0.4:7000", "10.0.0.4", 7000)


class Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


class Eval:
    def __reduce__(self) -> tuple[Any, ...]:
        return (eval, ("1",))


class Bomb:
    """bytes(n): an allowed name, called otherwise than pysyncobj does (it allocates n bytes)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (bytes, (10**12,))


class Rot13:
    def __reduce__(self) -> tuple[Any, ...]:
        return (__import__("_codecs").encode, ("text", "rot13"))


@pytest.mark.parametrize(("payload", "named"), [
    (Eval(), "builtins.eval"),  # protocol 2 writes __builtin__; refused by either name
    (Bomb(), "bytes(1000000000000,)"),
    (Rot13(), "_codecs.encode(..., 'rot13')"),
    ({"type": "append_entries", "entries": [set()]}, "__builtin__.set"),  # a type pysyncobj never sends
])
def test_anything_else_is_refused_before_it_is_called(payload: Any, named: str) -> None:
    with pytest.raises(unpickle.RefusedPickle) as refused:
        unpickle.loads(pickle.dumps(payload, 2))
    assert refused.value.what in (named, named.replace("builtins", "__builtin__"))


def test_a_reduce_payload_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
        with pytest.raises(unpickle.RefusedPickle, match="posix.mkdir"):
            unpickle.loads(pickle.dumps({"type": "append_entries", "x": Marker(marker)}, protocol))
    assert not marker.exists()
    pickle.loads(pickle.dumps(Marker(marker), 2))  # the control: unrestricted, it runs
    assert marker.exists()


def test_a_persistent_id_is_refused() -> None:
    with pytest.raises(unpickle.RefusedPickle):
        unpickle.loads(b"\x80\x02X\x01\x00\x00\x00aQ.")  # BINPERSID of "a"


def test_pysyncobj_decodes_with_the_restricted_unpickler_once_the_store_is_imported() -> None:
    import pysyncobj.serializer
    import pysyncobj.syncobj
    import pysyncobj.tcp_connection

    import llmgw.store.raft  # noqa: F401  (installs it)

    for module in (pysyncobj.tcp_connection, pysyncobj.syncobj, pysyncobj.serializer):
        assert module.pickle.loads is unpickle.loads, module.__name__  # type: ignore[attr-defined]
        assert module.pickle.load is unpickle.load, module.__name__  # type: ignore[attr-defined]


# -- the frame bounds ---------------------------------------------------------------------------


def sealed(fernet: Fernet, message: Any) -> bytes:
    data = fernet.encrypt_at_time(zlib.compress(pickle.dumps(message, 2), 3), int(time.monotonic()))
    return struct.pack("i", len(data)) + data


@pytest.mark.parametrize("size", [0, 1, 1000, 65536, 1 << 20])
def test_sealed_size_bounds_a_sealed_incompressible_payload(size: int) -> None:
    payload = os.urandom(size)
    token = Fernet(Fernet.generate_key()).encrypt_at_time(zlib.compress(payload, 3), 0)
    assert len(token) <= sealed_size(size) <= len(token) + 64 + size // 100


def test_the_largest_frames_a_member_sends_fit_the_bound() -> None:
    conf = SyncObjConf()
    limit = payload_bound(conf.logCompactionBatchSize, conf.appendEntriesBatchSizeBytes)
    fernet = Fernet(Fernet.generate_key())
    # An append of entries up to the batch size, then one more: a command of the largest size (JSON: ASCII).
    command = b"\x00" + pickle.dumps((0, (b"[" + b"7," * (MAX_COMMAND_BYTES // 2 - 1) + b"7]",)), 2)
    entries = [(b"\x00" + pickle.dumps((0, (os.urandom(1000).hex().encode(),)), 2), i, 3) for i in range(32)]
    append = {"type": "append_entries", "term": 3, "commit_index": 9, "entries": [*entries, (command, 99, 3)],
              "prevLogIdx": 9, "prevLogTerm": 3}
    chunk = {"type": "append_entries", "term": 3, "commit_index": 9,
             "serialized": (os.urandom(conf.logCompactionBatchSize), False, False)}  # bytes >= 0x80 pickle as two
    for message in (append, chunk, {"type": "apply_command", "command": command, "request_id": 1}):
        pickled = pickle.dumps(message, 2)
        assert len(pickled) <= limit
        assert len(sealed(fernet, message)) - 4 <= sealed_size(limit)
    assert sealed_size(limit) < 16 << 20, "a peer holding the secret can make a member hold this much per link"
    # The handshake's frames, with a long member address, fit the bound before the seal is checked.
    for message in (os.urandom(32), (os.urandom(32), "a" * 253 + ":65535")):
        assert len(sealed(fernet, message)) - 4 <= HANDSHAKE_FRAME_BYTES


def test_inflate_stops_at_its_limit() -> None:
    assert inflate(zlib.compress(b"x" * 1000), 1000) == b"x" * 1000
    with pytest.raises(FrameRefused, match="inflates past 1000 bytes"):
        inflate(zlib.compress(b"\0" * (64 << 20)), 1000)  # 64 MiB from 64 KiB: never held whole
    with pytest.raises(zlib.error):
        inflate(zlib.compress(b"x" * 1000)[:-5], 1000)


class Peer:
    """A `_BoundedConnection` on one end of a socket pair, the test on the other, one poller between."""

    def __init__(self, fernet: Fernet | None, sealed_bound: int = 1 << 20) -> None:
        self.fernet = fernet
        self.mine, theirs = socket.socketpair()
        theirs.setblocking(False)
        self.poller = createPoller("auto")
        self.reports: list[tuple[str, str, str]] = []
        self.messages: list[Any] = []
        self.conn = _BoundedConnection(poller=self.poller, socket=theirs, timeout=60.0, host="10.0.0.9",
                                       peer="10.0.0.9", report=lambda *r: self.reports.append(r),
                                       sealed_bound=sealed_bound, payload_limit=sealed_bound)
        if fernet is not None:
            self.conn.encryptor = _SealCheck(fernet, "10.0.0.9", lambda host: self.reports.append((host, "secret", "")))
        self.conn.setOnMessageReceivedCallback(self.messages.append)

    def send(self, data: bytes) -> None:
        self.mine.sendall(data)
        for _ in range(3):
            self.poller.poll(0.0)  # a socket pair: what was sent is there to read at once

    def buffered(self) -> int:
        return len(self.conn._TcpConnection__readBuffer)

    def close(self) -> None:
        self.conn.disconnect()
        self.mine.close()


@pytest.fixture
def peer() -> Any:
    made: list[Peer] = []

    def make(*args: Any, **kwargs: Any) -> Peer:
        made.append(Peer(*args, **kwargs))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_a_2_gib_length_word_is_refused_before_its_frame_is_buffered(peer: Any) -> None:
    p = peer(Fernet(Fernet.generate_key()))
    p.send(struct.pack("i", 2**31 - 1) + os.urandom(1000))
    assert p.conn.state == CONNECTION_STATE.DISCONNECTED and p.buffered() == 0
    assert [r[:2] for r in p.reports] == [("10.0.0.9", "frame")]
    assert "it announced a frame of 2147483647 bytes, over the bound of 4096 bytes for a frame before its seal " \
           "was checked" in p.reports[0][2]


def test_before_the_seal_the_bound_is_the_handshakes_after_it_the_sealed_one(peer: Any) -> None:
    fernet = Fernet(Fernet.generate_key())
    large = {"type": "append_entries", "entries": [(os.urandom(20000).hex().encode(), 1, 1)]}
    first = peer(fernet)
    first.send(sealed(fernet, large))  # a well-sealed frame, but larger than a handshake's: not yet
    assert first.conn.state == CONNECTION_STATE.DISCONNECTED and first.reports[0][1] == "frame"

    second = peer(fernet)
    second.send(sealed(fernet, os.urandom(32)))  # the handshake's first frame: its seal checks
    second.send(sealed(fernet, large))
    assert second.conn.state == CONNECTION_STATE.CONNECTED and second.reports == []
    assert len(second.messages) == 2 and second.messages[1] == large
    second.send(struct.pack("i", (1 << 20) + 1))  # over the sealed bound
    assert second.conn.state == CONNECTION_STATE.DISCONNECTED and second.reports[0][1] == "frame"


def test_a_frame_dripped_byte_by_byte_is_read_whole(peer: Any) -> None:
    fernet = Fernet(Fernet.generate_key())
    p = peer(fernet)
    for byte in sealed(fernet, os.urandom(32)):
        p.send(bytes([byte]))
    assert len(p.messages) == 1 and p.reports == [] and p.buffered() == 0


def test_a_sealed_pickle_of_a_callable_is_refused_and_reported(peer: Any, tmp_path: Path) -> None:
    fernet = Fernet(Fernet.generate_key())
    p = peer(fernet)
    p.send(sealed(fernet, Marker(tmp_path / "marker")))
    assert not (tmp_path / "marker").exists()
    assert p.conn.state == CONNECTION_STATE.DISCONNECTED
    assert [r[1] for r in p.reports] == ["decode"]
    assert "its message holds posix.mkdir, which the Raft wire does not carry" in p.reports[0][2]


def test_a_frame_of_another_secret_is_refused_by_the_seal(peer: Any) -> None:
    p = peer(Fernet(Fernet.generate_key()))
    p.send(sealed(Fernet(Fernet.generate_key()), os.urandom(32)))
    assert p.conn.state == CONNECTION_STATE.DISCONNECTED and [r[1] for r in p.reports] == ["secret"]


def test_an_ipv6_peer_is_counted_by_its_64() -> None:
    assert address_key("10.0.0.9") == "10.0.0.9"
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_key("::ffff:10.0.0.9") == "10.0.0.9"


def test_the_refusal_log_remembers_a_bounded_number_of_addresses(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(60.0, clock=lambda: now[0], max_hosts=4)
    logged = [refusals.refused(f"10.0.0.{i}", f"refused 10.0.0.{i}", reason="frame") for i in range(10)]
    assert logged == [True] * 4 + [True] + [False] * 5, "past the bound, the others share one warning"
    assert len(refusals._last) == 5
    now[0] = 61.0  # the first ones are forgotten once an interval has passed
    assert refusals.refused("10.0.0.99", "refused 10.0.0.99", reason="frame")
    assert len(refusals._last) <= 5
