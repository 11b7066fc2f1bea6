"""The trust commands (domain/trust.py): `trust.ca_add` (an intermediate CA, made at a group's first
start or by `ctl ca rotate`), `trust.token_add` / `trust.token_remove` (join tokens), `trust.issue`
(a certificate issued to a machine, with a join token or as a renewal), `trust.revoke` (every
unexpired certificate of a machine) and `trust.raft_tls` (the group requires TLS between its members
from now on).

A join token is used at most once because `trust.issue` marks it used in the log: of two machines
racing with one token, the second's command is refused at apply and its certificate, signed before,
is never handed out (the operation answers with the refusal).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain.commands.core import CommandError, make, readonly, required
from llmgw.domain.state import ClusterState
from llmgw.domain.trust import (MACHINE_ROLES, SERIAL_RE, Authority, JoinToken, MachineCert, Revocation,
                                machine_id, name_problem, token_refusal)

PEM_MAX_CHARS = 20_000
KEEP_SERIALS = 8  # a machine's unexpired certificates kept per machine (renewals overlap the old one)


def ca_add(authority_id: str, cert_pem: str, key_sealed: str, root_pem: str, not_after: float, at: float, *,
           activate: bool = True) -> dict[str, Any]:
    return make("trust.ca_add", at, authority_id=authority_id, cert_pem=cert_pem, key_sealed=key_sealed,
                root_pem=root_pem, not_after=not_after, activate=activate)


def token_add(token_hash: str, token_id: str, role: str, expires_at: float, at: float, *,
              name: str = "") -> dict[str, Any]:
    return make("trust.token_add", at, token_hash=token_hash, token_id=token_id, role=role, name=name,
                expires_at=expires_at)


def token_remove(token_id: str, at: float) -> dict[str, Any]:
    return make("trust.token_remove", at, token_id=token_id)


def issue(role: str, name: str, serial: str, not_after: float, authority_id: str, at: float, *,
          token_hash: str = "") -> dict[str, Any]:
    """A certificate issued to `role/name`: with a join token (`token_hash`), or "" for a renewal
    over the machine's authenticated stream or a control plane's own certificate."""
    return make("trust.issue", at, role=role, name=name, serial=serial, not_after=not_after,
                authority_id=authority_id, token_hash=token_hash)


def revoke(role: str, name: str, at: float) -> dict[str, Any]:
    return make("trust.revoke", at, role=role, name=name)


def raft_tls(members: list[str], at: float) -> dict[str, Any]:
    """The group requires TLS between its members from now on: every one of `members` (the group's
    Raft addresses) holds a control certificate."""
    return make("trust.raft_tls", at, members=members)


def _role(c: dict[str, Any]) -> str:
    role = required(c, "role")
    if role not in MACHINE_ROLES:
        raise CommandError("invalid_role", f"role must be one of {', '.join(MACHINE_ROLES)}, not {role!r:.40}")
    return role


def _name(c: dict[str, Any], *, optional: bool = False) -> None:
    name = c.get("name", "")
    if optional and name == "":
        return
    problem = name_problem(name)
    if problem is not None:
        raise CommandError("invalid_name", problem)


def _time(c: dict[str, Any], field: str) -> float:
    value = c.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e11:
        raise CommandError("bad_command", f"{field} must be a unix time")
    return float(value)


def _serial(c: dict[str, Any], field: str) -> str:
    value = c.get(field)
    if not isinstance(value, str) or not SERIAL_RE.fullmatch(value):
        raise CommandError("bad_command", f"{field} must be a certificate serial in lower-case hex")
    return value


def _pem(c: dict[str, Any], field: str, kind: str) -> None:
    value = c.get(field)
    if not isinstance(value, str) or f"-----BEGIN {kind}" not in value or len(value) > PEM_MAX_CHARS:
        raise CommandError("bad_command", f"{field} must be a PEM {kind.lower()}")


def check_ca_add(c: dict[str, Any]) -> None:
    _serial(c, "authority_id")
    _pem(c, "cert_pem", "CERTIFICATE")
    _pem(c, "root_pem", "CERTIFICATE")
    sealed = c.get("key_sealed")
    if not isinstance(sealed, str) or not sealed or len(sealed) > PEM_MAX_CHARS:
        raise CommandError("bad_command", "key_sealed must be the sealed key")
    _time(c, "not_after")
    if not isinstance(c.get("activate"), bool):
        raise CommandError("bad_command", "activate must be true or false")


def apply_ca_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Adds the authority; `activate` makes it the one that signs (the others stay trusted). The
    same id again changes nothing (a retried rotation). Authorities expired at `at` are dropped."""
    aid = c["authority_id"]
    if aid in s.authorities:
        return s, {"authority_id": aid, "added": False}
    new = Authority(aid, c["cert_pem"], c["key_sealed"], c["root_pem"], float(c["not_after"]), at,
                    active=c["activate"])
    kept = {k: (replace(a, active=False) if c["activate"] else a) for k, a in s.authorities.items() if a.not_after > at}
    return replace(s, authorities=readonly(kept | {aid: new})), {"authority_id": aid, "added": True}


