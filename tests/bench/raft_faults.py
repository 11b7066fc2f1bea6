"""The Raft fault campaign, long: the rounds of tests/integration/test_raft_faults.py, N times, on
three real `llmgw control` processes on loopback; then a summary (rounds, faults by kind,
acknowledged writes, lost, duplicated, unknown outcomes, failover after a SIGKILL of the leader).

Run: `.venv/bin/python tests/bench/raft_faults.py [--rounds 1000] [--seed N] [--keep-going]`.
A round takes 2-3 s (about 45 min for 1,000). Exit status 1 when a round failed; the seed is
printed first, so `--seed N` replays the same faults and operations (the timing, and so the
interleaving, is the machine's). The members' logs stay in the printed directory on failure.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.campaign import RoundConfig, RoundResult, campaign  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402


async def run(args: argparse.Namespace, root: Path) -> bool:
    cluster = Cluster(root)
    started = time.monotonic()
    config = RoundConfig(clients=args.clients, seconds=args.seconds)

    def progress(res: RoundResult) -> None:
        mark = "FAILED" if res.failures else "ok"
        if res.failures or args.verbose or res.number % 25 == 0:
            failover = f" failover {res.failover_s:.2f} s" if res.failover_s is not None else ""
            print(f"round {res.number:>5} {res.fault:<13} {mark:<6} acknowledged {res.acked:>3} "
                  f"reads {len(res.reads):>3}{failover}  ({time.monotonic() - started:.0f} s)", flush=True)
        for failure in res.failures:
            print(f"    {failure}", flush=True)

    try:
        await cluster.start()
        summary = await campaign(cluster, args.rounds, args.seed, config, stop_at_failure=not args.keep_going,
                                 on_round=progress)
    finally:
        cluster.close()
    print()
    print("\n".join(summary.lines()))
    print(f"time:                      {time.monotonic() - started:.0f} s")
    if summary.failures:
        print(f"\nFAILED: {len(summary.failures)} failures; replay with --seed {args.seed}")
    return not summary.failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent writers (and readers)")
    parser.add_argument("--seconds", type=float, default=1.2, help="how long each round starts operations")
    parser.add_argument("--keep-going", action="store_true", help="go on after a failed round")
    parser.add_argument("--verbose", action="store_true", help="a line per round (default: every 25th)")
    parser.add_argument("--dir", type=Path, default=None, help="where the members' state dirs go")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    print(f"seed {args.seed}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="llmgw-raft-faults-", dir=args.dir))
    ok = trio.run(run, args, root)
    if ok:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"the members' logs: {root}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
