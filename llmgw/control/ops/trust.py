"""Trust between machines (docs/security.md): join tokens (made, listed, removed), a machine's
join (its token and certificate request for a certificate), revocation, the machines' certificates,
and the cluster's CA (shown, rotated).

A join token is shown once, in the answer that made it, with the CA's fingerprint a machine pins
on its first connection; the cluster keeps its hash. A join uses it once: the certificate is
handed out only after the `trust.issue` that marks the token used has committed.
"""

from __future__ import annotations

import logging
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit, Created
from llmgw.control.trust import Trust, active, bundle
from llmgw.domain import commands
from llmgw.domain.commands import trust as trust_commands
from llmgw.domain.trust import (MACHINE_ROLES, hash_token, machine_id, name_problem, new_token,
                                new_token_id, token_refusal)
from llmgw.errors import AdminError
from llmgw.trust import ca

log = logging.getLogger("llmgw.control.admin")

HOSTS_MAX = 32


def _trust(ctx: Context) -> Trust:
    if ctx.trust is None:
        raise AdminError(409, "no_tls", "this control plane serves plain HTTP on loopback and issues no machine "
                         "certificates; start it bound to another address, or with --tls (docs/security.md)")
    return ctx.trust


def ca_fingerprint(ctx: Context) -> str:
    """What a joining machine pins: the SHA-256 of the bundle's roots (`--ca-hash`)."""
    return ca.roots_hash(bundle(ctx.state()))


