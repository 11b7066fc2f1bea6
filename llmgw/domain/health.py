"""Model health: failed starts counted per model, per replica slot and per node, and the rules
that read them (backoff per slot, nodes avoided per model, parking); pure, like `commands`.

The rule (docs/operations.md, "Parking and retry"):
- each failed start counts against its model, its replica slot and the node it ran on;
- a slot waits `retry_backoff(its failures in a row)` after its last failure before it is placed
  again (1, 2, 4 ... 30 s); the model's other slots are not held back by it;
- a node on which a model failed `health.avoid_node_after_failures` times in a row is avoided
  for that model for `node_avoid_s`: placement tries every other node first (a preference, so a
  model that fits only there is still tried there, and parks by the next rule);
- the model parks at `health.park_after_failures` failures in a row across its slots. A replica
  that was already ready does not break the row (it says nothing of the failing ones): only one
  placed after the model's last failure that becomes ready does, and clears its slot and node.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, ModelHealth, Strikes
from llmgw.domain.timeouts import TIMEOUTS, Timeouts

ERROR_MAX_CHARS = 2000
SLOT_MAX = 1_000_000


def retry_backoff(failures_in_row: int, timeouts: Timeouts = TIMEOUTS) -> float:
    """Seconds to wait after the n-th failed start before placing again: 1, 2, 4, ... 30 by default."""
    if failures_in_row <= 0:
        return 0.0
    return min(timeouts.start_backoff_first_s * 2.0 ** (failures_in_row - 1), timeouts.start_backoff_max_s)


def slot_wait(health: ModelHealth, slot: int, now: float, timeouts: Timeouts = TIMEOUTS) -> float:
    """Seconds left before slot `slot` may be placed again (0: now)."""
    strikes = health.slot(slot)
    if strikes is None:
        return 0.0
    return max(0.0, strikes.last_failure_at + retry_backoff(strikes.failures_in_row, timeouts) - now)


def avoided_nodes(state: ClusterState, health: ModelHealth, now: float,
                  timeouts: Timeouts = TIMEOUTS) -> dict[str, Strikes]:
    """The nodes placement should keep this model off now: each failed it too often in a row,
    and the last time less than `node_avoid_s` ago. By node name."""
    limit = int(effective(state.settings, "health.avoid_node_after_failures"))
    return {s.key: s for s in health.nodes
            if s.failures_in_row >= limit and now - s.last_failure_at < timeouts.node_avoid_s}


def ready_clears(health: ModelHealth, slot: int, node: str, placed_at: float) -> bool:
    """Whether a replica of (slot, node, placed_at) becoming ready changes this health; the
    reconciler commits `health.ready` only then, so a steady state commits nothing."""
    if health.parked:
        return False
    return (health.slot(slot) is not None or health.node(node) is not None
            or (health.failures_in_row > 0 and placed_at >= health.last_failure_at))


def _bump(strikes: tuple[Strikes, ...], key: str, error: str, at: float) -> tuple[Strikes, ...]:
    old = next((s for s in strikes if s.key == key), None)
    count = old.failures_in_row + 1 if old else 1
    kept = [s for s in strikes if s.key != key]
    return tuple(sorted([*kept, Strikes(key, count, error, at)], key=lambda s: s.key))


def _drop(strikes: tuple[Strikes, ...], key: str) -> tuple[Strikes, ...]:
    return tuple(s for s in strikes if s.key != key)


def _with(s: ClusterState, model: str, health: ModelHealth) -> ClusterState:
    if health == ModelHealth():
        table = {k: v for k, v in s.health.items() if k != model}
    else:
        table = s.health | {model: health}
    return replace(s, health=MappingProxyType(table))


# --- the commands' checks and changes (their constructors are in `commands`) ------------------


def slot_problem(c: dict[str, Any]) -> str | None:
    """What is wrong with a command's `slot`, if anything (it is optional)."""
    if "slot" in c and not (type(c["slot"]) is int and 0 <= c["slot"] <= SLOT_MAX):
        return f"slot must be a whole number from 0 to {SLOT_MAX}"
    return None


def fields_problem(c: dict[str, Any]) -> str | None:
    """What is wrong with a health command's optional slot, node and placement time."""
    node, placed_at = c.get("node", ""), c.get("placed_at", 0.0)
    if not isinstance(node, str):
        return "node must be a string"
    if isinstance(placed_at, bool) or not isinstance(placed_at, (int, float)) or not math.isfinite(placed_at):
        return "placed_at must be a finite time"
    return slot_problem(c)


def start_failed(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """`health.start_failed`: one more failure of the model, and of its slot and node when the
    command names them (commands logged before slots existed do not: the model's count only)."""
    model, error = c["model"], str(c.get("error", ""))[:ERROR_MAX_CHARS]
    if model not in s.models:
        return s, {"parked": False}
    old = s.model_health(model)
    failures = old.failures_in_row + 1
    parked = old.parked or failures >= int(effective(s.settings, "health.park_after_failures"))
    slots, nodes = old.slots, old.nodes
    if "slot" in c:
        slots = _bump(slots, str(c["slot"]), error, at)
    if c.get("node"):
        nodes = _bump(nodes, c["node"], error, at)
    health = ModelHealth(failures, parked, error, at, slots, nodes)
    result = {"parked": parked, "failures_in_row": failures}
    return _with(s, model, health), result


def ready(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """`health.ready`: a replica of the model serves. Naming its slot, node and placement time, it
    clears that slot and node, and the model's row only when placed after the last failure (see
    `ready_clears`); without them (logged before slots existed), it clears the model's health.
    A parked model stays parked either way."""
    model = c["model"]
    old = s.health.get(model)
    if old is None or old.parked:
        return s, {}
    if "slot" not in c:
        return _with(s, model, ModelHealth()), {}
    slots, nodes = _drop(old.slots, str(c["slot"])), _drop(old.nodes, str(c.get("node", "")))
    if float(c.get("placed_at", 0.0)) >= old.last_failure_at:
        health = ModelHealth(slots=slots, nodes=nodes)
    else:
        health = replace(old, slots=slots, nodes=nodes)
    return _with(s, model, health), {}
