"""Model health: the rules that read the failed starts counted per model, per replica slot and per
node (backoff per slot, nodes avoided per model, parking); pure. The health commands that count
them (`health.start_failed`, `health.ready`) live in `commands/health.py`.

The rule (docs/operations.md, "Parking and retry"):
- each failed start counts against its model, its replica slot and the node it ran on;
- a slot waits `retry_backoff(its failures in a row)` after its last failure before it is placed
  again (1, 2, 4 ... 30 s); the model's other slots are not held back by it;
- a node on which a model failed `health.avoid_node_after_failures` times in a row is avoided
  for that model for `node_avoid_s`: placement tries every other node first (a preference, so a
  model that fits only there is still tried there, and parks by the next rule);
- the model parks at `health.park_after_failures` failures in a row across its slots. A replica
  that was already ready does not break the row (it says nothing of the failing ones): only one
  placed after the model's last failure that becomes ready does, and clears its slot and node;
- readiness counts once it has lasted `stable_ready_s` (`steady`): a replica that serves a moment
  and fails (a flap) breaks nothing and its failure is one more in the row, so engines that come
  up and die, over and over, park their model like engines that never come up. A flap's failure
  says how long it served (`flap_of`), and the model's health how many of its row were flaps.
"""

from __future__ import annotations

from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, ModelHealth, Strikes
from llmgw.domain.timeouts import TIMEOUTS, Timeouts

# The store level that brought flaps (`ModelHealth.flaps`, a start failure's `ready_s`): the leader
# says a failure was a flap only once every member of its group reads it.
FLAPS_LEVEL = 3


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


def steady(ready_since: float, now: float, timeouts: Timeouts = TIMEOUTS) -> bool:
    """Whether a replica ready since `ready_since` has served long enough for its readiness to
    break its model's row (`stable_ready_s`)."""
    return now - ready_since >= timeouts.stable_ready_s


def flap_of(ready_s: float | None, timeouts: Timeouts = TIMEOUTS) -> float | None:
    """A failed replica that served `ready_s` seconds first (None: it never served, or its agent
    does not say): that time when it is a flap (under `stable_ready_s`), else None."""
    if ready_s is None or ready_s >= timeouts.stable_ready_s:
        return None
    return ready_s


def flap_words(flaps: int, longest_s: float) -> str:
    """How the flaps of a row read: "ready for 3 s at most, then failed: 5 times" (0.4 s: tenths
    under 10 s)."""
    times = "once" if flaps == 1 else f"{flaps} times"
    served = f"{longest_s:.1f}".rstrip("0").rstrip(".") if longest_s < 10 else f"{longest_s:.0f}"
    return f"ready for {served} s at most, then failed: {times}"
