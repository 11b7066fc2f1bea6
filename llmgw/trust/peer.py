"""May this certificate speak for this role? The check every member makes of a machine's
certificate, after the TLS handshake verified its chain against the cluster's bundle, against the
replicated trust facts: issued by one of the cluster's current authorities, not expired at `now`,
not revoked, and recorded for the machine it names (a revoked machine is forgotten, so a
certificate of it is refused even if a revocation record was since dropped).
"""

from __future__ import annotations

from cryptography import x509

from llmgw.domain.state import ClusterState
from llmgw.domain.trust import machine_id
from llmgw.trust import ca


class PeerRefused(Exception):
    """A machine's certificate that does not admit it; `code` and `message` go to the peer and the log."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def authorities(state: ClusterState) -> dict[str, x509.Certificate]:
    return {aid: ca.load_cert(a.cert_pem) for aid, a in state.authorities.items()}


def authorize(cert_der: bytes | None, state: ClusterState, now: float, *, role: str) -> ca.Identity:
    """The identity of the `role` machine holding `cert_der`, or PeerRefused saying why not."""
    if cert_der is None:
        raise PeerRefused("unauthorized", f"a {role} authenticates with its certificate from this cluster's CA "
                          f"(mutual TLS); none was presented. Join the machine with a token: llmgw ctl nodes "
                          f"token create --role {role} (docs/install.md, Joining a machine)")
    try:
        who = ca.identity(x509.load_der_x509_certificate(cert_der), authorities(state))
    except (ca.CaError, ValueError) as e:
        raise PeerRefused("unauthorized", f"the certificate presented names no machine of this cluster: {e}") from None
    if who.role != role:
        raise PeerRefused("forbidden", f"a {who.role}'s certificate ({who.name}) cannot speak as a {role}")
    if not who.issuer_serial:
        raise PeerRefused("unauthorized", f"the certificate of {who.role} {who.name} was not issued by one of this "
                          f"cluster's current authorities (rotated out, or another cluster's)")
    if now >= who.not_after:
        raise PeerRefused("unauthorized", f"the certificate of {who.role} {who.name} expired; join it again with a "
                          f"new token")
    if who.serial in state.revoked:
        raise PeerRefused("revoked", f"the certificate of {who.role} {who.name} (serial {who.serial}) is revoked")
    machine = state.machines.get(machine_id(who.role, who.name))
    if machine is None or who.serial not in machine.serials:  # a control plane records its own before using it
        raise PeerRefused("revoked", f"the certificate of {who.role} {who.name} (serial {who.serial}) is not one "
                          f"this cluster holds for it (revoked, or replaced long ago)")
    return who
