"""The fault catalog, long: every fault of docs/faults.md several times, in random order, on one world (a control
plane, agents, sim engines, a webhook receiver) and one group of three control plane processes; each time it
must show in all its places within two reconcile ticks of being true and resolve once fixed
(tests/support/fault_catalog.py). Prints each run's timings, then the slowest per fault.

Run: `.venv/bin/python tests/bench/faults.py [--rounds 5] [--seed N] [--only agent_lost,no_quorum]`.
A round of the twelve takes about 40 s. Exit status 1 when a fault was not shown or not resolved in time.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.fault_catalog import FAULTS, Fault, GroupFault, run_world_fault  # noqa: E402
from tests.support.faults import Group, World  # noqa: E402

GROUP_TICK_S = 1.0  # the group's reconcile_tick_s (GROUP_TIMEOUTS leaves it at its default)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--only", default="", help="comma-separated fault ids (default: all)")
    parser.add_argument("--verbose", action="store_true", help="the world's own log lines too")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    names = [n for n in args.only.split(",") if n] or list(FAULTS)
    unknown = set(names) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    root = Path(tempfile.mkdtemp(prefix="llmgw-faults-"))
    print(f"seed {seed}; {args.rounds} round(s) of {len(names)} fault(s); state under {root}", flush=True)
    world = World(root / "world").start() if any(isinstance(FAULTS[n], Fault) for n in names) else None
    group = Group(root / "group").start() if any(isinstance(FAULTS[n], GroupFault) for n in names) else None
    worst: dict[str, float] = {}
    failed = 0
    try:
        for round_no in range(1, args.rounds + 1):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                fault = FAULTS[name]
                start = time.monotonic()
                try:
                    if isinstance(fault, Fault):
                        assert world is not None
                        took = run_world_fault(world, fault)
                        tick = world.timeouts.reconcile_tick_s
                    else:
                        assert group is not None
                        took = fault.run(group, GROUP_TICK_S)
                        tick = GROUP_TICK_S
                    settle = took["settle_s"]
                    late = (took["seen_s"] - took["first_s"] if settle is None else took["seen_s"] - settle)
                    ok = late <= 2 * tick
                except AssertionError as e:
                    print(f"round {round_no} {name}: FAILED: {e}", flush=True)
                    failed += 1
                    continue
                worst[name] = max(worst.get(name, 0.0), late)
                failed += not ok
                print(f"round {round_no} {name}: shown {took['seen_s']:.2f} s (past settling: {late:.2f} s, "
                      f"limit {2 * tick:g}), resolved {took['resolved_s']:.2f} s, {time.monotonic() - start:.1f} s in all"
                      + ("" if ok else "  LATE"), flush=True)
    finally:
        if world is not None:
            world.close()
        if group is not None:
            group.close()
    print("slowest past settling, per fault: " + ", ".join(f"{n} {s:.2f} s" for n, s in sorted(worst.items())))
    print(f"{failed} failure(s); seed {seed}" + (f"; the logs stay in {root}" if failed else ""))
    if not failed:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
