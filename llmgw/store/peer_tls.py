"""Raft's TLS between control planes, under pysyncobj's own sockets (docs/security.md, "Between
control planes"): OpenSSL over memory buffers, driven by pysyncobj's poller like the rest of its
connection. `TlsLayer` is the part of `llmgw.store.wire._BoundedConnection` that speaks it: an
accepted connection is TLS or sealed-only by its first byte, a dialled one starts TLS when its
transport asks (`start_tls`); frames pysyncobj queues before the handshake finishes wait for it; the
peer's certificate is checked by the `RaftPeerTls` at the handshake and again every so often.

pysyncobj 0.3.17 is pinned: this overrides its connection's name-mangled send and reads its private
socket, buffers and poller, as `llmgw.store.wire` does.
"""

from __future__ import annotations

import errno
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

if TYPE_CHECKING:
    from llmgw.interfaces import RaftPeerTls

log = logging.getLogger("llmgw.store")

TLS_HANDSHAKE_RECORD = 0x16  # the first byte of a TLS client's first message
_TLS_READ = 1 << 16


class TlsState:
    """One connection's TLS over memory buffers: pysyncobj's poller drives the socket as before, and
    OpenSSL only turns bytes into bytes (an `SSLSocket` would raise want-read/want-write where
    pysyncobj expects EAGAIN, and hide decrypted bytes from the poller)."""

    __slots__ = ("obj", "incoming", "outgoing", "done", "early", "peer_der", "checked_at")

    def __init__(self, context: ssl.SSLContext, *, server_side: bool) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side)
        self.done = False  # the handshake finished and the peer's certificate was accepted
        self.early = b""  # frames pysyncobj sent before the handshake finished (its key exchange)
        self.peer_der: bytes | None = None
        self.checked_at = 0.0


