"""The model mirror's catalog (pure): a file as the cluster knows it (`MirrorFile`: a name, its blob's sha256, size,
kind and the facts read from its header), what a name and a sha256 may be, and who uses a file (`used_by`): the
models whose source, or one of whose LoRA adapters, is `mirror://NAME`, and the guard policies whose judge is such a
model. A file in use or pinned is never collected; a blob no name refers to any more is deleted by each member.

Names are unique; two names may share one sha256 (one blob on disk).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from llmgw.domain.frozen import freeze, thaw

SCHEME = "mirror://"
KINDS = ("gguf", "safetensors")
NAME_MAX_CHARS = 128
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # a model's name's alphabet: `mirror://NAME` reads
_SHA_RE = re.compile(r"[0-9a-f]{64}")
RESERVED = ("blobs", "held", "uploads")  # the admin API's own paths under /api/v1/mirror/


def name_problem(name: Any) -> str | None:
    """Why `name` cannot name a mirror file (None: it can)."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        return ("a mirror name is 1..128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
                f" (not {name!r:.80})")
    if name in RESERVED:
        return f"{name!r} is reserved (the admin API's path); pick another name"
    return None


def is_sha256(value: Any) -> bool:
    """A blob's name: 64 lowercase hex digits."""
    return isinstance(value, str) and _SHA_RE.fullmatch(value) is not None


def source_name(source: str) -> str | None:
    """The mirror name a model's `source` (or an adapter) names; None when it is not `mirror://NAME`."""
    return source[len(SCHEME):] if source.startswith(SCHEME) else None


@dataclass(frozen=True)
class MirrorFile:
    """A file of the mirror: its blob is `<state dir>/mirror/blobs/<sha256>` on each control plane."""

    name: str
    sha256: str  # lowercase hex
    size: int  # bytes
    kind: str  # one of KINDS
    metadata: Any  # the header facts (a read-only JSON object: architecture, parameters, quantisation ...)
    added_at: float
    pinned: bool = False  # kept whether or not anything uses it

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", freeze(self.metadata))

    def to_doc(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "size": self.size, "kind": self.kind,
                "metadata": thaw(self.metadata), "added_at": self.added_at, "pinned": self.pinned}

    # pickle cannot write the frozen metadata (a MappingProxyType): it travels thawed.
    def __getstate__(self) -> dict[str, Any]:
        return {f.name: thaw(getattr(self, f.name)) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, state.get(f.name, f.default))
        self.__post_init__()


def file_problem(doc: Any) -> str | None:
    """Why a `mirror.put`'s file document is not one (None: it is): every field of `MirrorFile` but `pinned`."""
    if not isinstance(doc, dict):
        return "file must be an object"
    unknown = sorted(set(doc) - {"name", "sha256", "size", "kind", "metadata"})
    if unknown:
        return f"unknown field(s) {', '.join(map(repr, unknown))}"
    problem = name_problem(doc.get("name"))
    if problem:
        return problem
    if not is_sha256(doc.get("sha256")):
        return "sha256 must be 64 lowercase hex digits"
    size = doc.get("size")
    if type(size) is not int or size < 0:
        return "size must be a whole number of bytes"
    if doc.get("kind") not in KINDS:
        return f"kind must be one of {', '.join(KINDS)}"
    metadata = doc.get("metadata", {})
    if not isinstance(metadata, dict):
        return "metadata must be an object"
    return None


def used_by(state: Any, name: str) -> list[str]:
    """What refers to the file `name` (`state` a ClusterState), as words sorted: `model M` (its source),
    `adapter of M` (a LoRA adapter), `judge of policy P` (a policy whose judge model's source is the file)."""
    source = SCHEME + name
    users: set[str] = set()
    judges: set[str] = set()
    for model in state.models.values():
        if model.source == source:
            users.add(f"model {model.name}")
            judges.add(model.name)
        if source in model.lora:
            users.add(f"adapter of {model.name}")
    for policy in state.guard_policies.values():
        if policy.judge in judges:
            users.add(f"judge of policy {policy.name}")
    return sorted(users)


def referenced_blobs(state: Any) -> frozenset[str]:
    """Every sha256 the catalog names: the blobs each member keeps (any other blob of its store may go)."""
    return frozenset(f.sha256 for f in state.mirror.values())
