"""Trust between machines from the command line: join tokens (`nodes token create|list|remove`),
machines' certificates (`nodes certs`), revocation (`nodes revoke`), and the cluster's CA
(`ca show|rotate`). A token is printed once, with the command that joins a machine with it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import cyclopts

from llmgw.cli.ctl.keys import parse_expiry
from llmgw.cli.ctl.nodes import nodes_app
from llmgw.cli.ctl.render import cell, dig, table
from llmgw.cli.ctl.session import SessionParam, api_path


def register(app: cyclopts.App) -> None:
    app.command(ca_app)  # `nodes token|certs|revoke` join the nodes group when this module is imported (below)


token_app = cyclopts.App(name="token", help="One-time join tokens: a machine joins the cluster with one.")
nodes_app.command(token_app)
ca_app = cyclopts.App(name="ca", help="The cluster's certificate authority: show it, rotate its intermediate.")


@token_app.command(name="create")
def token_create(*, role: str = "agent", name: str | None = None, ttl: str = "1h", session: SessionParam) -> int:
    """Make a join token and print it, with the command that uses it: shown this once.

    Parameters
    ----------
    role
        What the machine will be: agent, gateway or control.
    name
        The one machine name the token is for (default: any name, chosen at the join).
    ttl
        How long the token can be used: a duration (15m, 1h, 2d; a month at most).
    """
    now = time.time()
    body: dict[str, Any] = {"role": role, "ttl_s": round(parse_expiry(ttl, now) - now, 3)}
    if name:
        body["name"] = name
    return session.show_answer("POST", api_path("trust", "tokens"), body=body, send_body=True,
                               render=lambda d: render_token(d, session.target().url))


@token_app.command(name="list")
def token_list(*, session: SessionParam) -> int:
    """The join tokens that can still be used (never the tokens themselves)."""
    return session.show_answer("GET", api_path("trust", "tokens"), render=render_tokens)


token_app.default(token_list)


@token_app.command(name="remove")
def token_remove(token_id: str, /, *, session: SessionParam) -> int:
    """Remove a join token before it is used.

    Parameters
    ----------
    token_id
        The token's id (tok_...), as `llmgw ctl nodes token list` shows it.
    """
    return session.show_answer("DELETE", api_path("trust", "tokens", token_id),
                               render=lambda d: f"removed join token {cell(dig(d, 'id'))}")


@nodes_app.command(name="certs")
def nodes_certs(*, session: SessionParam) -> int:
    """Every machine's certificate (agents, gateways, control planes): serial, expiry, revoked."""
    return session.show_answer("GET", api_path("trust", "machines"), render=render_machines)


@nodes_app.command(name="revoke")
def nodes_revoke(name: str, /, *, role: str = "agent", session: SessionParam) -> int:
    """Revoke a machine's certificates: its streams end within seconds and every member refuses it
    from then on; an agent's engines are treated as a lost node's. It can join again only with a new
    token.

    Parameters
    ----------
    name
        The machine's name, as `llmgw ctl nodes certs` lists it.
    role
        agent (the default), gateway or control.
    """
    return session.show_answer("POST", api_path("trust", "machines", role, name, "revoke"),
                               render=lambda d: f"revoked {role} {name}: certificates "
                                                f"{', '.join(str(s) for s in dig(d, 'revoked') or []) or '-'}")


@ca_app.command(name="show")
def ca_show(*, session: SessionParam) -> int:
    """The cluster's authorities (the active one signs), and the hash a joining machine pins."""
    return session.show_answer("GET", api_path("trust", "ca"), render=render_ca)


ca_app.default(ca_show)


@ca_app.command(name="rotate")
def ca_rotate(*, session: SessionParam) -> int:
    """A new intermediate from the root (ask the control plane that holds it, the first one); the
    old ones stay trusted until they expire, and machines renew onto the new one."""
    return session.show_answer("POST", api_path("trust", "ca", "rotate"), render=render_ca)


# --- rendering ------------------------------------------------------------------------------------


def _when(t: Any) -> str | None:
    if not isinstance(t, (int, float)):
        return None
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render_token(doc: Mapping[str, Any], url: str) -> str:
    role, token, ca_hash = cell(doc.get("role")), cell(doc.get("token")), cell(doc.get("ca_hash"))
    named = f" --name {doc['name']}" if doc.get("name") else ""
    where = f"--node {doc['name']}" if doc.get("name") and role == "agent" else ""
    return "\n".join([
        f"join token {cell(doc.get('id'))} for a {role}{named}, usable once until {_when(doc.get('expires_at'))}:",
        "",
        f"  {token}",
        "",
        "it is shown this once. On the machine:",
        f"  llmgw {role} --control {url} --join-token {token} --ca-hash {ca_hash} {where}".rstrip() + " ...",
    ])


def render_tokens(doc: Mapping[str, Any]) -> str:
    tokens = dig(doc, "tokens")
    if not isinstance(tokens, list) or not tokens:
        return "no join tokens can be used now: `llmgw ctl nodes token create --role agent` makes one"
    return table(["ID", "ROLE", "NAME", "EXPIRES", "USED BY"],
                 [[t.get("id"), t.get("role"), t.get("name"), _when(t.get("expires_at")), t.get("used_by")]
                  for t in tokens if isinstance(t, Mapping)])


def render_machines(doc: Mapping[str, Any]) -> str:
    machines = dig(doc, "machines")
    if not isinstance(machines, list) or not machines:
        return "no machine holds a certificate of this cluster yet"
    return table(["ROLE", "NAME", "SERIAL", "NOT AFTER", "REVOKED"],
                 [[m.get("role"), m.get("name"), str(m.get("serial"))[:16], _when(m.get("not_after")),
                   "revoked" if m.get("revoked") else "no"] for m in machines if isinstance(m, Mapping)])


def render_ca(doc: Mapping[str, Any]) -> str:
    authorities = dig(doc, "authorities")
    lines = [f"CA hash (what a joining machine pins): {cell(doc.get('ca_hash'))}",
             f"root key held by the member asked: {'yes' if doc.get('root_held_here') else 'no'}"]
    if isinstance(authorities, list) and authorities:
        lines += ["", table(["AUTHORITY", "ACTIVE", "NOT AFTER", "SUBJECT"],
                            [[str(a.get("id"))[:16], "signs" if a.get("active") else "trusted",
                              _when(a.get("not_after")), a.get("subject")]
                             for a in authorities if isinstance(a, Mapping)])]
    return "\n".join(lines)
