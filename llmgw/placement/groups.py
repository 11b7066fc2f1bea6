"""Placement of a multi-node replica (`profile.nodes > 1`): `nodes` whole free nodes in one fabric.
Pure; `place` hands these over, after the rules every replica shares (MIG).

The rules, as docs/engines.md states them:
- each member runs on its own node; every member's node has the same, non-empty `fabric`
  (a node with no fabric configured never hosts a member: llmgw does not guess interconnects);
- `profile.gpus` is per node (`tp * pp == gpus * nodes`): a member takes that many devices,
  and only on a *whole free* node (none of its usable GPUs placed), so the group never shares
  its nodes' interconnect with another replica at start; the devices left over stay placeable;
- a CPU profile (the sim) takes no devices: its node must run no member of another group;
- the choice is deterministic: the fabric with the fewest free nodes that still suffices
  (keeping big pools whole), then in it the nodes with the fewest spare GPUs, then by name;
  ranks follow node names, rank 0 first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement.filters import (
    NEVER,
    NOT_NOW,
    Choice,
    Member,
    PlacementResult,
    Refusal,
    devices,
    engine_host,
    engine_refusal,
)


def place_group(model: ModelDef, nodes: Mapping[str, NodeInfo], placements: Sequence[Placement]) -> PlacementResult:
    """The members of one more multi-node replica of `model`, or why no set of nodes fits."""
    want = model.profile.nodes
    used: dict[str, set[int]] = {}
    grouped: dict[str, str] = {}  # node -> a group one of its placements belongs to
    for p in placements:
        used.setdefault(p.node, set()).update(p.gpus)
        if p.group:
            grouped.setdefault(p.node, p.group)
    refusals: list[Refusal] = []
    pools: dict[str, list[tuple[int, str, tuple[int, ...]]]] = {}  # fabric -> (spare GPUs, node, devices)
    for name in sorted(nodes):
        info = nodes[name]
        if info.fabric:
            pools.setdefault(info.fabric, [])
        fit = _whole_node(model, info, used.get(name, set()), grouped.get(name, ""))
        if isinstance(fit, Refusal):
            refusals.append(fit)
        else:
            pools[info.fabric].append(fit)
    fits = sorted((len(free), fabric) for fabric, free in pools.items() if len(free) >= want)
    if not fits:
        counts = ", ".join(f"{fabric} has {len(free)}" for fabric, free in sorted(pools.items()))
        summary = f"no fabric with {want} free whole nodes: {counts or 'no node has a fabric configured'}"
        return PlacementResult(None, tuple(refusals), summary)
    fabric = fits[0][1]
    chosen = sorted(sorted(pools[fabric])[:want], key=lambda f: f[1])
    members = tuple(Member(node, gpus, engine_host(nodes[node])) for _, node, gpus in chosen)
    # Bin-pack: the larger the share of the chosen nodes' usable GPUs this group takes, the better.
    taken = sum(len(m.gpus) for m in members)
    capacity = taken + sum(spare for spare, _, _ in chosen)
    score = 100.0 * taken / capacity if capacity else 100.0
    return PlacementResult(Choice(members[0].node, members[0].gpus, score, members, fabric), tuple(refusals))


def _whole_node(
    model: ModelDef, node: NodeInfo, used: set[int], group: str
) -> tuple[int, str, tuple[int, ...]] | Refusal:
    """(spare usable GPUs, node, devices for the member) when `node` can host a member now."""
    prof = model.profile
    if not node.fabric:
        return Refusal(node.node, NEVER, "no_fabric",
                       "node has no fabric configured: a multi-node replica runs within one fabric")
    if prof.cpu:
        missing = engine_refusal(model, node)
        if missing is not None:
            return missing
        if group:
            return Refusal(node.node, NOT_NOW, "node_busy",
                           f"a multi-node replica takes whole nodes: this one runs a member of {group}")
        return (0, node.node, ())
    usable = devices(model, node)
    if isinstance(usable, Refusal):
        return usable
    missing = engine_refusal(model, node)
    if missing is not None:
        return missing
    capacity = [g for g in node.gpus if g.usable]
    busy = [g.label for g in sorted(capacity, key=lambda g: g.index) if g.index in used]
    if busy or group:
        what = f"GPU {', '.join(busy)} placed" if busy else f"it runs a member of {group}"
        return Refusal(node.node, NOT_NOW, "node_busy", f"a multi-node replica takes whole free nodes: {what}")
    chosen = tuple(sorted(g.index for g in usable)[: prof.gpus])
    return (len(capacity) - prof.gpus, node.node, chosen)
