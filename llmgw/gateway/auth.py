"""Client keys on `/v1`: who may ask (a client key of the table, not expired), for which models
(its scope), and how often (its requests/min and tokens/min, counted in this gateway process).

The check reads the headers only, so an invalid key is refused before the body is read. Its
cost does not grow with the number of keys or models: one SHA-256 of the key, one dictionary
lookup by hash (no secret is compared, so nothing leaks by timing), a set lookup for a scope.
Limits are token buckets per key id that refill continuously (the whole minute's allowance
at most): a request takes one request at admission; tokens are charged after the answer,
from the engine's usage, so a key in debt is refused until the debt has refilled.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone

import trio

from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.priority import HEADER, RANK, requested
from llmgw.domain.state import ApiKey, ClusterState
from llmgw.errors import OpenAIError
from llmgw.gateway.checks import bearer
from llmgw.gateway.names import Order, candidates

__all__ = ["KeyCheck"]

_BEARER = [(b"www-authenticate", b"Bearer")]
_PER_MIN = 60.0


class _Bucket:
    """A continuously refilled allowance of `capacity` per minute; `level` may go below 0 (a debt)."""

    __slots__ = ("level", "at")

    def __init__(self, capacity: int, now: float) -> None:
        self.level = float(capacity)
        self.at = now

    def refill(self, capacity: int, now: float) -> None:
        self.level = min(float(capacity), self.level + (now - self.at) * capacity / _PER_MIN)
        self.at = now

    def wait_for(self, needed: float, capacity: int) -> float:
        """Seconds until the level reaches `needed` (0: it has)."""
        return max(0.0, (needed - self.level) * _PER_MIN / capacity)


class KeyCheck:
    """One gateway process's key check and limit counters. `wall` is unix time (expiry);
    `now` a monotonic clock for the buckets (trio's, so tests run them on a MockClock)."""

    def __init__(self, wall: Callable[[], float] = time.time, now: Callable[[], float] = trio.current_time) -> None:
        self.wall = wall
        self.now = now
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}

    def admit(self, headers: list[tuple[bytes, bytes]], snap: ClusterState) -> ApiKey:
        """The client key of the request, admitted (one request counted); else the refusal:
        401 `invalid_api_key` (none, unknown, or an admin key), 401 `key_expired`, 429 `rate_limited`."""
        key = bearer(headers)
        if not key:
            raise OpenAIError(401, "invalid_api_key", "no API key: send it as 'Authorization: Bearer KEY'",
                              headers=_BEARER)
        found = snap.keys.get(hash_key(key))
        if found is None or found.role != "client":
            # An admin key is never accepted here, and is refused in the same words as an unknown key.
            raise OpenAIError(401, "invalid_api_key", "incorrect API key", headers=_BEARER)
        if found.expires_at is not None and found.expires_at <= self.wall():
            when = datetime.fromtimestamp(found.expires_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            raise OpenAIError(401, "key_expired", f"this API key ({found.id}) expired at {when}; ask for a new one",
                              headers=_BEARER, should_retry=False)
        if found.requests_per_min is not None or found.tokens_per_min is not None:
            self._take(found)
        return found

    def _take(self, key: ApiKey) -> None:
        now = self.now()
        tpm = key.tokens_per_min
        if tpm is not None:
            tokens = self._tokens.get(key.id)
            if tokens is not None:
                tokens.refill(tpm, now)
                if tokens.level <= 0:  # in debt from earlier answers: refused until it refills
                    self._refuse(key, f"{tpm} tokens per minute", tokens.wait_for(1.0, tpm))
        rpm = key.requests_per_min
        if rpm is not None:
            requests = self._requests.get(key.id)
            if requests is None:
                requests = self._requests[key.id] = _Bucket(rpm, now)
            else:
                requests.refill(rpm, now)
            if requests.level < 1.0:
                self._refuse(key, f"{rpm} requests per minute", requests.wait_for(1.0, rpm))
            requests.level -= 1.0

    @staticmethod
    def _refuse(key: ApiKey, limit: str, wait_s: float) -> None:
        wait_s = round(wait_s, 6)  # 0.05 * 20 is 1.0000000000000009: not 2 s
        seconds = max(1, math.ceil(wait_s))
        raise OpenAIError(
            429, "rate_limited",
            f"rate limit reached for key {key.id}: {limit} (per gateway); retry in {seconds} s",
            headers=[(b"retry-after", str(seconds).encode()),
                     (b"retry-after-ms", str(max(1, math.ceil(wait_s * 1000))).encode())],
        )

    def charge(self, key: ApiKey, tokens_in: int | None, tokens_out: int | None) -> None:
        """Count an answer's tokens (as the engine reported them) against the key's tokens/min."""
        tpm = key.tokens_per_min
        if tpm is None or (tokens_in is None and tokens_out is None):
            return
        now = self.now()
        bucket = self._tokens.get(key.id)
        if bucket is None:
            bucket = self._tokens[key.id] = _Bucket(tpm, now)
        else:
            bucket.refill(tpm, now)
        bucket.level -= (tokens_in or 0) + (tokens_out or 0)

    @staticmethod
    def priority(key: ApiKey, headers: list[tuple[bytes, bytes]]) -> int:
        """The request's priority class (its rank): the key's, or the lower one its `x-llmgw-priority` header
        asks for; 403 `priority_not_allowed` for a higher one, 400 `invalid_priority` for an unknown one."""
        asked = None
        for name, value in headers:
            if name == HEADER:
                asked = value.decode("latin-1").strip().lower()
                break
        if asked is None:
            return RANK.get(key.priority, RANK["default"])
        try:
            return RANK[requested(key.priority, asked)]
        except PermissionError as refused:
            raise OpenAIError(403, "priority_not_allowed", str(refused), should_retry=False) from None
        except ValueError as unknown:
            raise OpenAIError(400, "invalid_priority", str(unknown)) from None

    @staticmethod
    def model(key: ApiKey, snap: ClusterState, name: str) -> ModelDef:
        """The catalog's model `name`, if this key may use it. A model out of the key's scope is
        answered as a missing one, in the same words, so a scoped key cannot map the catalog."""
        scope = key.scope
        model = snap.models.get(name) if scope is None or name in scope else None
        if model is None:
            raise _not_found(name, scope)
        return model

    @staticmethod
    def models(key: ApiKey, snap: ClusterState, name: str, groups: Mapping[str, tuple[str, ...]],
               order: Order) -> list[ModelDef]:
        """The models that may serve a request for `name` (a model or an alias) by this key, in the order
        they are tried (gateway/names.py); refused as `model` refuses when there is none."""
        found = candidates(snap.models, groups, name, key.scope, order)
        if not found:
            raise _not_found(name, key.scope)
        return found

    @staticmethod
    def visible(key: ApiKey, names: Iterable[str]) -> list[str]:
        """The model names `GET /v1/models` lists to this key: its scope's, or all (with the aliases it
        may use: `names.visible_names`)."""
        scope = key.scope
        return sorted(names) if scope is None else sorted(n for n in names if n in scope)


def _not_found(name: str, scope: frozenset[str] | None) -> OpenAIError:
    words = "does not exist" if scope is None else "does not exist or this key may not use it"
    return OpenAIError(404, "model_not_found", f"the model {name!r} {words}", param="model")