def _fields(doc: Any, allowed: tuple[str, ...], code: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise AdminError(400, code, f"send a JSON object with {', '.join(allowed)}")
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise AdminError(400, code, f"unknown field {unknown[0]!r}; this takes {', '.join(allowed)}")
    return doc


def _role(value: Any, code: str) -> str:
    if value not in MACHINE_ROLES:
        raise AdminError(400, code, f"role must be one of {', '.join(MACHINE_ROLES)}, not {value!r:.40}")
    return str(value)


# -- join tokens ------------------------------------------------------------------------------------


def token_doc(token: Any, now: float) -> dict[str, Any]:
    return {"id": token.token_id, "role": token.role, "name": token.name or None, "created_at": token.created_at,
            "expires_at": token.expires_at, "expired": token.expires_at <= now, "used_at": token.used_at,
            "used_by": token.used_by or None}


async def create_token(ctx: Context, commit: Commit, doc: Any) -> dict[str, Any]:
    """A new join token for `role` (and a machine `name`, if given), living `ttl_s`: shown once."""
    fields = _fields(doc, ("role", "name", "ttl_s"), "invalid_token")
    role = _role(fields.get("role"), "invalid_token")
    name = fields.get("name") or ""
    if name and name_problem(name):
        raise AdminError(400, "invalid_token", str(name_problem(name)))
    ttl, longest = fields.get("ttl_s", ctx.timeouts.join_token_ttl_s), ctx.timeouts.join_token_ttl_max_s
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= longest:
        raise AdminError(400, "invalid_token", f"ttl_s must be seconds, more than 0 and at most {longest:.0f}")
    _trust(ctx)
    if not ctx.state().authorities:
        raise AdminError(503, "no_authority", "the cluster has no certificate authority yet; retry in a moment")
    token, now = new_token(), ctx.clock()
    command = trust_commands.token_add(hash_token(token), new_token_id(), role, now + float(ttl), now, name=name)
    result = await commit(command)
    if result.get("token_id") != command["token_id"]:
        raise AdminError(409, "token_secret_lost", "this request already made a token whose secret was only in the "
                         "answer that was lost; make another")
    log.info("join token %s made for a %s%s", command["token_id"], role, f" named {name}" if name else "")
    return Created({"id": command["token_id"], "token": token, "role": role, "name": name or None,
                    "expires_at": command["expires_at"], "ca_hash": ca_fingerprint(ctx)})


async def list_tokens(ctx: Context) -> dict[str, Any]:
    now = ctx.clock()
    found = sorted(ctx.state().join_tokens.values(), key=lambda t: (t.created_at, t.token_id))
    return {"tokens": [token_doc(t, now) for t in found]}


async def remove_token(ctx: Context, commit: Commit, token_id: str) -> dict[str, Any]:
    if not any(t.token_id == token_id for t in ctx.state().join_tokens.values()):
        raise AdminError(404, "token_not_found", f"no join token {token_id!r}: `llmgw ctl nodes token list` shows them")
    await commit(trust_commands.token_remove(token_id, ctx.clock()))
    return {"id": token_id, "removed": True}


# -- a machine's join ------------------------------------------------------------------------------


def _hosts(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > HOSTS_MAX or not all(
            isinstance(h, str) and 0 < len(h) <= 253 and h.isprintable() and " " not in h for h in value):
        raise AdminError(400, "invalid_join", f"hosts must be a list of at most {HOSTS_MAX} host names or addresses")
    return tuple(value)


async def join(ctx: Context, doc: Any) -> dict[str, Any]:
    """A machine's first certificate, for its join token and its certificate request. Any member
    answers (each holds the secret that unseals the authority's key); the `trust.issue` that uses
    the token goes through the leader, which refuses a token used, expired or unknown."""
    fields = _fields(doc, ("token", "role", "name", "csr", "hosts"), "invalid_join")
    role = _role(fields.get("role"), "invalid_join")
    name = fields.get("name")
    problem = name_problem(name)
    if problem:
        raise AdminError(400, "invalid_join", problem)
    token, csr = fields.get("token"), fields.get("csr")
    if not isinstance(token, str) or not isinstance(csr, str) or len(csr) > 20_000:
        raise AdminError(400, "invalid_join", "token and csr (PEM) are required")
    trust = _trust(ctx)
    state, now = ctx.state(), ctx.clock()
    th = hash_token(token)
    refusal = token_refusal(state.join_tokens.get(th), role, str(name), now)
    if refusal is not None and ctx.store.is_leader():  # before signing (a standby's state may lag: the commit checks)
        log.warning("join refused for %s %s: %s", role, name, refusal[1])
        raise AdminError(403 if refusal[0] == "invalid_join_token" else 400, *refusal)
    chain, who, aid = trust.sign(state, csr, role=role, name=str(name), hosts=_hosts(fields.get("hosts")), now=now)
    try:
        await ctx.store.submit(trust_commands.issue(role, str(name), who.serial, who.not_after, aid, now, token_hash=th),
                               through_leader=True)
    except commands.CommandError as e:
        log.warning("join refused for %s %s: %s", role, name, e.message)
        raise AdminError(403 if e.code == "invalid_join_token" else 400, e.code, e.message) from None
    log.info("%s %s joined: certificate serial %s until %.0f", role, name, who.serial, who.not_after)
    return Created({"role": role, "name": name, "serial": who.serial, "not_after": who.not_after,
                    "certificate": chain, "ca": bundle(ctx.state())})


async def renew(ctx: Context, role: str, name: str, csr: str) -> dict[str, Any]:
    """A new certificate for a machine that proved who it is (its stream): same role and name."""
    trust = _trust(ctx)
    state, now = ctx.state(), ctx.clock()
    old = state.machines.get(machine_id(role, name))
    hosts: tuple[str, ...] = ()
    chain, who, aid = trust.sign(state, csr, role=role, name=name, hosts=hosts, now=now)
    await ctx.store.submit(trust_commands.issue(role, name, who.serial, who.not_after, aid, now), through_leader=True)
    log.info("%s %s renewed its certificate: serial %s (was %s)", role, name, who.serial,
             old.serials[-1] if old else "none")
    return {"certificate": chain, "ca": bundle(ctx.state()), "serial": who.serial, "not_after": who.not_after}


# -- machines and revocation ------------------------------------------------------------------------


def machines_doc(ctx: Context) -> list[dict[str, Any]]:
    state, now = ctx.state(), ctx.clock()
    return [{"role": m.role, "name": m.name, "serial": m.serials[-1], "not_after": m.not_after,
             "expires_in_s": m.not_after - now, "issued_at": m.issued_at, "revoked": False}
            for _, m in sorted(state.machines.items())] + [
            {"role": r.role, "name": r.name, "serial": r.serial, "not_after": r.not_after,
             "expires_in_s": r.not_after - now, "issued_at": None, "revoked": True}
            for _, r in sorted(state.revoked.items())]


async def list_machines(ctx: Context) -> dict[str, Any]:
    return {"machines": machines_doc(ctx)}


async def revoke(ctx: Context, commit: Commit, role: str, name: str) -> dict[str, Any]:
    """Every certificate of the machine revoked: its streams end (within `trust_revoke_s`) and every
    member refuses it from then on."""
    _role(role, "invalid_role")
    if machine_id(role, name) not in ctx.state().machines:
        raise AdminError(404, "machine_not_found", f"no {role} named {name!r} holds a certificate of this cluster "
                         "(`llmgw ctl nodes certs` lists them)")
    try:
        result = await commit(trust_commands.revoke(role, name, ctx.clock()))
    except commands.CommandError as e:
        raise AdminError(404 if e.code == "not_found" else 400, e.code, e.message) from None
    log.warning("%s %s revoked: certificates %s", role, name, ", ".join(result.get("revoked", [])))
    return {"role": role, "name": name, "revoked": result.get("revoked", [])}


# -- the CA ------------------------------------------------------------------------------------------


async def ca_show(ctx: Context) -> dict[str, Any]:
    state = ctx.state()
    signing = active(state)
    trust = ctx.trust
    return {"ca_hash": ca_fingerprint(ctx) if state.authorities else None,
            "root_held_here": trust.holds_root() if trust is not None else False,
            "authorities": [{"id": aid, "active": aid == signing, "not_after": a.not_after, "added_at": a.added_at,
                             "subject": ca.load_cert(a.cert_pem).subject.rfc4514_string()}
                            for aid, a in sorted(state.authorities.items(), key=lambda kv: kv[1].added_at)],
            "bundle": bundle(state) if state.authorities else None}


async def ca_rotate(ctx: Context) -> dict[str, Any]:
    """A new intermediate from the root on this member; the old ones stay trusted until they expire."""
    trust = _trust(ctx)
    if not trust.holds_root():
        raise AdminError(409, "root_not_here", "this member does not hold the cluster's root key (STATE_DIR/ca/"
                         "root.key); run this against the control plane that made the CA (the first one)")
    aid = await trust.make_intermediate()
    log.warning("CA rotated: intermediate %s now signs; the others stay trusted until they expire", aid)
    return Created({"authority_id": aid, **(await ca_show(ctx))})
