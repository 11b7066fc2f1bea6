"""Placement of a multi-node replica (`profile.nodes > 1`): `nodes` whole free nodes in one fabric.
Pure; `FleetView.place` hands these over, after the rules every replica shares (MIG).

The rules, as docs/engines.md states them:
- each member runs on its own node; every member's node has the same, non-empty `fabric`
  (a node with no fabric configured never hosts a member: llmgw does not guess interconnects);
- `profile.gpus` is per node (`tp * pp == gpus * nodes`): a member takes that many devices,
  and only on a *whole free* node (none of its usable GPUs placed), so the group never shares
  its nodes' interconnect with another replica at start; the devices left over stay placeable;
- a CPU profile (the sim) takes no devices: its node must run no member of another group;
- the choice is deterministic: a fabric where enough free nodes hold the weights first (storage
  is a preference, never a filter), then the fabric with the fewest free nodes that still
  suffices (keeping big pools whole), then in it the nodes holding the weights, those with the
  fewest spare GPUs, then by name; ranks follow node names, rank 0 first.
- the cost is one look at each node per group placed (groups are few; single-node replicas
  use `FleetView`'s index).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.domain.model import ModelDef
from llmgw.placement.filters import (NEVER, NOT_NOW, Choice, Member, PlacementResult, Refusal, Verdict,
                                     approval_refusal, cordon_refusal, engine_host, engine_refusal)

if TYPE_CHECKING:  # FleetView hands its index over and calls these: a type, not a dependency
    from llmgw.placement.fleet import FleetView


def place_group(model: ModelDef, view: FleetView) -> PlacementResult:
    """The members of one more multi-node replica of `model`, or why no set of nodes fits."""
    want = model.profile.nodes
    refusals: list[Refusal] = []
    # fabric -> (holds the weights?, spare GPUs, node, devices); holders sort first
    pools: dict[str, list[tuple[bool, int, str, tuple[int, ...]]]] = {}
    for name in sorted(view.nodes):
        info = view.nodes[name].info
        if info.fabric:
            pools.setdefault(info.fabric, [])
        fit = _whole_node(model, view, name)
        if isinstance(fit, Refusal):
            refusals.append(fit)
        else:
            spare, gpus = fit
            pools[info.fabric].append((not view.holds(model, name), spare, name, gpus))
    # Storage first (a fabric where the weights are), then the fabric with the fewest free nodes
    # that still suffices (keeping big pools whole), then by name.
    fits = sorted((sorted(free)[want - 1][0], len(free), fabric) for fabric, free in pools.items() if len(free) >= want)
    if not fits:
        counts = ", ".join(f"{fabric} has {len(free)}" for fabric, free in sorted(pools.items()))
        summary = f"no fabric with {want} free whole nodes: {counts or 'no node has a fabric configured'}"
        return PlacementResult(None, tuple(refusals), summary)
    fabric = fits[0][2]
    chosen = sorted(sorted(pools[fabric])[:want], key=lambda f: f[2])
    members = tuple(Member(node, gpus, engine_host(view.nodes[node].info)) for _, _, node, gpus in chosen)
    # Bin-pack: the larger the share of the chosen nodes' usable GPUs this group takes, the better.
    taken = sum(len(m.gpus) for m in members)
    capacity = taken + sum(spare for _, spare, _, _ in chosen)
    score = 100.0 * taken / capacity if capacity else 100.0
    return PlacementResult(Choice(members[0].node, members[0].gpus, score, members, fabric), tuple(refusals))


def group_verdicts(model: ModelDef, view: FleetView) -> list[Verdict]:
    """Each node's verdict on hosting a member of one more multi-node replica (FITS: a whole free node)."""
    out = []
    for name in sorted(view.nodes):
        fit = _whole_node(model, view, name)
        if isinstance(fit, Refusal):
            out.append(Verdict(name, fit.verdict, fit.code, fit.message, fit.numbers))
        else:
            out.append(Verdict(name, "fits", gpus=fit[1]))
    return out


def _whole_node(model: ModelDef, view: FleetView, name: str) -> tuple[int, tuple[int, ...]] | Refusal:
    """(spare usable GPUs, devices for the member) when the node can host a member now."""
    node = view.nodes[name]
    info = node.info
    need = view.need(model)
    if node.shape.pending:
        return approval_refusal(name)
    if node.shape.cordoned:
        return cordon_refusal(name)
    if not info.fabric:
        return Refusal(name, NEVER, "no_fabric",
                       "node has no fabric configured: a multi-node replica runs within one fabric")
    group = min(node.groups) if node.groups else ""
    if need.cpu:
        missing = engine_refusal(need, info)
        if missing is not None:
            return missing
        if group:
            return Refusal(name, NOT_NOW, "node_busy",
                           f"a multi-node replica takes whole nodes: this one runs a member of {group}")
        return (0, ())
    fit = view.static(need, name)
    if isinstance(fit, Refusal):
        return fit
    capacity = sorted(node.shape.usable)
    busy = [g.label for g in sorted(info.gpus, key=lambda g: g.index) if g.index in node.shape.usable and g.index in node.used]
    if busy or group:
        what = f"GPU {', '.join(busy)} placed" if busy else f"it runs a member of {group}"
        return Refusal(name, NOT_NOW, "node_busy", f"a multi-node replica takes whole free nodes: {what}")
    chosen = fit.candidates[: need.gpus]
    return (len(capacity) - need.gpus, chosen)
