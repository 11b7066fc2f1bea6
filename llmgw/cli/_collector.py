"""The cyclic garbage collector of a long-running llmgw process (control plane, agent, gateway, `up`,
`sim-fleet`), set once before its loop starts.

CPython's defaults (a young collection every 700 container allocations) suit a script, not a server that
holds a large, slowly changing heap: a leader of 1,000 nodes keeps some 400,000 objects, and the summaries,
reports and streams it makes every second lived just long enough to be promoted, so a full collection (every
object scanned, the event loop stopped) ran every 3 s and took 0.3-0.5 s on a 2-core box: the p95 of its
cheapest route was 635 ms (tests/bench/fleet.py, docs/performance.md). Here:
- what the start made (modules, the CLI, the configuration) is collected once and frozen: never scanned again;
- the young generation is collected every `YOUNG` allocations, so what a request or a report makes dies young
  (most of it freed by reference counting, never collected at all) instead of being promoted and scanned in
  full later. Cycles are still collected: later, and in fewer, larger young passes.
"""

from __future__ import annotations

import gc

YOUNG = 50_000  # container allocations (less deallocations) between two collections of the youngest generation
MIDDLE = 20  # young collections between two of the middle generation
OLD = 10  # middle collections before a full one is considered (CPython then also waits for 25% more old objects)


def settle() -> None:
    """Before the loop: collect and freeze what the start made; then the thresholds above."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
