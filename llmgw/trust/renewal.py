"""A machine renews its certificate before it ends, over the stream it already authenticated: at two
thirds of the certificate's life it sends a request for a new one (with a new key, made here and
kept in memory until the certificate for it arrives), writes both, and reloads its TLS context in
place: the stream it has goes on, the next connection presents the new certificate. Nothing restarts.

The clock is an argument (`clock`), so a test runs a certificate to its renewal, and another past its
end, without waiting.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.trust import ca
from llmgw.trust.files import MachineFiles, write_private

log = logging.getLogger("llmgw.trust")

RENEW_AT = 2 / 3  # of a certificate's life


def renew_at(cert_pem: str) -> float:
    """When a certificate is due for renewal: two thirds into its life (unix time)."""
    cert = ca.load_cert(cert_pem)
    born = cert.not_valid_before_utc.timestamp() + ca.BACKDATE
    return born + (cert.not_valid_after_utc.timestamp() - born) * RENEW_AT


@dataclass
class Renewal:
    """One machine's renewal: `request()` when `due()`, `accept()` with control's answer."""

    files: MachineFiles
    role: str
    name: str
    context: ssl.SSLContext  # the machine's client context: reloaded in place on renewal
    clock: Callable[[], float] = time.time
    retry_s: float = TIMEOUTS.cert_renew_retry_s  # a request unanswered (or refused) is sent again after this long
    # False: another process of this machine renews (gateway workers: the first one); this one only
    # reloads its context when the files change (`refresh`).
    renews: bool = True
    # More contexts made from the same files (a gateway's listener serving its own certificate): reloaded too.
    also: list[ssl.SSLContext] = field(default_factory=list)
    _pending_key: str | None = field(default=None, init=False)
    _asked_at: float | None = field(default=None, init=False)
    _loaded: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._loaded = self._stamp()

    def _stamp(self) -> float:
        try:
            return self.files.cert.stat().st_mtime
        except OSError:
            return 0.0

    def refresh(self) -> bool:
        """Reload the context if another process renewed the files; whether it did."""
        stamp = self._stamp()
        if stamp == self._loaded:
            return False
        self._reload()
        return True

    def _reload(self) -> None:
        for context in (self.context, *self.also):
            context.load_cert_chain(str(self.files.cert), str(self.files.key))
            context.load_verify_locations(cafile=str(self.files.ca))
        self._loaded = self._stamp()

    def due(self) -> bool:
        if not self.renews:
            return False
        now = self.clock()
        if self._asked_at is not None and now - self._asked_at < self.retry_s:
            return False
        return now >= renew_at(self.files.cert.read_text())

    def request(self) -> dict[str, Any]:
        """The `renew` message: a request for a new key's certificate."""
        self._pending_key = ca.new_key_pem()
        self._asked_at = self.clock()
        log.info("asking control to renew this %s's certificate (due at two thirds of its life)", self.role)
        return {"type": "renew", "csr": ca.make_request(self._pending_key, self.role, self.name)}

    def accept(self, cert_chain: str, bundle: str) -> None:
        """Control's `certificate`: kept with the key it was made for, and the context reloaded."""
        key = self._pending_key
        if key is None:
            raise ValueError("a certificate this machine did not ask for")
        who = ca.identity(cert_chain)
        if (who.role, who.name) != (self.role, self.name):
            raise ValueError(f"a certificate for {who.role} {who.name}, not this {self.role} {self.name}")
        # The key first, then the certificate: a crash between leaves a key with no certificate for it,
        # which the next start refuses by name (the machine joins again); never a certificate in use
        # whose key is gone.
        write_private(self.files.key, key)
        self.files.write(cert_chain, bundle)
        self._reload()
        self._pending_key, self._asked_at = None, None
        log.info("renewed this %s's certificate: serial %s, valid until %.0f", self.role, who.serial, who.not_after)
