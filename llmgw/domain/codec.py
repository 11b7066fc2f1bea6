"""`ClusterState` as versioned JSON, for snapshots: `state_to_json(state) -> dict` and back.

Driven by the dataclasses' fields and type hints, so a field added to the state (or to a value
in it) is written and read without a change here; a type it cannot write fails loudly.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from llmgw.domain import levels
from llmgw.domain.frozen import freeze
from llmgw.domain.model import Limits, ModelDef
from llmgw.domain.state import ApiKey, ClusterState, ModelHealth, Placement

# Bump when a field changes meaning or shape. A field that is only added (with a default)
# needs no bump: an older document lacks it and gets the default. A reader refuses a
# newer version, and a field it does not know, rather than drop what it cannot read.
FORMAT_VERSION = 1


class CodecError(ValueError):
    """A document that is not a state this llmgw can read; the message says where and why."""


def state_to_json(state: ClusterState) -> dict[str, Any]:
    """A plain JSON document (dicts, lists, str, int, float, bool, None) holding every field; past store
    level 1, the level its reader needs (`llmgw.domain.levels`), so an older member says what to run."""
    doc = {"format_version": FORMAT_VERSION, "state": _encode(state, "state")}
    if state.store_level > 1:
        doc["needs_level"] = state.store_level
        doc["needs_release"] = levels.release_of(state.store_level)
    return doc


def state_hash(state: ClusterState) -> str:
    """`sha256:HEX` of the state's JSON (keys sorted): equal on every member at the same revision,
    so `GET /api/v1/cluster/members` shows whether the members' states agree."""
    text = json.dumps(state_to_json(state), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def state_from_json(doc: Any) -> ClusterState:
    """The state in `doc`, or `CodecError` naming the first thing wrong (with its path);
    `levels.NewerThanThisRelease` for a state of a store level above this release's."""
    if not isinstance(doc, Mapping):
        raise CodecError("a state document is a JSON object")
    levels.check_readable({"op": "(a snapshot)", **{k: doc.get(k) for k in ("needs_level", "needs_release")}},
                          what="the snapshot")
    version = doc.get("format_version")
    if type(version) is not int or version < 1:
        raise CodecError(f"the state document has no valid format_version (found {version!r:.40})")
    if version > FORMAT_VERSION:
        raise CodecError(f"the state was written in format version {version}, newer than this llmgw reads "
                         f"(up to {FORMAT_VERSION}): run the llmgw version that wrote it, or a newer one")
    state = _decode(doc.get("state"), ClusterState, "state")
    assert isinstance(state, ClusterState)
    return state


# --- writing: by value ------------------------------------------------------------------


# Fields added after the first release, written only once they leave their default: a state that never
# used them reads on every earlier member (which refuses an unknown field), as a rolling upgrade needs.
# What sets one is used only once every member understands it (e.g. `trust.raft_tls`: control/trust.py).
# Each with the store level that brought it (llmgw/domain/levels.py); a state field set only by a command of
# its own level (`store_level`, `raft_tls_since`) is listed at 1: its command carries the level.
LATER_FIELDS: Mapping[tuple[type, str], int] = {
    (ClusterState, "raft_tls_since"): 1, (ClusterState, "store_level"): 1,
    (ModelDef, "fallbacks"): 2, (ModelDef, "aliases"): 2, (ModelDef, "routing"): 2, (ApiKey, "priority"): 2,
    (Limits, "concurrency_per_replica"): 2,
    (ModelDef, "base"): 3, (ModelDef, "lora"): 3,  # LoRA adapters (reconcile/adapters.py)
    (ClusterState, "mirror"): 3,  # the model mirror's catalog (domain/mirror.py)
    (ModelHealth, "flaps"): 3, (ModelHealth, "flap_ready_s"): 3,  # flapping replicas (domain/health.py)
    (ClusterState, "approved_nodes"): 3,  # nodes approved to take placements (`node.approve`)
    (ModelDef, "schedules"): 3,  # schedule rules (domain/schedule.py)
    (ModelDef, "sleep_level"): 3, (Placement, "asleep"): 3,  # fast wake (`placement.sleep`, reconcile/sleep.py)
    (ClusterState, "active_conditions"): 3,  # conditions posted as started (`condition.update`, llmgw/notify)
    (ClusterState, "cordoned_nodes"): 3,  # cordoned and draining nodes (`node.cordon`)
}
# New values of fields every release reads, with the level that brought them: an earlier release reads the
# value but cannot serve it (a model role it does not know).
LATER_VALUES: Mapping[tuple[type, str, str], int] = {(ModelDef, "role", "rerank"): 3}


def later_level(value: Any) -> int:
    """The store level `value` (a definition, a key, anything stored) needs: the highest level of the
    `LATER_FIELDS` it sets and `LATER_VALUES` it holds, at any depth; 1 when none (what every release reads).
    The command that stores it carries that level (`levels.stamp`)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = type(value)
        level = 1
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item != _default(f):
                level = max(level, LATER_FIELDS.get((kind, f.name), 1))
            if isinstance(item, str):
                level = max(level, LATER_VALUES.get((kind, f.name, item), 1))
            else:
                level = max(level, later_level(item))
        return level
    if isinstance(value, Mapping):
        return max((later_level(item) for item in value.values()), default=1)
    if isinstance(value, (tuple, list)):
        return max((later_level(item) for item in value), default=1)
    return 1


def _default(f: dataclasses.Field[Any]) -> Any:
    """A field's default, made by its factory when it has one (an empty mapping)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _encode(value: Any, path: str) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = type(value)
        return {f.name: _encode(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value)
                if (kind, f.name) not in LATER_FIELDS or getattr(value, f.name) != _default(f)}
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CodecError(f"{path}: a mapping key is not a string ({key!r:.40})")
            out[key] = _encode(item, f"{path}[{key!r}]")
        return out
    if isinstance(value, (tuple, list)):
        return [_encode(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise CodecError(f"{path}: {value} has no JSON form")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise CodecError(f"{path}: no JSON form for a {type(value).__name__}")


# --- reading: by type hint --------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(value: Any, hint: Any, path: str) -> Any:
    if hint is Any:  # a JSON value (settings): read-only, as the state keeps it
        _check_json(value, path)
        return freeze(value)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _decode_dataclass(value, hint, path)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _decode(value, rest[0], path)
        raise CodecError(f"{path}: cannot read a value of type {hint}")
    if origin in (MappingProxyType, Mapping, dict):
        if not isinstance(value, dict):
            raise CodecError(f"{path}: must be an object")
        key_type, item_type = args or (str, Any)
        if key_type is not str:
            raise CodecError(f"{path}: cannot read mappings keyed by {key_type}")
        items = {k: _decode(v, item_type, f"{path}[{k!r}]") for k, v in value.items()}
        return items if origin is dict else MappingProxyType(items)
    if origin is tuple:
        if not isinstance(value, list):
            raise CodecError(f"{path}: must be a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise CodecError(f"{path}: must be a list of {len(args)} items")
        return tuple(_decode(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(args, value)))
    return _decode_scalar(value, hint, path)


def _decode_scalar(value: Any, hint: Any, path: str) -> Any:
    # `type(...) is`: JSON true is not the number 1, and 1 is not true.
    if hint is bool:
        if type(value) is not bool:
            raise CodecError(f"{path}: must be true or false")
        return value
    if hint is int:
        if type(value) is not int:
            raise CodecError(f"{path}: must be an integer")
        return value
    if hint is float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise CodecError(f"{path}: must be a finite number")
        return float(value)
    if hint is str:
        if type(value) is not str:
            raise CodecError(f"{path}: must be a string")
        return value
    raise CodecError(f"{path}: cannot read a value of type {hint}")


def _decode_dataclass(value: Any, cls: type, path: str) -> Any:
    if not isinstance(value, dict):
        raise CodecError(f"{path}: must be an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise CodecError(f"{path}: unknown field {unknown[0]!r} (written by a newer llmgw?)")
    hints = _hints(cls)
    kwargs = {}
    for name, f in fields.items():
        if name in value:
            kwargs[name] = _decode(value[name], hints[name], f"{path}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise CodecError(f"{path}: missing field {name!r}")
        # else: written before the field existed; the constructor gives its default
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CodecError(f"{path}: {e}") from None


def _check_json(value: Any, path: str) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _check_json(v, f"{path}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise CodecError(f"{path}: {value} is not a JSON number")
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise CodecError(f"{path}: not a JSON value ({type(value).__name__})")
