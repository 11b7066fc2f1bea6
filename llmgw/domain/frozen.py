"""Read-only JSON values: `freeze` makes one (lists → tuples, objects → read-only mappings),
`thaw` turns it back into plain lists and dicts for `json.dumps` and pickle.

`json.dumps` writes tuples as lists but cannot write a `MappingProxyType`: whatever
serializes a value that came out of `ClusterState` passes it through `thaw` first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


def freeze(value: Any) -> Any:
    """A deep, read-only copy of a JSON value (scalars are already immutable)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A fresh plain copy of a (possibly frozen) JSON value: dicts and lists, safe to serialize or change."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


class Doc:
    """A frozen dataclass with a JSON document: `to_doc()` gives each field by name, in the order declared
    (`field(metadata={"doc": "class"})` names one otherwise), a value with its own `to_doc()` as that,
    tuples as lists and mappings as dicts, all the way down."""

    def to_doc(self) -> dict[str, Any]:
        assert dataclasses.is_dataclass(self)
        return {f.metadata.get("doc", f.name): _doc(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _doc(value: Any) -> Any:
    if isinstance(value, Doc) or (hasattr(value, "to_doc") and not isinstance(value, type)):
        return value.to_doc()
    if isinstance(value, Mapping):
        return {k: _doc(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_doc(v) for v in value]
    return value
