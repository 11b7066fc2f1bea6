"""Multi-node replicas (groups) in the state: the members' placements, the rendezvous port and address.
Pure; `commands` applies them (`placement.add_group`), `placement` and `reconcile` read them.

A group is one replica run by `size` engine processes on distinct nodes. Rank 0 leads: it serves
the traffic and listens for the others at `leader` ("host:port"); every member's `address` uses
the same port on its own node. The port comes from the group's id, so it is known before any
engine starts and a group placed again (a new id) most likely gets another one.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping

from llmgw.domain.state import Placement

MAX_MEMBERS = 64  # as profile.nodes
HOST_MAX_CHARS = 253


def group_port(group_id: str, first: int, last: int) -> int:
    """A port in first..last picked from the group id: every member computes the same one."""
    return first + zlib.crc32(group_id.encode()) % (last - first + 1)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def members_problem(members: Any) -> str | None:
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


def group_placements(
    group: str, model: str, members: list[Mapping[str, Any]], launch_hash: str, at: float, port: int
) -> dict[str, Placement]:
    """The members' placements, by replica id `<group>-r<rank>`."""
    addresses = [host_port(str(m["host"]), port) for m in members]
    return {
        f"{group}-r{rank}": Placement(f"{group}-r{rank}", model, str(m["node"]), tuple(m["gpus"]), launch_hash, at,
                                      group=group, rank=rank, group_size=len(members), leader=addresses[0],
                                      address=addresses[rank])
        for rank, m in enumerate(members)
    }
