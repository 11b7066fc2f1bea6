"""Which nodes hold a model's weights, from the agents' storage reports (`NodeInfo.storage`):
the index behind placement's storage preference. Pure; built once per `FleetView`.

The rules (docs/placement.md, "Storage"):
- a report's `models` entries count, never its `not_weights` (a half-written or empty directory
  is not weights: the agent already decided, from headers);
- an entry matches an absolute-path source when its path equals the source or lies under it;
  `mirror://NAME`, `hf://ORG/REPO` and `sim://NAME` match an entry named NAME / ORG/REPO;
  `pkg://` sources ship with llmgw and are held nowhere in particular;
- a local directory counts for the node that reported it, only; a shared one for every node on
  its fabric (the node's own fabric, or the fabric of a directory it reports): one filer counts
  once per fabric, however many nodes mount it;
- a node never asked to look reports nothing and ranks with one that looked and found nothing.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.domain.observed import NodeInfo

_NAMED = ("mirror://", "hf://", "sim://")


@dataclass(frozen=True)
class Held:
    """Where one source's weights are: nodes holding a local copy, fabrics holding a shared one."""

    nodes: frozenset[str] = frozenset()
    fabrics: frozenset[str] = frozenset()


NOWHERE = Held()


def source_key(source: str) -> str | None:
    """The index key a source is looked up by, or None when storage cannot hold it."""
    for scheme in _NAMED:
        if source.startswith(scheme):
            return "name:" + source[len(scheme):].strip("/")
    if source.startswith("/"):
        return "path:" + posixpath.normpath(source)
    return None


def node_fabrics(node: NodeInfo) -> frozenset[str]:
    """The fabrics a node reaches storage over: its own, and each of its directories'."""
    found = {str(s.get("fabric", "")) for s in node.storage}
    if node.fabric:
        found.add(node.fabric)
    found.discard("")
    return frozenset(found)


class Holdings:
    """source key -> (local holders, shared fabrics). Every ancestor of an entry's path is a key,
    so "the source is a directory the weights lie under" is one lookup."""

    def __init__(self, nodes: Mapping[str, NodeInfo]) -> None:
        local: dict[str, set[str]] = {}
        shared: dict[str, set[str]] = {}
        for name in sorted(nodes):
            for report in nodes[name].storage:
                models = report.get("models") or ()
                fabric = str(report.get("fabric", ""))
                is_shared = report.get("shared") is True  # as the operator said; never guessed
                for entry in models:
                    for key in _keys(entry):
                        if is_shared and fabric:
                            shared.setdefault(key, set()).add(fabric)
                        else:
                            local.setdefault(key, set()).add(name)
        self._local, self._shared = local, shared  # a source's `Held` is made when asked (`FleetView.held` keeps it)

    def of(self, source: str) -> Held:
        key = source_key(source)
        local, shared = (self._local.get(key), self._shared.get(key)) if key is not None else (None, None)
        return Held(frozenset(local or ()), frozenset(shared or ())) if local or shared else NOWHERE


def _keys(entry: object) -> list[str]:
    if not isinstance(entry, Mapping):
        return []
    keys = []
    name = entry.get("name")
    if isinstance(name, str) and name:
        keys.append("name:" + name)
    path = entry.get("path")
    if isinstance(path, str) and path.startswith("/"):
        path = posixpath.normpath(path)
        while path not in ("/", ""):
            keys.append("path:" + path)
            path = posixpath.dirname(path)
    return keys
