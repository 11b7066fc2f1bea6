"""Raft's wire: pysyncobj's TCP transport, sealed with the cluster secret, bounded, saying whom it refuses.

With a password, pysyncobj checks each frame's Fernet seal (HMAC) before it unpickles anything,
and drops a connection whose frame fails the check, without a word. This module adds the word
(each connection's encryptor is wrapped, so the one place that sees the failed check also reports
the peer, at most once per peer per interval) and the bounds pysyncobj lacks (docs/security.md,
"The Raft port"): a frame over its bound is refused at its length word, before it is buffered;
a connection that has not finished its handshake within the connection timeout, or reads nothing
for that long, is closed; connections waiting for their handshake are limited per address and in
all; and what a frame holds is decoded by `llmgw.store.unpickle`, never by `pickle.loads`.

With a `RaftPeerTls` (control planes serving off loopback), members also speak TLS to each other
with their control-plane certificates, under the seal (`llmgw.store.peer_tls`): an accepted connection is TLS or
sealed-only by its first byte, and sealed-only ones are refused once the group requires TLS.

pysyncobj 0.3.17 is pinned: `_BoundedConnection` overrides two of its connection's name-mangled
methods and reads its private socket and buffer, as `catchup.py` and `readindex.py` do with SyncObj.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import socket
import struct
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any, Callable

from cryptography.fernet import Fernet, InvalidToken
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.transport import TCPTransport

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.store import unpickle
from llmgw.store.peer_tls import TlsLayer, TlsState

if TYPE_CHECKING:
    from llmgw.interfaces import RaftPeerTls

log = logging.getLogger("llmgw.store")

_WRONG_SECRET = ("not sealed with this cluster's secret (a member of another cluster or started with "
                 "another --cluster-secret-file, or no Raft member at all)")

# -- the bounds ------------------------------------------------------------------------------------

# The longest frame read before its seal is checked. The handshake's frames (a 32-byte key; then the
# key and a member's address) are 150-250 bytes sealed: a stranger can make a member hold no more.
HANDSHAKE_FRAME_BYTES = 4096
# The largest command `RaftStore.submit` logs (its JSON): the frame bound is sized to carry one, so
# no member ever refuses what its leader sends. The admin API takes bodies of 1 MiB at most.
MAX_COMMAND_BYTES = 4 << 20
# Incoming connections that have not finished the handshake: from one address (more are refused at
# once), and from all (the oldest is dropped for a new one, so strangers at many addresses cannot
# keep a member's peers out for longer than a handshake takes).
PENDING_PER_ADDRESS = 8
PENDING_TOTAL = 64
# What a message adds to the values it carries: keys, terms, indexes and pickle opcodes.
_MESSAGE_HEADROOM = 64 * 1024


def payload_bound(snapshot_chunk: int, entries_batch: int, max_command: int = MAX_COMMAND_BYTES) -> int:
    """The longest pickled message a member sends: a chunk of a snapshot (pysyncobj's
    `logCompactionBatchSize`), or an append that gathers entries up to `appendEntriesBatchSizeBytes`
    and then one more, which may be a whole command (as may a command forwarded to the leader).
    Twice that: protocol 2 pickles each byte of 0x80 or more as two."""
    return 2 * max(snapshot_chunk, entries_batch + max_command) + _MESSAGE_HEADROOM


def sealed_size(payload: int) -> int:
    """The longest frame that carries `payload` bytes of pickle: zlib's worst case (compressBound),
    then a Fernet token (version, time, IV, padded ciphertext, HMAC; base64)."""
    deflated = payload + (payload >> 12) + (payload >> 14) + (payload >> 25) + 13
    token = 1 + 8 + 16 + (deflated // 16 + 1) * 16 + 32
    return -(-token // 3) * 4


class FrameRefused(Exception):
    """A frame over its bound, or one that inflates past it: the words say which."""


def inflate(data: bytes, limit: int) -> bytes:
    """zlib's `decompress`, stopping at `limit` bytes: a sealed frame of a few MiB can inflate to GiBs."""
    d = zlib.decompressobj()
    out = d.decompress(data, limit)
    if d.unconsumed_tail:
        raise FrameRefused(f"its message inflates past {limit} bytes")
    if not d.eof:
        raise zlib.error("a cut zlib stream")
    return out


