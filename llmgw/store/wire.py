"""Raft's wire: pysyncobj's TCP transport, sealed with the cluster secret, saying whom it refuses.

With a password, pysyncobj checks each frame's Fernet seal (HMAC) before it unpickles
anything, and drops a connection whose frame fails the check, without a word. This
module adds the word: each connection's encryptor is wrapped, so the one place that
sees the failed check also reports the peer, at most once per peer per interval.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from typing import Any, Callable

from cryptography.fernet import Fernet, InvalidToken
from pysyncobj.transport import TCPTransport

log = logging.getLogger("llmgw.store")

_WRONG_SECRET = ("not sealed with this cluster's secret (a member of another cluster or started with "
                 "another --cluster-secret-file, or no Raft member at all)")


class RefusalLog:
    """A warning per refused peer host and reason, at most one per `interval_s`; the next one
    counts the refusals in between. Per host, not per connection: a peer redials every
    `raft_connect_retry_s`, each time from a new port."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._quiet: dict[tuple[str, str], int] = {}  # refusals not logged since the last warning

    def refused(self, host: str, message: str, *, reason: str = "secret") -> bool:
        """Count a refusal of `host` for `reason`; log `message` unless one was logged for both
        within the interval. Returns whether it was logged."""
        now = self._clock()
        key = (host, reason)
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._quiet[key] = self._quiet.get(key, 0) + 1
                return False
            self._last[key] = now
            quiet = self._quiet.pop(key, 0)
        more = f" ({quiet} more refused since the last warning)" if quiet else ""
        log.warning("%s%s", message, more)
        return True


class _SealCheck:
    """One connection's encryptor: pysyncobj's Fernet, reporting a frame whose seal fails."""

    def __init__(self, fernet: Fernet, peer: str, on_refused: Callable[[str], None]) -> None:
        self._fernet = fernet
        self.peer = peer
        self._on_refused = on_refused
        self.handshaking = False  # an outgoing connection, up, that has not yet received a sealed frame
        self.connected_at = 0.0

    # pysyncobj calls these three, and nothing else, on `conn.encryptor`.
    def extract_timestamp(self, token: bytes) -> int:
        try:
            stamp = self._fernet.extract_timestamp(token)
        except InvalidToken:
            self._on_refused(self.peer)
            raise  # pysyncobj drops the connection
        self.handshaking = False
        return stamp

    def decrypt(self, token: bytes) -> bytes:
        return self._fernet.decrypt(token)

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return self._fernet.encrypt_at_time(data, current_time)


KEEPALIVE = "llmgw_keepalive"


class SealedTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport with each connection's seal check reported to `refusals`, and every
    link kept warm.

    Keepalives: pysyncobj closes a connection that has read nothing for `connectionTimeout`, but
    checks only when it sends on it. Followers never send to each other, so when the leader died the
    first vote request a candidate sent to the other follower found that link idle for longer, closed
    it and was lost: the election waited for another timeout (failover after a SIGKILL ~1.3 s p50).
    Each member now sends a `llmgw_keepalive` on every link a few times per timeout; the receiver
    drops it before pysyncobj (which would ignore an unknown type anyway: an older member is fine)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any, *, refusals: RefusalLog,
                 abstain: Callable[[], bool] | None = None) -> None:
        self._refusals = refusals  # before the base's __init__: it adds the peers (addNode) and the server
        self._keepalive_at = 0.0
        # True while this member must not vote (it started empty to rejoin, and has not caught up with a
        # leader yet): see `RaftStore`'s `abstain_until_synced`.
        self._abstain = abstain
        super().__init__(syncObj, selfNode, otherNodes)

    def _onTick(self) -> None:
        super()._onTick()
        now = time.monotonic()
        if now - self._keepalive_at >= self._syncObj.conf.connectionTimeout / 4:
            self._keepalive_at = now
            for node in list(self._connections):
                self.send(node, {"type": KEEPALIVE})

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == KEEPALIVE:
            return
        if (self._abstain is not None and isinstance(message, dict) and message.get("type") == "request_vote"
                and self._abstain()):
            return  # no vote, not even a refusal: the candidate counts it as a missing member
        super()._onMessageReceived(node, message)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)
        fernet = self._syncObj.encryptor
        if fernet is not None:
            conn.encryptor = _SealCheck(fernet, _peer_host(conn), self._refused_incoming)

    def addNode(self, node: Any) -> None:
        super().addNode(node)
        conn = self._connections.get(node)  # only the peers this member dials have one now
        fernet = self._syncObj.encryptor
        if conn is not None and fernet is not None:
            conn.encryptor = _SealCheck(fernet, str(node.address), self._refused_outgoing)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        # After the key exchange, an incoming connection names its member: one this group lacks
        # (a peer list that disagrees) is dropped by pysyncobj, without a word.
        named = self._syncObj.encryptor is None or conn.sendRandKey
        if named and isinstance(message, str) and message != "readonly" and message not in self._nodeAddrToNode:
            check = conn.encryptor
            host = check.peer if isinstance(check, _SealCheck) else _peer_host(conn)
            members = ", ".join(sorted(self._nodeAddrToNode)) or "no other member"
            self._refusals.refused(host, f"refused Raft member {message[:100]!r} (from {host}): it is not in "
                                         f"this member's group ({members}); check both members' --peer lists",
                                   reason="group")
        super()._onIncomingMessageReceived(conn, message)

    def _onOutgoingConnected(self, conn: Any) -> None:
        if isinstance(conn.encryptor, _SealCheck):
            conn.encryptor.handshaking = True
            conn.encryptor.connected_at = time.monotonic()
        super()._onOutgoingConnected(conn)

    def _onDisconnected(self, conn: Any) -> None:
        check = getattr(conn, "encryptor", None)
        if isinstance(check, _SealCheck) and check.handshaking:
            check.handshaking = False
            # The peer took the connection, got our sealed key and hung up at once, unanswered.
            # A peer that only stays silent (stopped, overloaded) is dropped after
            # connectionTimeout instead: that is no refusal.
            if time.monotonic() - check.connected_at < self._syncObj.conf.connectionTimeout:
                self._refusals.refused(
                    _host(check.peer),
                    f"Raft peer {check.peer} closed the connection during the handshake: it likely holds "
                    f"another cluster secret (its log says whom it refused)")
        super()._onDisconnected(conn)

    def _refused_incoming(self, host: str) -> None:
        self._refusals.refused(host, f"refused a Raft connection from {host}: its message is {_WRONG_SECRET}")

    def _refused_outgoing(self, peer: str) -> None:
        self._refusals.refused(_host(peer), f"refused Raft peer {peer}: its answer is {_WRONG_SECRET}")


def sealed_transport(refusals: RefusalLog, abstain: Callable[[], bool] | None = None) -> Callable[..., SealedTransport]:
    """What SyncObj takes as `transportClass`: it calls it with (syncObj, selfNode, otherNodes)."""
    return functools.partial(SealedTransport, refusals=refusals, abstain=abstain)


def _peer_host(conn: Any) -> str:
    """The remote address of an accepted connection, from a duplicate of its descriptor
    (pysyncobj keeps the socket private)."""
    fd = conn.fileno()
    if fd is None:
        return "an unknown address"
    try:
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as dup:  # family read from the fd
            return str(dup.getpeername()[0])
    except OSError:
        return "an unknown address"


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]") or address
