"""The node commands: `node.approve` (nodes an operator let take placements while the setting
`nodes.require_approval` is on), `node.forget` (a lost node an operator forgot: its placements go in the
same command) and `node.cordon` (maintenance: a cordoned node takes nothing new, a draining one also has its
replicas moved elsewhere); their builders, stateless checks and changes. The rules that read them are
`ClusterState.pending_nodes` (placement refuses a pending node with `awaiting_approval`) and
`ClusterState.cordoned_nodes` (placement refuses with `cordoned`; the reconciler drains, `reconcile.drain`).

A node lives in the leader's memory (`control.hub`), which a new leader rebuilds from the placements in the
state: a forgotten node that still held one would come back, as "waiting for node …" then lost, after every
leader change. `node.forget` removes them with the forgetting, so no leader finds it again; a multi-node
replica with a member there goes whole (what is left of it could not serve). Its approval stays: approval
is trust in the machine, which `ctl nodes revoke` takes away, not the leader's memory of it.

Approving a node already approved changes nothing (its first approval's time is kept): a retried commit,
or the batch that approves every known node when the setting is turned on, is harmless.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from llmgw.domain.commands.core import CommandError, make, readonly
from llmgw.domain.state import ClusterState

NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")  # an agent's node name (wire.protocol_agent.ID_RE)
APPROVE_MAX_NODES = 10_000  # one command approves at most this many (turning the setting on in a large fleet)


def forget_node(name: str, at: float) -> dict[str, Any]:
    return make("node.forget", at, node=name)


def check_forget(c: dict[str, Any]) -> None:
    name = c.get("node")
    if not isinstance(name, str) or not NODE_RE.fullmatch(name):
        raise CommandError("bad_command", f"{str(name)[:80]!r} is not a node name")


def apply_forget(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    node = c["node"]
    groups = {p.group for p in s.placements.values() if p.node == node and p.group}
    gone = sorted(rid for rid, p in s.placements.items() if p.node == node or (p.group and p.group in groups))
    if not gone:
        return s, {"forgotten": node, "removed": []}
    kept = {rid: p for rid, p in s.placements.items() if rid not in gone}
    return replace(s, placements=readonly(kept)), {"forgotten": node, "removed": gone}


def approve_nodes(names: list[str], at: float) -> dict[str, Any]:
    return make("node.approve", at, nodes=sorted(set(names)))


def check_approve(c: dict[str, Any]) -> None:
    names = c.get("nodes")
    if not isinstance(names, list) or not 1 <= len(names) <= APPROVE_MAX_NODES:
        raise CommandError("bad_command", f"nodes must be a list of 1 to {APPROVE_MAX_NODES} node names")
    for name in names:
        if not isinstance(name, str) or not NODE_RE.fullmatch(name):
            raise CommandError("bad_command", f"{str(name)[:80]!r} is not a node name (letters, digits, '.', '_', "
                                              f"':', '-'; first a letter or digit; at most 200)")


def apply_approve(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    fresh = sorted({n for n in c["nodes"] if n not in s.approved_nodes})
    if not fresh:
        return s, {"approved": []}
    return replace(s, approved_nodes=readonly(s.approved_nodes | {n: at for n in fresh})), {"approved": fresh}


CORDON_MODES = ("cordon", "drain", "none")  # none: uncordoned (the node takes placements again)


def cordon_nodes(names: list[str], mode: str, at: float) -> dict[str, Any]:
    """`mode`: cordon (nothing new is placed there), drain (cordon, and its replicas move elsewhere one at a
    time), none (uncordon: ends a cordon or a drain)."""
    return make("node.cordon", at, nodes=sorted(set(names)), mode=mode)


def check_cordon(c: dict[str, Any]) -> None:
    check_approve(c)
    if c.get("mode") not in CORDON_MODES:
        raise CommandError("bad_command", f"mode must be one of {', '.join(CORDON_MODES)}")


def apply_cordon(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    mode, names = c["mode"], c["nodes"]
    if mode == "none":
        changed = sorted(n for n in names if n in s.cordoned_nodes)
        kept = {n: m for n, m in s.cordoned_nodes.items() if n not in changed}
    else:
        changed = sorted(n for n in names if s.cordoned_nodes.get(n) != mode)
        kept = {**s.cordoned_nodes, **{n: mode for n in changed}}
    if not changed:
        return s, {"changed": []}
    return replace(s, cordoned_nodes=readonly(kept)), {"changed": changed}
