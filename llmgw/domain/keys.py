"""API keys: only their hashes are stored; the clear key is shown once, at creation."""

from __future__ import annotations

import hashlib

KEY_ROLES = ("admin", "client")


def hash_key(key: str) -> str:
    # Keys are 256-bit random tokens, so a fast unsalted hash is not brute-forceable.
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()

