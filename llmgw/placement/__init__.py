"""Placement (S2): filter nodes with a named reason, score the rest, pick one (or, for a
multi-node replica, one set of whole nodes in one fabric: `placement.groups`).

Pure: it reads a model, the nodes' inventories and the current placements and
returns a choice or every refusal. Time and randomness never enter.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement.filters import (
    ENGINE_HINTS,
    NEVER,
    NOT_NOW,
    Choice,
    Member,
    PlacementResult,
    Refusal,
    devices,
    engine_refusal,
    mig_refusal,
)
from llmgw.placement.groups import place_group

__all__ = ["ENGINE_HINTS", "NEVER", "NOT_NOW", "Choice", "Member", "PlacementResult", "Refusal", "place"]


def place(
    model: ModelDef,
    nodes: Mapping[str, NodeInfo],
    placements: Iterable[Placement],
) -> PlacementResult:
    """Choose a node (and devices) for one more replica of `model`; with `profile.nodes > 1`,
    the nodes of one more multi-node replica."""
    placements = list(placements)
    mig = [r for name in sorted(nodes) if (r := mig_refusal(model, name)) is not None]
    if mig:
        return PlacementResult(None, tuple(mig))
    if model.profile.nodes > 1:
        return place_group(model, nodes, placements)
    used: dict[str, set[int]] = {}
    same_model: dict[str, int] = {}
    for p in placements:
        used.setdefault(p.node, set()).update(p.gpus)
        if p.model == model.name:
            same_model[p.node] = same_model.get(p.node, 0) + 1
    refusals: list[Refusal] = []
    choices: list[Choice] = []
    for name in sorted(nodes):
        outcome = _fit(model, nodes[name], used.get(name, set()), same_model.get(name, 0))
        if isinstance(outcome, Refusal):
            refusals.append(outcome)
        else:
            choices.append(outcome)
    if not choices:
        return PlacementResult(None, tuple(refusals))
    # The best score; ties go to the alphabetically first node, for reproducible plans.
    return PlacementResult(min(choices, key=lambda c: (-c.score, c.node)), tuple(refusals))


def _fit(model: ModelDef, node: NodeInfo, used: set[int], same_model: int) -> Choice | Refusal:
    prof = model.profile
    # Replicas of one model prefer nodes that hold none yet: losing a node must not
    # take a whole model down. Worth 50 of 100, so it always outranks bin-packing.
    spread = 50.0 if same_model == 0 else 0.0
    if prof.cpu:
        # A CPU node is sized too: a model that needs more memory than the machine has never fits
        # there. A node that did not say its memory (0) is not refused on a guess.
        need = int(prof.memory_gib * (1 << 30))
        if need and 0 < node.memory_total < need:
            return Refusal(node.node, NEVER, "cpu_memory", f"needs {prof.memory_gib:g} GiB of memory, node has "
                                                           f"{node.memory_total / (1 << 30):.1f} GiB")
        return engine_refusal(model, node) or Choice(node.node, (), 50.0 + spread / (1 + same_model))
    # Hardware first: a node that can never run the model says so, whatever is installed.
    usable = devices(model, node)
    if isinstance(usable, Refusal):
        return usable
    missing = engine_refusal(model, node)
    if missing is not None:
        return missing
    free = [g for g in usable if g.index not in used]
    if len(free) < prof.gpus:
        return Refusal(node.node, NOT_NOW, "gpus_busy", f"needs {prof.gpus} free GPUs, {len(free)} free")
    chosen = tuple(sorted(g.index for g in free)[: prof.gpus])
    # Bin-pack: the fuller the node's usable GPUs after this replica, the better (whole nodes stay free).
    capacity = {g.index for g in node.gpus if g.usable}
    packed = 50.0 * (len(used & capacity) + prof.gpus) / max(len(capacity), 1)
    return Choice(node.node, chosen, packed + spread)
