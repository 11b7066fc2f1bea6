"""API keys: made here (random, prefixed), stored only as hashes, named by a short public id.
Owns the key's shape and the checks a key's scope, expiry and limits must pass (docs/api.md, "Keys").

The clear key is shown once, at creation; the cluster keeps `sha256:HEX` of it. A
plain (unsalted, unpeppered) SHA-256 is enough for keys made here: 190 random bits
cannot be guessed from their hash, and every gateway must be able to check a key
from the table it follows, so a pepper would travel with the hashes anyway. The
public id (`key_...`) is random too, never derived from the key or its hash, so a
list or a request log that shows it tells nothing of the key.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from typing import Any

from llmgw.domain.priority import DEFAULT, class_problem

KEY_ROLES = ("admin", "client", "viewer")  # viewer: signs in to the console, sees, cannot act
KEY_PREFIX = "sk-llmgw-"  # a client key; found by secret scanners, told apart from other vendors' keys
ID_PREFIX = "key_"
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # base62: one word to copy
KEY_CHARS = 32  # 32 base62 characters: 190 random bits
ID_CHARS = 12  # 71 random bits: unique among any number of keys a cluster will hold
NAME_MAX_CHARS = 200
SCOPE_MAX_MODELS = 1000
LIMIT_MAX = 10**12  # per minute; larger is a typo, not a limit


def new_key() -> str:
    """A fresh clear key: `sk-llmgw-` and 32 base62 characters from the system's CSPRNG."""
    return KEY_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(KEY_CHARS))


def new_key_id() -> str:
    """A fresh public id: `key_` and 12 base62 characters."""
    return ID_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(ID_CHARS))


def hash_key(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def legacy_key_id(key_hash: str) -> str:
    """The id of a key stored before keys had ids (the seeded ones of older clusters): derived
    from its hash, so every member and gateway names it alike. It says nothing of a random key;
    of a weak key chosen by hand (`LLMGW_CLIENT_KEY=secret`) it says what its hash does."""
    return ID_PREFIX + hashlib.sha256(f"llmgw key id\n{key_hash}".encode()).hexdigest()[:ID_CHARS]


def is_key_id(text: str) -> bool:
    return text.startswith(ID_PREFIX) and 0 < len(text) - len(ID_PREFIX) <= 64 and text[len(ID_PREFIX):].isalnum()


def _limit_problem(field: str, value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is not int or not 0 < value <= LIMIT_MAX:
        return f"{field} must be a whole number from 1 to {LIMIT_MAX} (or null: no limit), not {value!r:.40}"
    return None


def name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name or len(name) > NAME_MAX_CHARS or not name.isprintable():
        return f"name must be 1 to {NAME_MAX_CHARS} printable characters (who or what the key is for)"
    return None


def fields_problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with a key's fields (a command's, or a create request's), in words; None: nothing.

    `role`, `name`; and for client keys only: `models` (a list of model names, empty = every
    model), `expires_at` (unix seconds or null), `requests_per_min`, `tokens_per_min` (null:
    no limit), `priority` (a class of llmgw/domain/priority.py; absent: default). An admin or viewer key is never accepted on `/v1`, so a scope or limit on one means nothing."""
    role, name = doc.get("role"), doc.get("name")
    if role not in KEY_ROLES:
        return f"role must be one of {', '.join(KEY_ROLES)}, not {role!r:.40}"
    if not isinstance(name, str):
        # Any string, as before: a command logged by an older llmgw must replay. New names are
        # checked by `name_problem` where they are asked for.
        return "a key's name must be a string"
    models = doc.get("models", [])
    if not isinstance(models, (list, tuple)) or len(models) > SCOPE_MAX_MODELS or not all(
            isinstance(m, str) and m for m in models):
        return f"models must be a list of at most {SCOPE_MAX_MODELS} model names (empty: every model)"
    expires = doc.get("expires_at")
    if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float))
                                or not math.isfinite(expires) or expires <= 0):
        return f"expires_at must be a unix time in seconds (or null: never), not {expires!r:.40}"
    for field in ("requests_per_min", "tokens_per_min"):
        problem = _limit_problem(field, doc.get(field))
        if problem:
            return problem
    priority = doc.get("priority", DEFAULT)
    if class_problem(priority):
        return class_problem(priority)
    if role in ("admin", "viewer"):
        given = [f for f in ("models", "expires_at", "requests_per_min", "tokens_per_min") if doc.get(f)]
        given += ["priority"] if priority != DEFAULT else []
        if given:
            return (f"{', '.join(given)}: only client keys take a scope, an expiry, limits or a priority (an {role} "
                    "key is never accepted on /v1)")
    return None
