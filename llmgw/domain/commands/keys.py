"""The key commands: `key.add` (a key's hash, id, role, name, scope, expiry, limits) and
`key.revoke` (by public id); their builders, stateless checks and changes.

Fields added to `key.add` since its first version are optional: a command logged before them
replays to the key it made then (unscoped, unlimited).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain import levels
from llmgw.domain.commands.core import CommandError, make, readonly
from llmgw.domain.keys import fields_problem, is_key_id, new_key_id
from llmgw.domain.state import ApiKey, ClusterState

# What a retried key.add carries afresh (a new random key and id): left out of its fingerprint, so
# the retry of a create is known as the same request (`commands.digest`).
FRESH_FIELDS = ("key_hash", "key_id")


def add_key(key_hash: str, name: str, role: str, at: float, *, key_id: str | None = None,
            models: tuple[str, ...] | list[str] = (), expires_at: float | None = None,
            requests_per_min: int | None = None, tokens_per_min: int | None = None,
            priority: str = "default") -> dict[str, Any]:
    """The `key.add` command; a fresh random id unless `key_id` is given. Scope, expiry,
    limits and priority are written only when set, so a plain key's command is the one older members read."""
    extra: dict[str, Any] = {}
    if models:
        extra["models"] = sorted(set(models))
    for field, value in (("expires_at", expires_at), ("requests_per_min", requests_per_min),
                         ("tokens_per_min", tokens_per_min)):
        if value is not None:
            extra[field] = value
    command = make("key.add", at, key_hash=key_hash, key_id=key_id or new_key_id(), name=name, role=role, **extra)
    if priority != "default":  # 0.2.0's field: an older member would drop it, so it needs that store level
        command = levels.stamp({**command, "priority": priority}, 2)
    return command


def revoke_key(key_id: str, at: float) -> dict[str, Any]:
    return make("key.revoke", at, key_id=key_id)


def check_add(c: dict[str, Any]) -> None:
    key_hash, key_id = c.get("key_hash"), c.get("key_id", "")
    if not isinstance(key_hash, str) or not key_hash.startswith("sha256:"):
        raise CommandError("invalid_key", "key_hash must be a sha256: hash")
    if not isinstance(key_id, str) or (key_id and not is_key_id(key_id)):
        raise CommandError("invalid_key", "key_id must be key_ and letters or digits")
    problem = fields_problem(c)
    if problem is not None:
        raise CommandError("invalid_key", problem)


def apply_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Adds the key; a hash already stored is left as it is (`added` false, its id given).

    An id already in use by another key is refused: never by chance (71 random bits), so a
    command built by hand."""
    key_hash, key_id = c["key_hash"], c.get("key_id", "")
    if key_id and key_hash not in s.keys and find(s, key_id) is not None:
        raise CommandError("key_id_taken", f"the key id {key_id} is already in use")
    old = s.keys.get(key_hash)
    if old is not None:
        return s, {"added": False, "id": old.id}
    key = ApiKey(key_hash, c["name"], c["role"], at, key_id=key_id,
                 models=tuple(c.get("models", ())), expires_at=_float(c.get("expires_at")),
                 requests_per_min=c.get("requests_per_min"), tokens_per_min=c.get("tokens_per_min"),
                 priority=c.get("priority", "default"))
    return replace(s, keys=readonly(s.keys | {key_hash: key})), {"added": True, "id": key.id}


def check_revoke(c: dict[str, Any]) -> None:
    key_id = c.get("key_id")
    if not isinstance(key_id, str) or not is_key_id(key_id):
        raise CommandError("invalid_key", "key_id must be a key's id (key_...), as `ctl keys list` shows it")


def apply_revoke(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Removes the key; an id no longer held is no change (`revoked` false), so a retry is harmless.

    The cluster's last admin key is refused: nobody could administer the cluster, this
    revocation included, ever again."""
    key_id = c["key_id"]
    found = find(s, key_id)
    if found is not None and found.role == "admin" and sum(k.role == "admin" for k in s.keys.values()) == 1:
        raise CommandError("last_admin_key", f"{key_id} is the cluster's last admin key: create another admin key "
                           "(`llmgw ctl keys create NAME --role admin`) before revoking this one")
    if found is None:
        return s, {"revoked": False, "id": key_id}
    keys = {h: k for h, k in s.keys.items() if h != found.key_hash}
    return replace(s, keys=readonly(keys)), {"revoked": True, "id": found.id}


def find(s: ClusterState, key_id: str) -> ApiKey | None:
    """The key with this public id (a scan: an admin's request, never the gateway's hot path)."""
    for key in s.keys.values():
        if key.id == key_id:
            return key
    return None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
