"""The model mirror's commands: `mirror.put` (a verified file, by name), `mirror.remove` (by name; refused while
something uses the file) and `mirror.pin` (keep it, used or not); their builders, stateless checks and changes.
The catalog's shape is `domain.mirror`'s; the blobs are each control plane's (llmgw/mirror/blobs.py).

A name is unique: putting a name already held with another sha256 is refused (`mirror_name_taken`): remove it
first, so a model never silently changes weights. The same name and sha256 again changes nothing (a retried commit).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain.commands.core import CommandError, make, readonly
from llmgw.domain.mirror import MirrorFile, file_problem, name_problem, used_by
from llmgw.domain.state import ClusterState


def put_file(name: str, sha256: str, size: int, kind: str, metadata: dict[str, Any], at: float) -> dict[str, Any]:
    return make("mirror.put", at, file={"name": name, "sha256": sha256, "size": size, "kind": kind,
                                        "metadata": metadata})


def remove_file(name: str, at: float) -> dict[str, Any]:
    return make("mirror.remove", at, name=name)


def pin_file(name: str, pinned: bool, at: float) -> dict[str, Any]:
    return make("mirror.pin", at, name=name, pinned=pinned)


def check_put(c: dict[str, Any]) -> None:
    problem = file_problem(c.get("file"))
    if problem is not None:
        raise CommandError("invalid_mirror_file", problem)


def check_name(c: dict[str, Any]) -> None:
    problem = name_problem(c.get("name"))
    if problem is not None:
        raise CommandError("invalid_mirror_file", problem)


def check_pin(c: dict[str, Any]) -> None:
    check_name(c)
    if not isinstance(c.get("pinned"), bool):
        raise CommandError("invalid_mirror_file", "pinned must be true or false")


def apply_put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    doc = c["file"]
    name = doc["name"]
    old = s.mirror.get(name)
    if old is not None:
        if old.sha256 != doc["sha256"]:
            raise CommandError("mirror_name_taken", f"the mirror already holds a different file named {name} "
                               f"(sha256 {old.sha256[:12]}): remove it first, or upload under another name")
        return s, {"added": False, "name": name, "sha256": old.sha256}
    file = MirrorFile(name, doc["sha256"], doc["size"], doc["kind"], doc.get("metadata", {}), at)
    return replace(s, mirror=readonly(s.mirror | {name: file})), {"added": True, "name": name,
                                                                     "sha256": file.sha256}


def apply_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Removes the name; a name no longer held is no change (`removed` false). Refused while in use
    (`mirror_file_in_use`, naming the users); a pin does not hold a removal back (the operator asked for it)."""
    name = c["name"]
    if name not in s.mirror:
        return s, {"removed": False, "name": name}
    users = used_by(s, name)
    if users:
        raise CommandError("mirror_file_in_use", f"the mirror file {name} is in use by {', '.join(users)}: "
                                                 "remove or change those first")
    files = {k: v for k, v in s.mirror.items() if k != name}
    return replace(s, mirror=readonly(files)), {"removed": True, "name": name}


def apply_pin(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    name = c["name"]
    old = s.mirror.get(name)
    if old is None:
        raise CommandError("mirror_file_not_found", f"no mirror file named {name}")
    new = replace(old, pinned=c["pinned"])
    return replace(s, mirror=readonly(s.mirror | {name: new})), {"name": name, "pinned": new.pinned,
                                                                  "changed": new != old}