class TlsLayer:
    """TLS for a pysyncobj connection (see the module's docstring): mixed in before `TcpConnection`."""

    # the connection's, set in its __init__ (`_BoundedConnection`)
    tls: TlsState | None
    outgoing: bool
    peer: str
    spoke_tls: bool
    tls_ok: bool
    _policy: RaftPeerTls | None
    _sniffing: bool
    _cipher: int
    _TcpConnection__writeBuffer: bytes
    _TcpConnection__socket: Any
    _TcpConnection__poller: Any
    state: int

    if TYPE_CHECKING:  # the connection's own (declared only: at run time they are TcpConnection's)
        def _refuse(self, reason: str, words: str) -> None: ...

        def fileno(self) -> int | None: ...

        def _TcpConnection__trySendBuffer(self) -> None: ...

        def _TcpConnection__processConnection(self, descr: int, event: int) -> None: ...

    def _first_bytes(self, data: bytes) -> bool:
        """An accepted connection's first bytes: a TLS client's hello starts TLS here, anything else is
        sealed-only, refused when the group requires TLS. False: refused."""
        self._sniffing = False
        assert self._policy is not None
        if data[0] == TLS_HANDSHAKE_RECORD:
            context = self._policy.server_context()
            if context is None:  # a new group's member a moment before its certificate: the peer dials again
                log.info("closed a Raft connection from %s: it speaks TLS, and this member has no certificate yet (a "
                         "member gets its own once the group's CA exists, or joins with a token for the control "
                         "role)", self.peer)
                self.disconnect()
                return False
            self.tls = TlsState(context, server_side=True)
            return True
        why = self._policy.plain_refused()
        if why is not None:
            self._refuse("tls-plain", f"it does not speak TLS, and {why}")
            return False
        return True

    def start_tls(self, context: ssl.SSLContext) -> None:
        """This (dialled, just connected) connection speaks TLS: the client's hello goes first."""
        self.tls = TlsState(context, server_side=False)
        self.spoke_tls = True
        self._handshake()

    def _handshake(self) -> bool:
        """One step of the handshake; True once it finished and the peer's certificate was accepted."""
        tls = self.tls
        assert tls is not None and self._policy is not None
        try:
            tls.obj.do_handshake()
        except ssl.SSLWantReadError:
            self._send_records()
            return False
        except ssl.SSLError as e:
            self._send_records()  # the alert that says why, when OpenSSL made one
            self._refuse("tls-handshake", f"its TLS handshake failed ({getattr(e, 'verify_message', None) or e.reason or e})")
            return False
        tls.peer_der = tls.obj.getpeercert(binary_form=True)
        why = self._policy.check_peer(tls.peer_der, self.peer if self.outgoing else None)
        if why is not None:
            self._refuse("tls-peer", why)
            return False
        tls.done, tls.checked_at = True, time.monotonic()
        self.tls_ok = True
        self._send_records()
        return True

    def recheck(self, now: float, every_s: float) -> None:
        """Drop this connection if its peer's certificate is no longer accepted (revoked, expired)."""
        tls = self.tls
        if tls is None or not tls.done or now - tls.checked_at < every_s or self._policy is None:
            return
        tls.checked_at = now
        why = self._policy.check_peer(tls.peer_der, self.peer if self.outgoing else None)
        if why is not None:
            self._refuse("tls-peer", why)

    def _tls_received(self, data: bytes, buf: bytearray) -> bool:
        """TLS records in: the handshake's next step, or frames' bytes into `buf`. Drains what OpenSSL
        decrypted (at most what came in), so nothing waits there unseen by the poller."""
        tls = self.tls
        assert tls is not None
        tls.incoming.write(data)
        if not tls.done and not self._handshake():
            return bool(self.state != CONNECTION_STATE.DISCONNECTED)
        while True:
            try:
                chunk = tls.obj.read(_TLS_READ)
            except ssl.SSLWantReadError:
                return True
            except ssl.SSLZeroReturnError:
                self.disconnect()
                return False
            except ssl.SSLError as e:
                self._refuse("tls-handshake", f"its TLS records failed ({e.reason or e})")
                return False
            if not chunk:
                self.disconnect()
                return False
            buf += chunk

    def _send_records(self) -> None:
        """Send what TLS has to say now (the handshake's records, and frames queued during it)."""
        if self.state == CONNECTION_STATE.DISCONNECTED:
            return
        self._TcpConnection__trySendBuffer()
        if self._TcpConnection__writeBuffer and self.state != CONNECTION_STATE.DISCONNECTED:
            self._TcpConnection__poller.subscribe(
                self.fileno(), self._TcpConnection__processConnection,
                POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)

    def _seal_tail(self) -> None:
        """Turn the frames pysyncobj appended to the write buffer into TLS records (once the handshake
        finished; until then they wait in `early`, out of the buffer, so the poller is not asked to
        write what cannot be sent yet)."""
        tls = self.tls
        assert tls is not None
        buf = self._TcpConnection__writeBuffer
        frames = tls.early + buf[self._cipher:]
        tls.early = b""
        if frames and tls.done:
            tls.obj.write(frames)  # into a memory buffer: whole, never a want-write
            frames = b""
        tls.early = frames
        records = tls.outgoing.read()
        self._TcpConnection__writeBuffer = buf[:self._cipher] + records
        self._cipher += len(records)

    # pysyncobj's TcpConnection.__processSend, sending TLS records when the connection speaks TLS.
    def _TcpConnection__processSend(self) -> bool:
        if self.tls is None:
            return bool(super()._TcpConnection__processSend())  # type: ignore[misc]  # TcpConnection's
        self._seal_tail()
        buf = self._TcpConnection__writeBuffer
        if not buf:
            return False
        try:
            sent = self._TcpConnection__socket.send(buf)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if sent <= 0:
            return False
        self._TcpConnection__writeBuffer = buf[sent:]
        self._cipher -= sent
        return True

    def getSendBufferSize(self) -> int:
        early = len(self.tls.early) if self.tls is not None else 0
        return len(self._TcpConnection__writeBuffer) + early

    def connect(self, host: str, port: int) -> bool:
        self.tls, self._cipher, self.spoke_tls, self.tls_ok = None, 0, False, False
        return bool(super().connect(host, port))  # type: ignore[misc]

    def disconnect(self) -> None:
        self.tls, self._cipher = None, 0
        super().disconnect()  # type: ignore[misc]

