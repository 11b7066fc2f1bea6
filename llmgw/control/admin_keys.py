"""The admin API's key routes: `GET /api/v1/keys` (every key by its public id, never a hash),
`POST /api/v1/keys` (a new key, shown once) and `DELETE /api/v1/keys/ID` (revoke).

A created key's secret is in the one answer only. A create retried with the same
`Idempotency-Key` gets that answer again from the member that gave it; from another
member the secret is gone, and the retry says so (409 `key_secret_lost`) with the id
to revoke, rather than hand out a key that was never stored.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from quart import Response

from llmgw.domain import commands, keys_commands
from llmgw.domain.keys import fields_problem, hash_key, is_key_id, name_problem, new_key
from llmgw.domain.state import ApiKey
from llmgw.errors import AdminError

if TYPE_CHECKING:
    from llmgw.control.admin import ControlDeps

log = logging.getLogger("llmgw.control.admin")

Route = Callable[..., Callable[[Callable[..., Awaitable[Response]]], Any]]
Commit = Callable[[dict[str, Any]], Awaitable[Any]]
BodyJson = Callable[[], Awaitable[Any]]
CREATE_FIELDS = ("name", "role", "models", "expires_at", "requests_per_min", "tokens_per_min")


def _ok(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def key_doc(key: ApiKey, now: float) -> dict[str, Any]:
    """A key as the admin API shows it: its id and settings, never its hash. Null: no limit / never."""
    return {"id": key.id, "name": key.name, "role": key.role, "created_at": key.created_at or None,
            "models": list(key.models), "expires_at": key.expires_at,
            "expired": key.expires_at is not None and key.expires_at <= now,
            "requests_per_min": key.requests_per_min, "tokens_per_min": key.tokens_per_min}


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


def register(route: Route, deps: ControlDeps, commit: Commit, body_json: BodyJson) -> None:
    """Add the key routes through the admin app's `route` (admin key, forwarding to the leader,
    idempotent writes, error shape); `commit` is its idempotent commit."""

    @route("/api/v1/keys", ["GET"])
    async def list_keys() -> Response:
        now = deps.clock()
        found = sorted(deps.store.snapshot().keys.values(), key=lambda k: (k.created_at, k.id))
        return _ok({"keys": [key_doc(k, now) for k in found]})

    @route("/api/v1/keys", ["POST"])
    async def create_key() -> Response:
        fields = parse_create(await body_json())
        secret = new_key()
        command = commands.add_key(hash_key(secret), fields["name"], fields["role"], deps.clock(),
                                   models=fields["models"], expires_at=fields.get("expires_at"),
                                   requests_per_min=fields.get("requests_per_min"),
                                   tokens_per_min=fields.get("tokens_per_min"))
        result = await commit(command)
        if result.get("id") != command["key_id"]:
            # The retry of a create another member (or this one before a restart) applied: that key's
            # secret was in the answer that was lost, and no member keeps secrets.
            raise AdminError(409, "key_secret_lost", f"this request already created key {result.get('id')}, but "
                             "its secret was only in the answer that was lost; revoke it (`llmgw ctl keys revoke "
                             f"{result.get('id')}`) and create another")
        state = deps.store.snapshot()
        stored = state.keys.get(command["key_hash"])
        doc = key_doc(stored, deps.clock()) if stored is not None else {"id": command["key_id"]}
        unknown = [m for m in fields["models"] if m not in state.models]
        log.info("key %s (%s, %s) created", command["key_id"], fields["role"], fields["name"])
        return _ok({**doc, "key": secret,
                    "warnings": [f"model {m!r} is not in the catalog (yet)" for m in unknown]}, 201)

    @route("/api/v1/keys/<path:key_id>", ["DELETE"])
    async def revoke_key(key_id: str) -> Response:
        if not is_key_id(key_id):
            raise AdminError(404, "key_not_found", f"{key_id!r} is not a key id: ids look like key_..., as "
                                                   "`llmgw ctl keys list` shows them")
        try:
            result = await commit(keys_commands.revoke_key(key_id, deps.clock()))
        except AdminError as e:
            if e.code == "last_admin_key":
                raise AdminError(409, e.code, e.message) from None
            raise
        if not result.get("revoked"):
            raise AdminError(404, "key_not_found", f"no key with id {key_id} (already revoked?)")
        log.info("key %s revoked", key_id)
        return _ok({"revoked": key_id})
