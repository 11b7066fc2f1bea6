"""The health commands: `health.start_failed` (a replica failed to start) and `health.ready` (a
replica serves); their builders, stateless check and changes. The rule they keep (backoff per
slot, nodes avoided, parking) is `domain.health`'s, which reads what they count.

Each failed start counts against its model, and its replica slot and node when the command names
them; commands logged before slots existed do not, and count against the model only.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from llmgw.domain import levels
from llmgw.domain.commands.core import CommandError, check_slot, make, readonly, required, slot_field
from llmgw.domain.health import FLAPS_LEVEL
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, ModelHealth, Strikes

ERROR_MAX_CHARS = 2000


def start_failed(model: str, replica_id: str, error: str, at: float,
                 *, slot: int | None = None, node: str = "", ready_s: float | None = None) -> dict[str, Any]:
    """A replica failed to start: counted against the model, and its slot and node when given.
    `ready_s`: it was a flap, ready for that many seconds first (`domain.health.flap_of`); a command
    that says so is of store level `FLAPS_LEVEL`."""
    where = {**slot_field(slot), **({"node": node} if node else {})}
    if ready_s is None:
        return make("health.start_failed", at, model=model, replica_id=replica_id, error=error, **where)
    command = make("health.start_failed", at, model=model, replica_id=replica_id, error=error, ready_s=ready_s, **where)
    return levels.stamp(command, FLAPS_LEVEL)


def became_ready(model: str, at: float, *, slot: int | None = None, node: str = "",
                 placed_at: float | None = None) -> dict[str, Any]:
    """A replica serves: with its slot (node, placement time) it clears what `domain.health.ready_clears` says."""
    if slot is None:
        return make("health.ready", at, model=model)
    return make("health.ready", at, model=model, slot=slot, node=node, placed_at=placed_at or 0.0)


def check(c: dict[str, Any]) -> None:
    """Both health commands: the model, and the optional slot, node and placement time."""
    required(c, "model")
    node, placed_at = c.get("node", ""), c.get("placed_at", 0.0)
    if not isinstance(node, str):
        raise CommandError("bad_command", "node must be a string")
    ready_s = c.get("ready_s", 0.0)
    if isinstance(ready_s, bool) or not isinstance(ready_s, (int, float)) or not 0 <= ready_s < math.inf:
        raise CommandError("bad_command", "ready_s must be a finite number of seconds")
    if isinstance(placed_at, bool) or not isinstance(placed_at, (int, float)) or not math.isfinite(placed_at):
        raise CommandError("bad_command", "placed_at must be a finite time")
    check_slot(c)


def apply_start_failed(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """One more failure of the model, and of its slot and node when the command names them; the
    model parks at `health.park_after_failures` in a row."""
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
    flaps, flap_ready_s = old.flaps, old.flap_ready_s
    if "ready_s" in c:  # a flap: it served that long, then failed
        flaps, flap_ready_s = flaps + 1, max(flap_ready_s, float(c["ready_s"]))
    health = ModelHealth(failures, parked, error, at, slots, nodes, flaps, flap_ready_s)
    result = {"parked": parked, "failures_in_row": failures}
    return _with(s, model, health), result


def apply_ready(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """A replica of the model serves. Naming its slot, node and placement time, it clears that
    slot and node, and the model's row only when placed after the last failure (see
    `domain.health.ready_clears`); without them (logged before slots existed), it clears the model's
    health. A parked model stays parked either way."""
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
    return replace(s, health=readonly(table))
