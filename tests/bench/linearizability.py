"""How long the linearizability checker takes on histories a real dict produced, by size, keys,
clients and share of unknown outcomes; and on the same histories with one read made impossible.

Run: `.venv/bin/python tests/bench/linearizability.py [--repeat 3] [--seed 1] [--timeout 10]`. Each
figure is the median over `--repeat` runs of one seeded history (the unit tests judge verdicts, not
speed). The search is exponential in how many operations on one key overlap in time ("open" is the
largest number at once): many keys and a few clients per key stay fast; one hot key with dozens of
clients gives up at the timeout (verdict "unknown", never "ok").
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.linearizability import (  # noqa: E402
    KV_MODEL,
    KvInput,
    KvOutput,
    Operation,
    Verdict,
    check,
    random_plan,
    run_on_dict,
)

SHAPES = [  # (operations, keys, clients, unknown share)
    (500, 20, 8, 0.0),
    (2_000, 20, 8, 0.0),
    (2_000, 20, 8, 0.05),
    (10_000, 20, 8, 0.05),
    (50_000, 50, 16, 0.05),
    (2_000, 1, 8, 0.05),
    (2_000, 1, 12, 0.05),
    (2_000, 1, 16, 0.05),
    (2_000, 1, 32, 0.05),
]


def _timed(history: list[Operation[KvInput, KvOutput]], repeat: int, timeout: float) -> tuple[float, Verdict]:
    times, verdict = [], Verdict.UNKNOWN
    for _ in range(repeat):
        start = time.perf_counter()
        verdict = check(KV_MODEL, history, timeout=timeout).verdict
        times.append(time.perf_counter() - start)
        if verdict is Verdict.UNKNOWN:
            break  # the same search would give up again
    return statistics.median(times), verdict


def _most_open(history: list[Operation[KvInput, KvOutput]]) -> int:
    """The most operations on one key in flight at once (calls and returns swept in time order)."""
    events = sorted(((t, kind, o.input.key) for o in history if o.return_time is not None
                     for t, kind in ((o.call_time, 1), (o.return_time, -1))),
                    key=lambda e: (e[0], -e[1]))  # touching operations count as overlapping
    now: dict[str, int] = {}
    most = 0
    for _, kind, key in events:
        now[key] = now.get(key, 0) + kind
        most = max(most, now[key])
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per check before 'unknown'")
    args = parser.parse_args()
    print(f"{'ops':>7} {'keys':>5} {'clients':>7} {'unknown':>7} {'open':>5} │ {'valid: ms':>10} {'verdict':>8} │ "
          f"{'one bad read: ms':>16} {'verdict':>8}")
    for ops, keys, clients, unknown in SHAPES:
        rng = random.Random(args.seed)
        history = run_on_dict(random_plan(rng, ops, keys=keys, clients=clients, unknown=unknown))
        good_s, good = _timed(history, args.repeat, args.timeout)
        reads = [n for n, o in enumerate(history) if o.input.op == "get" and not o.pending]
        n = rng.choice(reads)
        broken = [*history[:n], dataclasses.replace(history[n], output="never-written"), *history[n + 1:]]
        bad_s, bad = _timed(broken, args.repeat, args.timeout)
        print(f"{ops:>7} {keys:>5} {clients:>7} {unknown:>7.0%} {_most_open(history):>5} │ "
              f"{good_s * 1e3:>10.1f} {good.value:>8} │ "
              f"{bad_s * 1e3:>16.1f} {bad.value:>8}")


if __name__ == "__main__":
    main()
