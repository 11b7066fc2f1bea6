"""How placement ranks the nodes that fit: three scorers of 0..100 each, combined by `WEIGHTS`
(docs/placement.md has the same table; a test keeps them equal). Pure.

- spread: 100 on a node running no replica of the model, 0 on one that does (losing one node
  must not take a whole model down);
- weights: 100 on a node that holds the model's weights on its storage (`holdings`), else 0
  (never asked and looked-and-found-nothing are both 0: storage is a preference, never a filter);
- pack: how full the node's usable GPUs are once the replica is there (bin-packing keeps whole
  nodes free for big and multi-node replicas); for a CPU replica, 100 on a node with no usable
  GPU and 0 on a GPU node (CPU work keeps off the machines GPU replicas need).

Ties go to the first node name, so a plan is the same whatever order the nodes came in.
"""

from __future__ import annotations

from dataclasses import dataclass

# Spread outranks storage, storage outranks packing: a node with the weights but already
# running the model loses to one without either (0.3 + 0.2 = 0.5 ties at most; then spread wins).
WEIGHTS: dict[str, float] = {"spread": 0.5, "weights": 0.3, "pack": 0.2}


@dataclass(frozen=True)
class Score:
    """One node's scores for one replica, and their combination (0..100)."""

    spread: float
    weights: float
    pack: float

    @property
    def total(self) -> float:
        return combine(self.spread, self.weights, self.pack)

    def rank(self) -> tuple[float, float, float]:
        """Sort key, best first when negated: the total, then spread, then weights."""
        return (self.total, self.spread, self.weights)


def combine(spread: float, weights: float, pack: float) -> float:
    return WEIGHTS["spread"] * spread + WEIGHTS["weights"] * weights + WEIGHTS["pack"] * pack


def gpu_pack(used_usable: int, taking: int, capacity: int) -> float:
    """100 × the share of the node's usable GPUs placed once this replica takes `taking` more."""
    return 100.0 * min(used_usable + taking, capacity) / max(capacity, 1)


def cpu_pack(has_usable_gpu: bool) -> float:
    return 0.0 if has_usable_gpu else 100.0
