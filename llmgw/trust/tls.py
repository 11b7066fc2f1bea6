"""TLS contexts for every listener and every client between machines, and the peer certificate of
the connection a request or stream arrived on.

One policy for all: TLS 1.2 or newer; on TLS 1.2 only ECDHE key exchange with AES-GCM or
ChaCha20-Poly1305 (forward secrecy, AEAD); no compression, no renegotiation. Servers ask for a
client certificate but do not require one (people and scripts call the admin API with keys); the
routes that machines use require it (`peer_certificate`).

How a route learns the peer's certificate: the server context's `sslobject_class` records the
certificate, when the handshake completes, in a context variable of the task that runs the
handshake; trio copies a task's context into the tasks it starts, so the request and stream
handlers of that connection read it (`peer_certificate()`), and no other connection can.
"""

from __future__ import annotations

import contextvars
import ssl
from pathlib import Path
from typing import Any

MIN_VERSION = ssl.TLSVersion.TLSv1_2
# TLS 1.2 suites (TLS 1.3's are all AEAD with forward secrecy and stay OpenSSL's default).
CIPHERS_TLS12 = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS:!RSA:!PSK:!SRP:!CAMELLIA:!ARIA:!SHA1"

_peer: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("llmgw_tls_peer", default=None)


def peer_certificate() -> bytes | None:
    """The DER certificate the client of this connection presented (verified against the cluster's
    CAs by the handshake), or None: no TLS, or no certificate."""
    return _peer.get()


class _RecordingSSLObject(ssl.SSLObject):
    def do_handshake(self) -> None:
        super().do_handshake()  # raises SSLWantReadError until it completes
        _peer.set(self.getpeercert(binary_form=True))


def _harden(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = MIN_VERSION
    context.set_ciphers(CIPHERS_TLS12)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def server_context(cert: Path, key: Path, ca: Path | None, *, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """A listener's context: its certificate chain and key (files), and, with `ca` (the cluster's
    trust bundle), client certificates asked for and verified."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    context.load_cert_chain(str(cert), str(key))
    if ca is not None:
        context.load_verify_locations(cafile=str(ca))
        context.verify_mode = ssl.CERT_OPTIONAL
        context.sslobject_class = _RecordingSSLObject
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def client_context(ca: Path | None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client's context: the server verified against `ca` (the cluster's bundle; None: the
    system's), host name checked; with `cert`/`key`, this machine's certificate offered."""
    context = _harden(ssl.create_default_context(cafile=str(ca) if ca is not None else None))
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def hypercorn_tls(config: Any, context: ssl.SSLContext) -> Any:
    """A copy of a hypercorn `Config` that serves TLS with `context` (ours, not one hypercorn makes
    from files: it records peers' certificates and is reloaded in place on renewal)."""
    from hypercorn.config import Config

    class _TlsConfig(Config):
        @property
        def ssl_enabled(self) -> bool:
            return True

        def create_ssl_context(self) -> ssl.SSLContext:
            return context

    copy = _TlsConfig()
    copy.__dict__.update(config.__dict__)
    return copy
