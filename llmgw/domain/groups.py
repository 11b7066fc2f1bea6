"""Multi-node replicas (groups) in the state: the members' placements, the rendezvous port and address.
Pure; `commands.placements` checks and applies `placement.add_group` with them.

A group is one replica run by `size` engine processes on distinct nodes. Rank 0 leads: it serves
the traffic and listens for the others at `leader` ("host:port"); every member's `address` uses
the same port on its own node. The port comes from the group's id, so it is known before any
engine starts and a group placed again (a new id) most likely gets another one.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping

from llmgw.domain.state import Placement


def group_port(group_id: str, first: int, last: int) -> int:
    """A port in first..last picked from the group id: every member computes the same one."""
    return first + zlib.crc32(group_id.encode()) % (last - first + 1)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
