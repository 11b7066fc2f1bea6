"""The placement commands: `placement.add` (one replica on one node's GPUs), `placement.add_group`
(one multi-node replica, all members or none), `placement.remove` (by replica id) and `placement.sleep`
(a replica asleep or awake: fast wake); their builders, stateless checks and changes.

A placement on GPUs already placed is refused (`gpu_taken`): a plan made on a stale snapshot, so
the reconciler replans and never double-books. A removal of a replica no longer placed is no
change, so a rerun of the same plan is harmless.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from llmgw.domain import groups
from llmgw.domain.commands.core import CommandError, check_slot, make, readonly, required, slot_field
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, Placement

MAX_MEMBERS = 64  # as profile.nodes
HOST_MAX_CHARS = 253


def add_placement(model: str, node: str, gpus: tuple[int, ...], launch_hash: str, at: float,
                  *, slot: int | None = None) -> dict[str, Any]:
    return make("placement.add", at, model=model, node=node, gpus=list(gpus), launch_hash=launch_hash,
                **slot_field(slot))


def add_group(
    model: str, members: Sequence[tuple[str, tuple[int, ...], str]], launch_hash: str, at: float,
    *, slot: int | None = None,
) -> dict[str, Any]:
    """Place one multi-node replica: members (node, gpus, host) in rank order, all or none."""
    docs = [{"node": node, "gpus": list(gpus), "host": host} for node, gpus, host in members]
    return make("placement.add_group", at, model=model, members=docs, launch_hash=launch_hash,
                **slot_field(slot))


def remove_placement(replica_id: str, at: float, *, reason: str = "") -> dict[str, Any]:
    return make("placement.remove", at, replica_id=replica_id, reason=reason)


def check_add(c: dict[str, Any]) -> None:
    required(c, "model")
    check_slot(c)
    required(c, "node")
    gpus = c.get("gpus")
    if not isinstance(gpus, list) or not all(type(g) is int and g >= 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise CommandError("bad_command", "gpus must be a list of distinct device indexes")


def apply_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model, node, gpus = c["model"], c["node"], c["gpus"]
    if model not in s.models:
        raise CommandError("model_not_found", f"no model named {model!r}")
    taken = {g for p in s.placements.values() if p.node == node for g in p.gpus} & set(gpus)
    if taken:
        # A plan made on a stale snapshot: refused, so the reconciler replans (never double-books).
        raise CommandError("gpu_taken", f"GPU(s) {sorted(taken)} on {node} are already placed")
    replica_id = f"{model}-r{s.next_replica}"
    placement = Placement(replica_id, model, node, tuple(gpus), str(c.get("launch_hash", "")), at,
                          slot=int(c.get("slot", 0)))
    return (
        replace(s, placements=readonly(s.placements | {replica_id: placement}), next_replica=s.next_replica + 1),
        {"replica_id": replica_id},
    )


def _members_problem(members: Any) -> str | None:
    """What is wrong with a `placement.add_group` command's members ([{node, gpus, host}], rank
    order), or None. The checks that need no state."""
    if not isinstance(members, list) or not 2 <= len(members) <= MAX_MEMBERS:
        return f"members must be a list of 2..{MAX_MEMBERS} members"
    nodes = set()
    for m in members:
        if not isinstance(m, dict):
            return "each member is an object {node, gpus, host}"
        node, host, gpus = m.get("node"), m.get("host"), m.get("gpus")
        if not isinstance(node, str) or not node:
            return "a member's node must be a non-empty string"
        if (not isinstance(host, str) or not host or len(host) > HOST_MAX_CHARS
                or any(ch.isspace() or ord(ch) < 32 or ch in "/[]@" for ch in host)):
            return f"member host {host!r:.80} is not a host name or address"
        if not isinstance(gpus, list) or not all(type(g) is int and g >= 0 for g in gpus) or len(set(gpus)) != len(gpus):
            return "a member's gpus must be a list of distinct device indexes"
        nodes.add(node)
    if len(nodes) != len(members):
        return "the members of a group run on distinct nodes"
    return None


def check_add_group(c: dict[str, Any]) -> None:
    required(c, "model")
    check_slot(c)
    problem = _members_problem(c.get("members"))
    if problem:
        raise CommandError("bad_command", problem)


def apply_add_group(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model, members = c["model"], c["members"]
    if model not in s.models:
        raise CommandError("model_not_found", f"no model named {model!r}")
    for m in members:
        taken = {g for p in s.placements.values() if p.node == m["node"] for g in p.gpus} & set(m["gpus"])
        if taken:
            raise CommandError("gpu_taken", f"GPU(s) {sorted(taken)} on {m['node']} are already placed")
    group = f"{model}-g{s.next_replica}"
    first, last = effective(s.settings, "groups.ports")
    port = groups.group_port(group, int(first), int(last))
    added = groups.group_placements(group, model, members, str(c.get("launch_hash", "")), at, port)
    if c.get("slot"):
        added = {rid: replace(p, slot=c["slot"]) for rid, p in added.items()}
    result = {"group": group, "replica_ids": list(added), "leader": added[f"{group}-r0"].leader}
    return replace(s, placements=readonly(s.placements | added), next_replica=s.next_replica + 1), result


def check_remove(c: dict[str, Any]) -> None:
    required(c, "replica_id")


def apply_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    rid = c["replica_id"]
    if rid not in s.placements:
        return s, {"removed": False}  # idempotent: a rerun of the same plan is harmless
    placements = {k: v for k, v in s.placements.items() if k != rid}
    return replace(s, placements=readonly(placements)), {"removed": True}


def sleep_placement(replica_id: str, asleep: bool, at: float) -> dict[str, Any]:
    """Mark a replica asleep (its engine sleeps, it keeps its GPUs) or awake again (fast wake)."""
    return make("placement.sleep", at, replica_id=replica_id, asleep=asleep)


def check_sleep(c: dict[str, Any]) -> None:
    required(c, "replica_id")
    if type(c.get("asleep")) is not bool:
        raise CommandError("bad_command", "asleep must be true or false")


def apply_sleep(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    p = s.placements.get(c["replica_id"])
    if p is None or p.asleep == c["asleep"]:
        return s, {"changed": False}  # gone meanwhile, or already so: a rerun of the same plan is harmless
    return replace(s, placements=readonly(s.placements | {p.replica_id: replace(p, asleep=c["asleep"])})), \
        {"changed": True}
