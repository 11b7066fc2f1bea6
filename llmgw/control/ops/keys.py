"""API keys: list (by public id, never a hash), create (the secret shown once), revoke.

A created key's secret is in the one answer only. A create retried with the same idempotency id
gets that answer again from the member that gave it; from another member the secret is gone, and
the retry says so (409 `key_secret_lost`) with the id to revoke, rather than hand out a key that
was never stored.
"""

from __future__ import annotations

import logging
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit, Created
from llmgw.domain import commands
from llmgw.domain.keys import fields_problem, hash_key, is_key_id, name_problem, new_key
from llmgw.domain.state import ApiKey
from llmgw.errors import AdminError

log = logging.getLogger("llmgw.control.admin")

CREATE_FIELDS = ("name", "role", "models", "expires_at", "requests_per_min", "tokens_per_min", "priority")


def key_doc(key: ApiKey, now: float) -> dict[str, Any]:
    """A key as the admin API shows it: its id and settings, never its hash. Null: no limit / never."""
    return {"id": key.id, "name": key.name, "role": key.role, "created_at": key.created_at or None,
            "models": list(key.models), "expires_at": key.expires_at,
            "expired": key.expires_at is not None and key.expires_at <= now,
            "requests_per_min": key.requests_per_min, "tokens_per_min": key.tokens_per_min,
            "priority": key.priority}


def parse_create(doc: Any) -> dict[str, Any]:
    """A create request's fields (defaults filled), or 400 `invalid_key` naming what is wrong."""
    if not isinstance(doc, dict):
        raise AdminError(400, "invalid_key", "send a JSON object: {\"name\": ..., \"role\": \"client\", ...}")
    unknown = sorted(set(doc) - set(CREATE_FIELDS))
    if unknown:
        raise AdminError(400, "invalid_key", f"unknown field {unknown[0]!r}; a key takes {', '.join(CREATE_FIELDS)}")
    fields = {"role": "client", "models": [], **doc}
    problem = name_problem(fields.get("name")) or fields_problem(fields)
    if problem:
        raise AdminError(400, "invalid_key", problem)
    return fields


async def list_keys(ctx: Context) -> dict[str, Any]:
    now = ctx.clock()
    found = sorted(ctx.state().keys.values(), key=lambda k: (k.created_at, k.id))
    return {"keys": [key_doc(k, now) for k in found]}


async def create(ctx: Context, commit: Commit, doc: Any) -> dict[str, Any]:
    """A new key: its settings and, this once, its secret."""
    fields = parse_create(doc)
    secret = new_key()
    command = commands.add_key(hash_key(secret), fields["name"], fields["role"], ctx.clock(),
                               models=fields["models"], expires_at=fields.get("expires_at"),
                               requests_per_min=fields.get("requests_per_min"),
                               tokens_per_min=fields.get("tokens_per_min"),
                               priority=fields.get("priority", "default"))
    result = await commit(command)
    if result.get("id") != command["key_id"]:
        # The retry of a create another member (or this one before a restart) applied: that key's
        # secret was in the answer that was lost, and no member keeps secrets.
        raise AdminError(409, "key_secret_lost", f"this request already created key {result.get('id')}, but "
                         "its secret was only in the answer that was lost; revoke it (`llmgw ctl keys revoke "
                         f"{result.get('id')}`) and create another")
    state = ctx.state()
    stored = state.keys.get(command["key_hash"])
    shown = key_doc(stored, ctx.clock()) if stored is not None else {"id": command["key_id"]}
    aliases = {a for model in state.models.values() for a in model.aliases}  # a scope may name an alias too
    unknown = [m for m in fields["models"] if m not in state.models and m not in aliases]
    log.info("key %s (%s, %s) created", command["key_id"], fields["role"], fields["name"])
    return Created({**shown, "key": secret, "warnings": [f"model {m!r} is not in the catalog (yet)" for m in unknown]})


async def revoke(ctx: Context, commit: Commit, key_id: str) -> dict[str, Any]:
    if not is_key_id(key_id):
        raise AdminError(404, "key_not_found", f"{key_id!r} is not a key id: ids look like key_..., as "
                                               "`llmgw ctl keys list` shows them")
    try:
        result = await commit(commands.revoke_key(key_id, ctx.clock()))
    except AdminError as e:
        if e.code == "last_admin_key":
            raise AdminError(409, e.code, e.message) from None
        raise
    if not result.get("revoked"):
        raise AdminError(404, "key_not_found", f"no key with id {key_id} (already revoked?)")
    log.info("key %s revoked", key_id)
    return {"revoked": key_id}