def check_token_add(c: dict[str, Any]) -> None:
    th = c.get("token_hash")
    if not isinstance(th, str) or not th.startswith("sha256:") or len(th) != 71:
        raise CommandError("bad_command", "token_hash must be a sha256: hash")
    tid = required(c, "token_id")
    if not tid.startswith("tok_") or not tid[4:].isalnum() or len(tid) > 40:
        raise CommandError("bad_command", "token_id must be tok_ and letters or digits")
    _role(c)
    _name(c, optional=True)
    if _time(c, "expires_at") <= float(c["at"]):  # its longest life is the admin API's to bound (timeouts)
        raise CommandError("invalid_ttl", "a join token expires after it is made")


def apply_token_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Adds the token; used and expired tokens are dropped from the state at the same time (a list
    keeps what can still be used)."""
    th = c["token_hash"]
    if th in s.join_tokens:
        raise CommandError("token_taken", "this token is already stored")
    token = JoinToken(th, c["token_id"], c["role"], at, float(c["expires_at"]), c.get("name", ""))
    kept = {k: t for k, t in s.join_tokens.items() if t.used_at is None and t.expires_at > at}
    return replace(s, join_tokens=readonly(kept | {th: token})), {"token_id": token.token_id}


def check_token_remove(c: dict[str, Any]) -> None:
    required(c, "token_id")


def apply_token_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    kept = {k: t for k, t in s.join_tokens.items() if t.token_id != c["token_id"]}
    return replace(s, join_tokens=readonly(kept)), {"removed": len(kept) < len(s.join_tokens)}


def check_issue(c: dict[str, Any]) -> None:
    _role(c)
    _name(c)
    _serial(c, "serial")
    _serial(c, "authority_id")
    _time(c, "not_after")
    th = c.get("token_hash")
    if not isinstance(th, str) or (th and not th.startswith("sha256:")):
        raise CommandError("bad_command", "token_hash must be a sha256: hash or empty")


def apply_issue(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Records the certificate; with a token, uses it (refused: unknown, used, expired, another
    role or name). The issuing authority must be known: a certificate from a forgotten one is not."""
    role, name, serial = c["role"], c["name"], c["serial"]
    if c["authority_id"] not in s.authorities:
        raise CommandError("unknown_authority", f"authority {c['authority_id']} is not one of this cluster's")
    if serial in s.revoked:
        raise CommandError("revoked", f"certificate {serial} is revoked")
    tokens = s.join_tokens
    th = c["token_hash"]
    if th:
        refusal = token_refusal(tokens.get(th), role, name, at)
        if refusal is not None:
            raise CommandError(*refusal)
        tokens = readonly(tokens | {th: replace(tokens[th], used_at=at, used_by=machine_id(role, name))})
    mid = machine_id(role, name)
    old = s.machines.get(mid)
    if not th and old is None and any(r.role == role and r.name == name for r in s.revoked.values()):
        # a revoked machine (a control plane signs its own certificates) comes back only with a join token
        raise CommandError("revoked", f"{role} {name} was revoked: it joins again with a join token")
    # the unexpired serials only (their expiries are not kept per serial: a renewal happens at two thirds of
    # a lifetime, so the previous certificate outlives the newest one's issue by a third at most)
    serials = (old.serials if old is not None and old.not_after > at else ())[-(KEEP_SERIALS - 1):] + (serial,)
    machine = MachineCert(role, name, serials, float(c["not_after"]), at, c["authority_id"])
    return (replace(s, join_tokens=tokens, machines=readonly(s.machines | {mid: machine})),
            {"machine": mid, "serial": serial})


def check_revoke(c: dict[str, Any]) -> None:
    _role(c)
    _name(c)


def apply_revoke(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Revokes every certificate the machine holds and forgets the machine (it can join again only
    with a new token). Revocations past their certificate's expiry are dropped."""
    mid = machine_id(c["role"], c["name"])
    machine = s.machines.get(mid)
    if machine is None:
        raise CommandError("not_found", f"no {c['role']} named {c['name']!r} holds a certificate of this cluster")
    revoked = {k: r for k, r in s.revoked.items() if r.not_after > at}
    for serial in machine.serials:
        revoked[serial] = Revocation(serial, machine.role, machine.name, at, machine.not_after)
    machines = {k: m for k, m in s.machines.items() if k != mid}
    return (replace(s, revoked=readonly(revoked), machines=readonly(machines)),
            {"machine": mid, "revoked": list(machine.serials)})


def check_raft_tls(c: dict[str, Any]) -> None:
    members = c.get("members")
    if not isinstance(members, list) or not members or not all(isinstance(m, str) and m for m in members):
        raise CommandError("bad_command", "members must be the group's Raft addresses")


def apply_raft_tls(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Refused unless each member named holds a control certificate here; once set, kept (a retry or
    a second leader's command changes nothing)."""
    if s.raft_tls_since:
        return s, {"since": s.raft_tls_since, "changed": False}
    lacking = [m for m in c["members"] if machine_id("control", m) not in s.machines]
    if lacking:
        raise CommandError("no_certificate", f"member {lacking[0]} holds no control certificate yet")
    return replace(s, raft_tls_since=at), {"since": at, "changed": True}
