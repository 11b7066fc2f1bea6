"""Versioned commands and the deterministic `apply(state, command) -> (state, result)`.

A command is a JSON object `{"v": 1, "op": ..., "at": <unix time>, ...}`; time
arrives inside it, never from a clock here, so every replica computes the same
state. New operations are added to `_OPS`; the Raft method table never changes.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, TypeVar

from llmgw.domain.frozen import freeze
from llmgw.domain.keys import KEY_ROLES
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.settings import SettingError, effective, validate
from llmgw.domain.state import ApiKey, ClusterState, ModelHealth, Placement

VERSION = 1


class CommandError(ValueError):
    """A command that cannot apply to this state; the state stays as it was."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def encode(command: dict[str, Any]) -> bytes:
    return json.dumps(command, separators=(",", ":"), sort_keys=True).encode()


def decode(blob: bytes) -> dict[str, Any]:
    try:
        command = json.loads(blob)
    except ValueError:
        raise CommandError("bad_command", "a command is a JSON object") from None
    # `type(...) is int`: JSON true and 1.0 equal 1 in Python but are not version 1.
    if not isinstance(command, dict) or type(command.get("v")) is not int or command["v"] != VERSION:
        raise CommandError("bad_command", f"unsupported command version: {command!r:.80}")
    return command


def _name(c: dict[str, Any], key: str) -> str:
    """A string field of a command; anything else is refused, never a TypeError inside apply."""
    value = c.get(key)
    if not isinstance(value, str) or not value:
        raise CommandError("bad_command", f"{key} must be a non-empty string")
    return value


def make(op: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "op": op, "at": at, **fields}


# --- constructors, so callers never spell op names by hand ------------------


def put_model(model: ModelDef, at: float) -> dict[str, Any]:
    return make("model.put", at, model=model.to_doc())


def remove_model(name: str, at: float) -> dict[str, Any]:
    return make("model.remove", at, name=name)


def retry_model(name: str, at: float) -> dict[str, Any]:
    return make("model.retry", at, name=name)


def put_setting(key: str, value: Any, at: float) -> dict[str, Any]:
    return make("setting.put", at, key=key, value=value)


def add_key(key_hash: str, name: str, role: str, at: float) -> dict[str, Any]:
    return make("key.add", at, key_hash=key_hash, name=name, role=role)


def add_placement(model: str, node: str, gpus: tuple[int, ...], launch_hash: str, at: float) -> dict[str, Any]:
    return make("placement.add", at, model=model, node=node, gpus=list(gpus), launch_hash=launch_hash)


def remove_placement(replica_id: str, at: float, *, reason: str = "") -> dict[str, Any]:
    return make("placement.remove", at, replica_id=replica_id, reason=reason)


def start_failed(model: str, replica_id: str, error: str, at: float) -> dict[str, Any]:
    return make("health.start_failed", at, model=model, replica_id=replica_id, error=error)


def became_ready(model: str, at: float) -> dict[str, Any]:
    return make("health.ready", at, model=model)


# --- apply ------------------------------------------------------------------

_V = TypeVar("_V")


def _readonly(mapping: dict[str, _V]) -> MappingProxyType[str, _V]:
    """A dict built here and kept by no one, handed to the next state read-only.

    Copy a state's mapping with `.copy()` or `|`, not `{**m}` or `dict(m)`: those take
    a slow path on a `MappingProxyType`, ten times slower than on a dict."""
    return MappingProxyType(mapping)


def apply(state: ClusterState, command: dict[str, Any]) -> tuple[ClusterState, Any]:
    """Apply one command. Raises CommandError (state unchanged) when it does not apply."""
    op = command.get("op")
    handler = _OPS.get(op) if isinstance(op, str) else None
    if handler is None:
        raise CommandError("bad_command", f"unknown operation {op!r}")
    at = command.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise CommandError("bad_command", "command has no valid time")
    new_state, result = handler(state, command, float(at))
    return replace(new_state, revision=state.revision + 1), result


def _model_put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    try:
        model = ModelDef.from_doc(c.get("model"))
    except DefinitionError as e:
        raise CommandError("invalid_model", str(e)) from None
    health = s.health.copy()
    old = s.models.get(model.name)
    if old is not None and old.launch_hash() != model.launch_hash():
        health.pop(model.name, None)  # a new source or profile un-parks
    models = s.models | {model.name: model}
    return replace(s, models=_readonly(models), health=_readonly(health)), {"created": old is None}


