"""The `keys` commands: list the cluster's API keys (by public id), create one (its secret is
printed once, now or never), revoke one; a client key's scope, expiry and per-minute limits."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import CtlError
from llmgw.cli.ctl.render import cell, clean, dig, table
from llmgw.cli.ctl.session import SessionParam, api_path


def register(app: cyclopts.App) -> None:
    app.command(keys_app)


keys_app = cyclopts.App(name="keys", help="API keys: list, create (shown once), revoke.")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])\Z")


@keys_app.command(name="list")
def keys_list(*, session: SessionParam) -> int:
    """Every key: id, name, role, models, expiry, limits (never a secret or a hash)."""
    return session.show_answer("GET", api_path("keys"), render=render_keys)


keys_app.default(keys_list)  # `ctl keys` alone does the same


@keys_app.command(name="create")
def keys_create(
    name: str,
    /,
    *,
    role: str = "client",
    model: Annotated[tuple[str, ...], Parameter(name="--model", negative="")] = (),
    expires: str | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    priority: str | None = None,
    session: SessionParam,
) -> int:
    """Create a key and print it: it is shown this once, never again.

    Parameters
    ----------
    name
        Who or what the key is for (shown in lists; not secret).
    role
        client (the /v1 API), admin (the admin API, ctl and the console; never accepted on /v1) or
        viewer (signs in to the console and sees every page, but cannot act; nothing else).
    model
        A model this client key may use (repeat for several); none: every model.
    expires
        When the key stops working: a duration from now (90d, 12h, 30m) or a UTC date or time
        (2026-01-31, 2026-01-31T12:00:00Z); none: never.
    rpm
        Requests per minute this client key may make, per gateway process.
    tpm
        Tokens (prompt + completion, as the engine counts them) per minute, per gateway process.
    priority
        The class of this client key's requests when a replica's slots are full: system, interactive,
        default (when none is given) or bulk, highest first; a request may ask for a lower one with the
        `x-llmgw-priority` header, never a higher one.
    """
    body: dict[str, Any] = {"name": name, "role": role}
    if model:
        body["models"] = list(model)
    if expires is not None:
        body["expires_at"] = parse_expiry(expires, time.time())
    if rpm is not None:
        body["requests_per_min"] = rpm
    if tpm is not None:
        body["tokens_per_min"] = tpm
    if priority is not None:
        body["priority"] = priority
    return session.show_answer("POST", api_path("keys"), body=body, send_body=True, render=render_created)


@keys_app.command(name="revoke")
def keys_revoke(key_id: str, /, *, session: SessionParam) -> int:
    """Revoke a key: every gateway refuses it within about a second.

    Parameters
    ----------
    key_id
        The key's id (key_...), as `llmgw ctl keys list` shows it.
    """
    return session.show_answer("DELETE", api_path("keys", key_id),
                               render=lambda d: f"revoked {cell(dig(d, 'revoked'))}")


def parse_expiry(text: str, now: float) -> float:
    """Unix time from a duration (`90d`) counted from `now`, or a UTC date/time (ISO 8601)."""
    duration = _DURATION.match(text.strip())
    if duration:
        return now + float(duration.group(1)) * _UNITS[duration.group(2)]
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CtlError(f"--expires {text!r}: give a duration (90d, 12h, 30m) or a date (2026-01-31, "
                       "2026-01-31T12:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    if when.timestamp() <= now:
        raise CtlError(f"--expires {text!r} is in the past")
    return when.timestamp()


# --- rendering: pure functions of the JSON; unknown or none is `-` ---------------------------------


def _when(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _expires(k: Mapping[str, Any]) -> str | None:
    when = _when(k.get("expires_at"))
    return f"{when} (expired)" if when and k.get("expired") else when


def _models(value: Any) -> str:
    return ", ".join(clean(str(m)) for m in value) if isinstance(value, list) and value else "all"


def render_keys(doc: Mapping[str, Any]) -> str:
    found = dig(doc, "keys")
    if not isinstance(found, list) or not found:
        return "no keys (create one: `llmgw ctl keys create NAME`)"
    rows = [[k.get("id"), k.get("name"), k.get("role"),
             _models(k.get("models")) if k.get("role") == "client" else None, _expires(k),
             k.get("requests_per_min"), k.get("tokens_per_min"),
             k.get("priority") if k.get("role") == "client" else None, _when(k.get("created_at"))]
            for k in found if isinstance(k, Mapping)]
    return table(["ID", "NAME", "ROLE", "MODELS", "EXPIRES", "REQ/MIN", "TOKENS/MIN", "PRIORITY", "CREATED"], rows)


def render_created(doc: Mapping[str, Any]) -> str:
    lines = [f"created {cell(doc.get('role'))} key {cell(doc.get('id'))} ({cell(doc.get('name'))}):", "",
             f"  {cell(doc.get('key'))}", "",
             "Store it now: it is shown this once, and the cluster keeps only its hash."]
    warnings = doc.get("warnings")
    if isinstance(warnings, list):
        lines += [f"warning: {clean(str(w))}" for w in warnings]
    return "\n".join(lines)