def address_key(host: str) -> str:
    """What the per-address limit and the refusal log count by: an IPv4 address, or an IPv6 /64
    (one machine may hold a whole /64)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else str(ip)


def frame_length(buffer: bytes | bytearray) -> int | None:
    """The length word that starts `buffer` (pysyncobj's: a native signed int), None before 4 bytes."""
    return struct.unpack_from("i", buffer)[0] if len(buffer) >= 4 else None


class RefusalLog:
    """A warning per refused peer host and reason, at most one per `interval_s`; the next one
    counts the refusals in between. Per host, not per connection: a peer redials every
    `raft_connect_retry_s`, each time from a new port. At most `max_hosts` (host, reason) pairs are
    remembered: past that, those logged more than an interval ago are forgotten, and while it stays
    full (strangers at that many addresses within an interval) the others share one warning."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic, *,
                 max_hosts: int = 4096) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._max_hosts = max_hosts
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._quiet: dict[tuple[str, str], int] = {}  # refusals not logged since the last warning

    def refused(self, host: str, message: str, *, reason: str = "secret") -> bool:
        """Count a refusal of `host` for `reason`; log `message` unless one was logged for both
        within the interval. Returns whether it was logged."""
        now = self._clock()
        key = (host, reason)
        with self._lock:
            if key not in self._last and len(self._last) >= self._max_hosts:
                for old in [k for k, at in self._last.items() if now - at >= self.interval_s]:
                    del self._last[old]
                    self._quiet.pop(old, None)
                if len(self._last) >= self._max_hosts:
                    key = ("many addresses", reason)
                    message += f" (and refusals from more than {self._max_hosts} other addresses)"
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


Report = Callable[[str, str, str], None]  # (host, reason, message): a refusal, for the RefusalLog


class _BoundedConnection(TlsLayer, TcpConnection):  # type: ignore[misc]
    """pysyncobj's connection, bounded. pysyncobj read a frame whole, whatever its length word said
    (up to 2 GiB), into `bytes` that each read copied whole (`buffer += incoming`): a stranger who
    announced 2 GiB and dripped bytes made every read cost what it had sent so far, on the one
    thread that runs Raft, until the member stopped answering its peers. Here a frame over its bound
    is refused as soon as its length word is in, before a byte of it is kept; the buffer is a
    bytearray (appending costs what is appended); reading stops once a whole frame of the largest
    size is buffered (the rest waits in the kernel); and the message is decoded by
    `llmgw.store.unpickle` and inflated up to a bound.

    The bound is `HANDSHAKE_FRAME_BYTES` until a frame's seal was checked, then `sealed_bound`.
    `host` keys the refusals; `peer` is what they show."""

    # pysyncobj's, set in its __init__ (the buffers under their name-mangled names)
    _TcpConnection__readBuffer: bytes | bytearray
    _TcpConnection__writeBuffer: bytes
    recvLastTimestamp: int

    def __init__(self, *args: Any, host: str, peer: str, report: Report, sealed_bound: int, payload_limit: int,
                 tls: RaftPeerTls | None = None, **kwargs: Any) -> None:
        # Before the base's __init__: an accepted connection is subscribed to the poller there.
        self.host, self.peer = host, peer
        self.sealed = False  # a frame's seal was checked: the peer holds the cluster secret
        self.accepted_at = self.last_read = time.monotonic()
        self._report = report
        self._sealed_bound = sealed_bound
        self._payload_limit = payload_limit
        self._policy = tls
        self.tls: TlsState | None = None
        self.outgoing = kwargs.get("socket") is None
        self._sniffing = tls is not None and not self.outgoing  # an accepted one: TLS or not, by its first byte
        self._cipher = 0  # bytes at the head of the write buffer that are TLS records (the rest: frames to seal)
        self.spoke_tls = False  # this dial used TLS (its failures are TLS's to report, not the seal's)
        self.tls_ok = False  # ... and its handshake finished, the peer's certificate accepted
        super().__init__(*args, **kwargs)

    def bound(self) -> int:
        return self._sealed_bound if self.sealed or not self.encryptor else HANDSHAKE_FRAME_BYTES

    def _buffer(self) -> bytearray:
        buf = self._TcpConnection__readBuffer
        if not isinstance(buf, bytearray):  # pysyncobj sets bytes() at each (dis)connect
            buf = self._TcpConnection__readBuffer = bytearray(buf)
        return buf

    def _refuse(self, reason: str, words: str) -> None:
        whom = f"Raft peer {self.peer}" if self.outgoing else f"a Raft connection from {self.peer}"
        self._report(self.host, reason, f"refused {whom}: {words}")
        self.disconnect()

    def _over_bound(self, length: int) -> bool:
        if length <= self.bound():
            return False
        when = "from a peer that holds the secret" if self.sealed else "before its seal was checked"
        self._refuse("frame", f"it announced a frame of {length} bytes, over the bound of {self.bound()} "
                              f"bytes for a frame {when}")
        return True

    # pysyncobj's TcpConnection.__processRead, reading into a bytearray and checking the length word.
    def _TcpConnection__processRead(self) -> bool:
        buf = self._buffer()
        if len(buf) >= 4 + self.bound():
            return False  # parse first; the poller reports the rest again
        sock = self._TcpConnection__socket
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return False
        self.last_read = time.monotonic()
        if self._sniffing and not self._first_bytes(incoming):
            return False
        if self.tls is not None:
            if not self._tls_received(incoming, buf):
                return False
        else:
            buf += incoming
        length = frame_length(buf)
        return not (length is not None and self._over_bound(length))

    # pysyncobj's TcpConnection.__processParseMessage: the seal, then a bounded inflate and our unpickler.
    def _TcpConnection__processParseMessage(self) -> Any:
        buf = self._buffer()
        length = frame_length(buf)
        if length is None or self._over_bound(length) or len(buf) - 4 < length:
            return None
        end = 4 + max(length, 0)  # a negative length: an empty frame, which no seal check passes
        data = bytes(buf[4:end])
        try:
            if self.encryptor:
                stamp = self.encryptor.extract_timestamp(data)  # a _SealCheck reports a failed seal
                if stamp < self.recvLastTimestamp:
                    raise ValueError("a frame sealed before the last one")
                self.recvLastTimestamp = stamp
                data = self.encryptor.decrypt(data)
                self.sealed = True
            message = unpickle.loads(inflate(data, self._payload_limit))
            if self.recvRandKey:
                rand_key, message = message
                if rand_key != self.recvRandKey:
                    raise ValueError("not this connection's key")
        except unpickle.RefusedPickle as e:
            self._refuse("decode", f"its message {e} (it was sealed with this cluster's secret: if this "
                                   f"is no member of this cluster, the secret has leaked)")
            return None
        except FrameRefused as e:
            self._refuse("frame", str(e))
            return None
        except Exception:  # a failed seal (reported by _SealCheck), a cut stream, a wrong key: as pysyncobj
            self.disconnect()
            return None
        del buf[:end]
        return message


class _Listener:
    """pysyncobj's TcpServer (the Raft port), handing each accepted socket to `accepted`, which may
    refuse it. An accept that fails (EMFILE: no descriptor left) pauses accepting for a moment and
    is logged; pysyncobj's closed the port for good instead."""

    def __init__(self, poller: Any, host: str, port: int, accepted: Callable[[socket.socket, Any], None],
                 report: Report) -> None:
        self._poller = poller
        self._host, self._port = host, int(port)
        self._accepted = accepted
        self._report = report
        self._socket: socket.socket | None = None
        self._resume_at: float | None = None

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((self._host, self._port))
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        self._socket = sock
        self._subscribe()

    def unbind(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            if self._resume_at is None:
                self._poller.unsubscribe(sock.fileno())
            sock.close()

    def resume(self, now: float) -> None:
        if self._resume_at is not None and now >= self._resume_at and self._socket is not None:
            self._subscribe()

    def _subscribe(self) -> None:
        assert self._socket is not None
        self._resume_at = None
        self._poller.subscribe(self._socket.fileno(), self._on_event, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def _on_event(self, descr: int, event: int) -> None:
        sock = self._socket
        if sock is None or descr != sock.fileno():
            self._poller.unsubscribe(descr)
            return
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()
            return
        for _ in range(PENDING_TOTAL):  # drain the queue, within reason
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                self._poller.unsubscribe(sock.fileno())
                self._resume_at = time.monotonic() + TIMEOUTS.raft_accept_pause_s
                self._report("", "accept", f"the Raft port could not accept a connection ({e.strerror}): "
                                           f"accepting again in {TIMEOUTS.raft_accept_pause_s:g} s")
                return
            self._accepted(conn, addr)


KEEPALIVE = "llmgw_keepalive"


class SealedTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport with each connection's seal check reported to `refusals`, every
    link kept warm, and the port bounded (`_BoundedConnection`, `_Listener`, and below).

    Keepalives: pysyncobj closes a connection that has read nothing for `connectionTimeout`, but
    checks only when it sends on it. Followers never send to each other, so when the leader died the
    first vote request a candidate sent to the other follower found that link idle for longer, closed
    it and was lost: the election waited for another timeout (failover after a SIGKILL ~1.3 s p50).
    Each member now sends a `llmgw_keepalive` on every link a few times per timeout; the receiver
    drops it before pysyncobj (which would ignore an unknown type anyway: an older member is fine).

    Accepted connections: one that has not named its member within `connectionTimeout` (the
    handshake: the sealed key exchange, then the name) is dropped and logged, and one that then
    reads nothing for as long is closed; pysyncobj checked neither, as it never sends on them, so
    1,000 silent strangers held 1,000 descriptors for good. Of connections waiting for their
    handshake, `PENDING_PER_ADDRESS` from one address are kept (more are refused at once) and
    `PENDING_TOTAL` from all (a new one drops the oldest). Of named ones, a member holds one per
    peer: a peer's new connection closes its previous one (pysyncobj forgot it, open), and a
    read-only node (pysyncobj's, which llmgw never runs) is refused."""

    _server: Any  # pysyncobj's: its TcpServer, made into a `_Listener` here
    _tls: RaftPeerTls | None = None  # (set in __init__; a default for a transport built bare, as a test does)
    _waiting_since: dict[int, float]
    _kept: frozenset[Any] = frozenset()  # (see `dropNode`; a default for a transport built bare, as a test does)

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any, *, refusals: RefusalLog,
                 abstain: Callable[[], bool] | None = None, tls: RaftPeerTls | None = None) -> None:
        # Before the base's __init__: it adds the peers (addNode) and the server.
        self._refusals = refusals
        self._tls = tls
        # Peers whose last TLS dial never finished its handshake: until when they are dialled sealed-only,
        # and the wait after the next failure (doubling up to `raft_tls_retry_s`: an older llmgw in a
        # rolling upgrade answers no TLS; a new group's member may lack its certificate a moment longer).
        self._no_tls: dict[str, tuple[float, float]] = {}
        self._waiting_since: dict[int, float] = {}  # commands handed to the leader, unanswered: since when
        self._keepalive_at = 0.0
        # True while this member must neither vote nor stand (it started empty to rejoin, and has not caught
        # up with a leader yet): see `RaftStore`'s `abstain_until_synced`.
        self._abstain = abstain
        # Peers a membership change replayed from the leader's log would have dropped while this member catches
        # up (see `dropNode`): kept until it has, then dropped if the group it reached lacks them.
        self._kept = frozenset()
        self._swept_at = 0.0
        self._accepted_conns: set[_BoundedConnection] = set()  # this member's incoming connections, until closed
        conf = syncObj.conf
        self._payload_limit = payload_bound(conf.logCompactionBatchSize, conf.appendEntriesBatchSizeBytes)
        self._sealed_bound = sealed_size(self._payload_limit)
        super().__init__(syncObj, selfNode, otherNodes)

    def _onTick(self) -> None:
        super()._onTick()
        if self._abstain is not None and self._abstain():
            self._hold_candidacy()
        elif self._kept:
            group: set[Any] = getattr(self._syncObj, "_SyncObj__otherNodes", set())
            kept, self._kept = self._kept, frozenset()
            for node in kept:
                if node not in group:
                    super().dropNode(node)
        now = time.monotonic()
        if now - self._keepalive_at >= self._syncObj.conf.connectionTimeout / 4:
            self._keepalive_at = now
            for node in list(self._connections):
                self.send(node, {"type": KEEPALIVE})
        if now - self._swept_at >= TIMEOUTS.raft_sweep_s:
            self._swept_at = now
            self._sweep(now)
            if isinstance(self._server, _Listener):
                self._server.resume(now)

    def _hold_candidacy(self) -> None:
        """An abstaining member stands for no election either: its log may lack what it acknowledged, and a
        peer whose log is no longer than its own (one that missed those entries too) would vote for it
        (seen: a standby rejoined empty was elected by the other standby, which had missed the leader's
        first entries, and the write the rejoined one had acknowledged was lost). Its election deadline,
        on pysyncobj's clock, is kept an election timeout ahead until it has caught up with a leader."""
        obj = self._syncObj
        obj._SyncObj__raftElectionDeadline = max(obj._SyncObj__raftElectionDeadline,
                                                raft_clock() + obj.conf.raftMaxTimeout)

    def dropNode(self, node: Any) -> None:
        """A member that catches up after `--join`/`--rejoin` replays the leader's log from its start, and
        pysyncobj applies each membership change in it as it appends it: a change that once removed the member
        that leads now (removed and added again since) dropped the link to it, and every connection from it was
        refused as from a stranger; the member never caught up (the fault campaign: a member-change round whose
        rejoined member was sent the log from index 2). While it abstains, it keeps such a peer's link; the
        change that adds it again (`addNode`, below) finds it there, and one the group it reaches lacks is dropped
        once it has caught up (`_onTick`)."""
        if self._abstain is not None and self._abstain() and node in self._nodes:
            self._kept = self._kept | {node}
            return
        super().dropNode(node)

    def _sweep(self, now: float) -> None:
        timeout = self._syncObj.conf.connectionTimeout
        if self._tls is not None:
            self._sweep_tls(now)
        for conn in list(self._accepted_conns):
            if conn.state == CONNECTION_STATE.DISCONNECTED:
                self._accepted_conns.discard(conn)
            elif conn in self._unknownConnections:
                if now - conn.accepted_at > timeout:
                    self._refusals.refused(conn.host, f"dropped a Raft connection from {conn.peer}: no handshake "
                                                      f"within {timeout:g} s", reason="handshake")
                    conn.disconnect()
            elif now - conn.last_read > timeout:
                conn.disconnect()  # silent: pysyncobj would close it on a send, and may never send on it

    def _sweep_tls(self, now: float) -> None:
        """Connections whose peer's certificate is no longer accepted (revoked, expired) are dropped.
        A sealed-only link (a new group's first ones, made before any member held a certificate) is
        dialled again over TLS as soon as both ends can: the dialler drops it once it holds a certificate
        and the peer's is recorded (unless the peer answered no TLS lately: an older llmgw), and redials
        at once; once the group requires TLS, a follower drops the ends it did not dial too. A follower
        that drops a link holds its election back for an election timeout meanwhile: two followers that
        cut their links to the leader together would otherwise elect another (seen)."""
        assert self._tls is not None
        plain = self._tls.plain_refused()
        leading = self._syncObj._isLeader()
        # A command this member handed to the leader waits for its answer on a link: pysyncobj never sends
        # it again, so a link dropped now would leave its submitter waiting for the next election (seen:
        # a member's announcement at its start). The links are switched at a later sweep. pysyncobj keeps
        # a lost one's entry until a leader changes: one waiting longer than a connection timeout is lost.
        asked = getattr(self._syncObj, "_SyncObj__commandsWaitingReply", None) or {}
        self._waiting_since = {k: self._waiting_since.get(k, now) for k in asked}
        waiting = any(now - since < self._syncObj.conf.connectionTimeout for since in self._waiting_since.values())
        closed = False
        for conn in {*self._accepted_conns, *self._connections.values()}:
            if not isinstance(conn, _BoundedConnection) or conn.state != CONNECTION_STATE.CONNECTED:
                continue
            if conn.tls is not None:
                conn.recheck(now, TIMEOUTS.raft_peer_recheck_s)
                continue
            if conn._sniffing or waiting:
                continue
            if conn.outgoing:
                if (self._tls.client_context(conn.peer) is None or self._sealed_only(conn.peer, now)
                        or not self._tls.settled(conn.peer)):
                    continue
            elif plain is None or leading:
                continue
            if not leading and not closed:  # pysyncobj's own deadline, on its own clock: moved, not set
                self._syncObj._SyncObj__raftElectionDeadline += self._syncObj.conf.raftMaxTimeout
            closed = True
            log.info("closed the sealed-only Raft connection with %s to dial it again over TLS", conn.peer)
            if conn.outgoing:  # dialled again at once, not after the retry interval of its first dial
                self._lastConnectAttempt.pop(self._connToNode(conn), None)
            conn.disconnect()

    def _sealed_only(self, peer: str, now: float) -> bool:
        """Whether `peer` is dialled sealed-only now: it answered no TLS lately, and the group does not
        require TLS yet."""
        until = self._no_tls.get(peer)
        return until is not None and now < until[0] and self._tls is not None and self._tls.plain_refused() is None

    def links(self) -> dict[str, str]:
        """Each peer's link, as this member holds it: "tls", "sealed" (no TLS) or "down"."""
        out = {}
        for node, conn in list(self._connections.items()):
            if node == self._selfNode:
                continue
            if conn.state != CONNECTION_STATE.CONNECTED:
                out[str(node.address)] = "down"
            elif isinstance(conn, _BoundedConnection) and conn.tls is not None:
                out[str(node.address)] = "tls" if conn.tls.done else "down"
            else:
                out[str(node.address)] = "sealed"
        return out

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == KEEPALIVE:
            return
        if (self._abstain is not None and isinstance(message, dict) and message.get("type") == "request_vote"
                and self._abstain()):
            return  # no vote, not even a refusal: the candidate counts it as a missing member
        super()._onMessageReceived(node, message)

    def _createServer(self) -> None:
        super()._createServer()  # resolves the bind address as pysyncobj does; nothing is bound yet
        server = self._server
        self._server = _Listener(self._syncObj._poller, server._TcpServer__host, server._TcpServer__port,
                                 self._accepted, self._report)

    def _accepted(self, sock: socket.socket, addr: Any) -> None:
        peer = str(addr[0])
        host = address_key(peer)
        waiting = [c for c in self._unknownConnections if isinstance(c, _BoundedConnection)]
        if sum(c.host == host for c in waiting) >= PENDING_PER_ADDRESS:
            sock.close()
            self._report(host, "limit", f"refused a Raft connection from {peer}: it has {PENDING_PER_ADDRESS} "
                                        f"connections waiting for their handshake already")
            return
        if len(waiting) >= PENDING_TOTAL:
            oldest = min(waiting, key=lambda c: c.accepted_at)
            self._report(oldest.host, "limit", f"dropped a Raft connection from {oldest.peer}: {PENDING_TOTAL} "
                                               f"connections were waiting for their handshake, it the longest")
            oldest.disconnect()
        conf = self._syncObj.conf
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, conf.sendBufferSize)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, conf.recvBufferSize)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        conn = self._connection(host=host, peer=peer, poller=self._syncObj._poller, socket=sock,
                                timeout=conf.connectionTimeout, sendBufferSize=conf.sendBufferSize,
                                recvBufferSize=conf.recvBufferSize, keepalive=None)  # as pysyncobj's server
        self._accepted_conns.add(conn)
        self._onNewIncomingConnection(conn)

    def _connection(self, **kwargs: Any) -> _BoundedConnection:
        return _BoundedConnection(report=self._report, sealed_bound=self._sealed_bound,
                                  payload_limit=self._payload_limit, tls=self._tls, **kwargs)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)
        fernet = self._syncObj.encryptor
        if fernet is not None:
            conn.encryptor = _SealCheck(fernet, conn.peer, self._refused_incoming)

    def addNode(self, node: Any) -> None:
        if node in self._kept:
            self._kept = self._kept - {node}  # a peer kept while catching up (`dropNode`): its link is there already
            return
        super().addNode(node)
        if not self._shouldConnect(node):
            return
        # The connection this member dials: pysyncobj's, made above and never used, becomes ours.
        conf, fernet = self._syncObj.conf, self._syncObj.encryptor
        conn = self._connection(host=_host(str(node.address)), peer=str(node.address), poller=self._syncObj._poller,
                                timeout=conf.connectionTimeout, sendBufferSize=conf.sendBufferSize,
                                recvBufferSize=conf.recvBufferSize, keepalive=conf.tcp_keepalive)
        if fernet is not None:
            conn.encryptor = _SealCheck(fernet, str(node.address), self._refused_outgoing)
        conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
        self._connections[node] = conn

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        # After the key exchange, an incoming connection names its member: one this group lacks
        # (a peer list that disagrees) is dropped by pysyncobj, without a word.
        named = bool(self._syncObj.encryptor is None or conn.sendRandKey) and isinstance(message, str)
        if named and message == "readonly":
            # pysyncobj would keep it (any number of them) and send it the log; llmgw has no read-only nodes.
            self._refusals.refused(conn.host, f"refused a read-only Raft node (from {conn.peer}): an llmgw group "
                                              f"has none", reason="group")
            conn.disconnect()
            return
        if named and message not in self._nodeAddrToNode:
            members = ", ".join(sorted(self._nodeAddrToNode)) or "no other member"
            self._refusals.refused(conn.host, f"refused Raft member {message[:100]!r} (from {conn.peer}): it is not in "
                                              f"this member's group ({members}); check both members' --peer "
                                              f"lists", reason="group")
        if named and isinstance(conn, _BoundedConnection) and conn.tls is not None and self._tls is not None:
            why = self._tls.check_peer(conn.tls.peer_der, message)  # its certificate names the member it says it is
            if why is not None:
                self._report(conn.host, "tls-peer", f"refused a Raft connection from {conn.peer}: {why}")
                conn.disconnect()
                return
        node = self._nodeAddrToNode.get(message) if named else None
        before = self._connections.get(node) if node is not None else None
        super()._onIncomingMessageReceived(conn, message)
        if before is not None and before is not conn and before in self._accepted_conns:
            # The member dialled again: pysyncobj forgets its previous connection, dead or dying,
            # without closing it. So a member holds one incoming connection per peer, no more.
            before.disconnect()

    def _onOutgoingConnected(self, conn: Any) -> None:
        context = self._tls.client_context(str(conn.peer)) if self._tls is not None else None
        if context is not None and self._sealed_only(str(conn.peer), time.monotonic()):
            context = None  # it answered no TLS lately: sealed-only, as the group still takes
        if context is not None and isinstance(conn, _BoundedConnection):
            conn.start_tls(context)  # its hello first; pysyncobj's key exchange waits for the handshake
            if conn.state == CONNECTION_STATE.DISCONNECTED:
                return
        if isinstance(conn.encryptor, _SealCheck):
            conn.encryptor.handshaking = True
            conn.encryptor.connected_at = time.monotonic()
        super()._onOutgoingConnected(conn)

    def _onDisconnected(self, conn: Any) -> None:
        if isinstance(conn, _BoundedConnection) and conn.outgoing and conn.spoke_tls:
            if conn.tls_ok:
                self._no_tls.pop(conn.peer, None)
            elif self._tls is not None and self._tls.plain_refused() is None:
                _, wait = self._no_tls.get(conn.peer, (0.0, TIMEOUTS.raft_tls_retry_s / 64))
                self._no_tls[conn.peer] = (time.monotonic() + wait, min(2 * wait, TIMEOUTS.raft_tls_retry_s))
                self._lastConnectAttempt.pop(self._connToNode(conn), None)  # sealed-only, at once
        check = getattr(conn, "encryptor", None)
        if isinstance(check, _SealCheck) and check.handshaking:
            check.handshaking = False
            if isinstance(conn, _BoundedConnection) and conn.spoke_tls:
                super()._onDisconnected(conn)  # a refused certificate: the peer's log says why
                return
            # The peer took the connection, got our sealed key and hung up at once, unanswered.
            # A peer that only stays silent (stopped, overloaded) is dropped after
            # connectionTimeout instead: that is no refusal.
            if time.monotonic() - check.connected_at < self._syncObj.conf.connectionTimeout:
                self._refusals.refused(
                    _host(check.peer),
                    f"Raft peer {check.peer} closed the connection during the handshake: it likely holds "
                    f"another cluster secret (its log says whom it refused)")
        super()._onDisconnected(conn)

    def destroy(self) -> None:
        self._abstain = None  # the member stops: `dropNode` keeps no link now (it would leave its socket open)
        self._kept = frozenset()
        super().destroy()
        for conn in list(self._accepted_conns):  # named ones pysyncobj forgot (a member that dialled again)
            conn.disconnect()
        self._accepted_conns.clear()

    def _report(self, host: str, reason: str, message: str) -> None:
        self._refusals.refused(host, message, reason=reason)

    def _refused_incoming(self, peer: str) -> None:
        self._refusals.refused(address_key(peer), f"refused a Raft connection from {peer}: its message is "
                                                  f"{_WRONG_SECRET}")

    def _refused_outgoing(self, peer: str) -> None:
        self._refusals.refused(_host(peer), f"refused Raft peer {peer}: its answer is {_WRONG_SECRET}")


def sealed_transport(refusals: RefusalLog, abstain: Callable[[], bool] | None = None,
                     tls: RaftPeerTls | None = None) -> Callable[..., SealedTransport]:
    """What SyncObj takes as `transportClass`: it calls it with (syncObj, selfNode, otherNodes)."""
    return functools.partial(SealedTransport, refusals=refusals, abstain=abstain, tls=tls)


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]") or address
