"""Placement (S2): filter nodes with a named reason, score the rest, pick one (or, for a
multi-node replica, one set of whole nodes in one fabric: `placement.groups`).

Pure: it reads a model, the nodes' inventories and the current placements and returns a
choice or every refusal. Time and randomness never enter. `place` is the one-call entry;
a plan of many placements builds one `FleetView` and adds each placement to it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import Placement
from llmgw.placement.filters import (
    ENGINE_HINTS,
    FITS,
    NEVER,
    NOT_NOW,
    REASONS,
    Choice,
    Member,
    Need,
    PlacementResult,
    Refusal,
    Verdict,
)
from llmgw.placement.fleet import FleetView
from llmgw.placement.scores import WEIGHTS, Score

__all__ = [
    "ENGINE_HINTS", "FITS", "NEVER", "NOT_NOW", "REASONS", "WEIGHTS", "Choice", "FleetView", "Member", "Need",
    "PlacementResult", "Refusal", "Score", "Verdict", "place",
]


def place(
    model: ModelDef,
    nodes: Mapping[str, NodeInfo],
    placements: Iterable[Placement],
    *,
    models: Mapping[str, ModelDef] | None = None,
    sources: Mapping[str, Mapping[str, Any]] | None = None,
    pending: Iterable[str] = (),
    cordoned: Iterable[str] = (),
) -> PlacementResult:
    """Choose a node (and devices) for one more replica of `model`, with every other node's
    refusal; with `profile.nodes > 1`, the nodes of one more multi-node replica. `models` sizes
    the replicas already placed (see `FleetView`); `sources`: `Observed.sources`, for memory estimates;
    `pending`: nodes waiting for approval; `cordoned`: nodes cordoned or draining (`ClusterState.cordoned_nodes`)."""
    return FleetView(nodes, placements, {**(models or {}), model.name: model}, sources,
                     pending, cordoned).place(model, explain=True)
