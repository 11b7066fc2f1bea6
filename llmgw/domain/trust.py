"""Trust between machines, as replicated facts: the cluster's certificate authorities, join tokens,
the certificates issued to machines and the ones revoked (docs/security.md).

Pure: PEM text, hashes and numbers only. The cryptography (making keys, signing, verifying chains)
is `llmgw/trust/`; what is decided from these facts (may this token be used, is this serial
revoked, which machine holds what) is here, so every member decides it alike from its state.

- An `Authority` is one intermediate CA: its certificate, its private key sealed with the cluster
  secret (a member without the secret cannot use it; the root's key is never replicated), and the
  root that signed it. One is `active` (it signs); the others stay trusted until they expire, so a
  rotation keeps every certificate issued before it valid during the overlap.
- A `JoinToken` is stored as the SHA-256 of the token (shown once), with the role it grants, an
  optional machine name it is bound to, and when it expires; it is used once (`used_at`).
- `MachineCert` records, per machine (role and name), the serials of its unexpired certificates.
- `Revocation` keeps a revoked serial until the certificate would have expired anyway.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

MACHINE_ROLES = ("agent", "gateway", "control")
TOKEN_PREFIX = "llmgw-join-"
TOKEN_ID_PREFIX = "tok_"
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
TOKEN_CHARS = 32  # 190 random bits
TOKEN_ID_CHARS = 12
# A machine's name: a host name, roughly; a control plane's is its Raft address (HOST:PORT, [V6]:PORT).
NAME_RE = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9._:\[\]-]{0,252}")
SERIAL_RE = re.compile(r"[0-9a-f]{1,40}")  # a certificate's serial, lower-case hex


@dataclass(frozen=True)
class Authority:
    """One intermediate CA of the cluster (see the module's docstring)."""

    authority_id: str  # the intermediate's serial, hex
    cert_pem: str
    key_sealed: str  # the intermediate's private key (PEM), sealed with the cluster secret
    root_pem: str
    not_after: float
    added_at: float
    active: bool = True


@dataclass(frozen=True)
class JoinToken:
    token_hash: str  # sha256:HEX of the token
    token_id: str  # tok_...: the public name, in lists and logs
    role: str
    created_at: float
    expires_at: float
    name: str = ""  # "" = any machine name
    used_at: float | None = None
    used_by: str = ""  # the machine that used it


@dataclass(frozen=True)
class MachineCert:
    role: str
    name: str
    serials: tuple[str, ...]  # its unexpired certificates, oldest first; the last is the newest
    not_after: float  # the newest certificate's
    issued_at: float
    authority_id: str = ""


@dataclass(frozen=True)
class Revocation:
    serial: str
    role: str
    name: str
    at: float
    not_after: float  # kept until then: past it the certificate is refused as expired anyway


def machine_id(role: str, name: str) -> str:
    """The key of a machine in `ClusterState.machines`: `role/name`."""
    return f"{role}/{name}"


def new_token() -> str:
    return TOKEN_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(TOKEN_CHARS))


def new_token_id() -> str:
    return TOKEN_ID_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(TOKEN_ID_CHARS))


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.strip().encode()).hexdigest()


def looks_like_token(text: str) -> bool:
    return text.startswith(TOKEN_PREFIX) and len(text) == len(TOKEN_PREFIX) + TOKEN_CHARS


def name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return (f"a machine's name is 1-253 letters, digits, '.', '_', ':' or '-', starting with a letter or digit "
                f"(not {name!r:.80})")
    return None


def token_refusal(token: JoinToken | None, role: str, name: str, at: float) -> tuple[str, str] | None:
    """Why `token` cannot make a `role` certificate for `name` at `at`: (code, words), or None.
    One answer for a token never made and one used or expired, so a guesser learns nothing more."""
    if token is None:
        return "invalid_join_token", "this join token is not known to the cluster (make one: llmgw ctl nodes token create)"
    if token.used_at is not None:
        return "invalid_join_token", f"join token {token.token_id} was already used (by {token.used_by}); make a new one"
    if at >= token.expires_at:
        return "invalid_join_token", f"join token {token.token_id} has expired; make a new one"
    if token.role != role:
        return "join_token_role", f"join token {token.token_id} is for a {token.role}, not a {role}"
    if token.name and token.name != name:
        return "join_token_name", f"join token {token.token_id} is for the machine {token.name!r}, not {name!r}"
    return None