def _model_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    name = _name(c, "name")
    if name not in s.models:
        raise CommandError("model_not_found", f"no model named {name!r}")
    models = {k: v for k, v in s.models.items() if k != name}
    health = {k: v for k, v in s.health.items() if k != name}
    # Placements stay until the reconciler stops their replicas and removes them.
    return replace(s, models=_readonly(models), health=_readonly(health)), {"removed": name}


def _model_retry(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    name = _name(c, "name")
    if name not in s.models:
        raise CommandError("model_not_found", f"no model named {name!r}")
    health = {k: v for k, v in s.health.items() if k != name}
    return replace(s, health=_readonly(health)), {"retried": name}


def _setting_put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    key, value = c.get("key"), c.get("value")
    if not isinstance(key, str):
        raise CommandError("invalid_setting", "setting key must be a string")
    try:
        validate(key, value)
    except SettingError as e:
        raise CommandError("invalid_setting", str(e)) from None
    return replace(s, settings=_readonly(s.settings | {key: freeze(value)})), {"key": key, "value": value}


def _key_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    key_hash, name, role = c.get("key_hash"), c.get("name"), c.get("role")
    if not isinstance(key_hash, str) or not key_hash.startswith("sha256:"):
        raise CommandError("invalid_key", "key_hash must be a sha256: hash")
    if not isinstance(name, str):
        raise CommandError("invalid_key", "a key's name must be a string")
    if role not in KEY_ROLES:
        raise CommandError("invalid_key", f"role must be one of {', '.join(KEY_ROLES)}")
    if key_hash in s.keys:
        return s, {"added": False}
    keys = s.keys | {key_hash: ApiKey(key_hash, name, role, at)}
    return replace(s, keys=_readonly(keys)), {"added": True}


def _placement_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model, node, gpus = _name(c, "model"), _name(c, "node"), c.get("gpus")
    if model not in s.models:
        raise CommandError("model_not_found", f"no model named {model!r}")
    if not isinstance(gpus, list) or not all(type(g) is int and g >= 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise CommandError("bad_command", "gpus must be a list of distinct device indexes")
    taken = {g for p in s.placements.values() if p.node == node for g in p.gpus} & set(gpus)
    if taken:
        # A plan made on a stale snapshot: refused, so the reconciler replans (never double-books).
        raise CommandError("gpu_taken", f"GPU(s) {sorted(taken)} on {node} are already placed")
    replica_id = f"{model}-r{s.next_replica}"
    placement = Placement(replica_id, model, node, tuple(gpus), str(c.get("launch_hash", "")), at)
    return (
        replace(s, placements=_readonly(s.placements | {replica_id: placement}), next_replica=s.next_replica + 1),
        {"replica_id": replica_id},
    )


def _placement_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    rid = _name(c, "replica_id")
    if rid not in s.placements:
        return s, {"removed": False}  # idempotent: a rerun of the same plan is harmless
    placements = {k: v for k, v in s.placements.items() if k != rid}
    return replace(s, placements=_readonly(placements)), {"removed": True}


def _start_failed(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model, error = _name(c, "model"), str(c.get("error", ""))[:2000]
    if model not in s.models:
        return s, {"parked": False}
    old = s.model_health(model)
    failures = old.failures_in_row + 1
    parked = old.parked or failures >= int(effective(s.settings, "health.park_after_failures"))
    health = s.health | {model: ModelHealth(failures, parked, error, at)}
    return replace(s, health=_readonly(health)), {"parked": parked, "failures_in_row": failures}


def _ready(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model = _name(c, "model")
    old = s.health.get(model)
    if old is None or old.parked:
        return s, {}
    return replace(s, health=_readonly({k: v for k, v in s.health.items() if k != model})), {}


_OPS: dict[str, Callable[[ClusterState, dict[str, Any], float], tuple[ClusterState, Any]]] = {
    "model.put": _model_put,
    "model.remove": _model_remove,
    "model.retry": _model_retry,
    "setting.put": _setting_put,
    "key.add": _key_add,
    "placement.add": _placement_add,
    "placement.remove": _placement_remove,
    "health.start_failed": _start_failed,
    "health.ready": _ready,
}
