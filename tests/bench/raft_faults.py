"""The Raft fault campaign, long: the rounds of tests/integration/test_raft_faults.py, N times, on
three real `llmgw control` processes; then a summary (rounds, faults by kind, acknowledged writes,
lost, duplicated, unknown outcomes, failover) and a table per fault kind.

Run: `.venv/bin/python tests/bench/raft_faults.py [--rounds 1000] [--seed N] [--keep-going] [--netns]`.
Without `--netns` the members run on loopback and the faults are the processes' (kill, pause,
restart all); a round takes 2-3 s (about 45 min for 1,000). With `--netns` (root: network
namespaces) each member runs in a namespace of its own with failpoints on, and the faults are
those and the network's and the disk's (tests/support/campaign.py, NET_FAULTS: partitions of the
leader, a standby, one way, a bridge; Raft messages dropped and delayed; clock jumps; power loss;
bit flips while down, then a rejoin; a membership change during a fault; overlapping faults);
each start of a member draws its journal's compaction threshold (40 entries or 5,000), so
snapshots are taken and sent too. A round takes 3-10 s there (about 2 h for 1,000).

`--parallel K` runs K campaigns at once, each on a cluster of its own (seeds N, N+1, ...; the
rounds shared out), and prints one summary and one table for them all: the rounds mostly wait on
elections and timeouts, so three at once on two cores take about a third of the time.

Exit status 1 when a round failed; the seed is printed first, so `--seed N` replays the same
faults and operations (the timing, and so the interleaving, is the machine's). The members' logs
stay in the printed directory on failure.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.campaign import (FAULTS, NET_FAULTS, RoundConfig, RoundResult, Summary, campaign,  # noqa: E402
                                     low_compaction)
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.netns import Fabric, in_own_netns  # noqa: E402


async def run(args: argparse.Namespace, root: Path, fabric: Fabric | None = None) -> bool:
    cluster = Cluster(root, fabric=fabric, failpoints=fabric is not None)
    if fabric is not None:
        cluster.every_start = low_compaction(random.Random(args.seed))
    faults = FAULTS + NET_FAULTS if fabric is not None else FAULTS
    if args.only:
        unknown = sorted(set(args.only) - set(faults))
        if unknown:
            raise SystemExit(f"--only {unknown}: no such fault here (the faults: {', '.join(faults)})")
        faults = tuple(args.only)
    started = time.monotonic()
    config = RoundConfig(clients=args.clients, seconds=args.seconds)

    so_far = Summary()

    def progress(res: RoundResult) -> None:
        so_far.add(res)
        if args.table_every and res.number % args.table_every == 0 and res.number < args.rounds:
            print("\n".join(["", f"after {res.number} rounds:", *so_far.table(), ""]), flush=True)
        mark = "FAILED" if res.failures else "ok"
        if res.failures or args.verbose or res.number % 25 == 0:
            failover = f" failover {res.failover_s:.2f} s" if res.failover_s is not None else ""
            settle = f" settled {res.settle_s:.2f} s" if res.settle_s is not None else ""
            print(f"round {res.number:>5} {res.fault:<17} {mark:<6} acknowledged {res.acked:>3} "
                  f"reads {len(res.reads):>3}{failover}{settle}  ({time.monotonic() - started:.0f} s)", flush=True)
            if args.verbose and res.notes:
                print("    " + "; ".join(res.notes), flush=True)
        for failure in res.failures:
            print(f"    {failure}", flush=True)

    try:
        await cluster.start()
        summary = await campaign(cluster, args.rounds, args.seed, config, stop_at_failure=not args.keep_going,
                                 on_round=progress, faults=faults)
    finally:
        cluster.close()
    if args.summary_out:
        args.summary_out.write_text(json.dumps(summary.to_doc()))
    report(summary, started, f"--seed {args.seed}")
    return not summary.failures


def report(summary: Summary, started: float, replay: str) -> None:
    print()
    print("\n".join(summary.lines()))
    print()
    print("\n".join(summary.table()))
    print(f"time:                      {time.monotonic() - started:.0f} s")
    if summary.failures:
        print(f"\nFAILED: {len(summary.failures)} failures; replay with {replay}")


def in_parallel(args: argparse.Namespace, root: Path) -> bool:
    """K children of this runner, each a campaign on its own cluster; one summary of them all."""
    started = time.monotonic()
    share = [args.rounds // args.parallel + (i < args.rounds % args.parallel) for i in range(args.parallel)]
    children = []
    for i, rounds in enumerate(share):
        argv = [sys.executable, __file__, "--rounds", str(rounds), "--seed", str(args.seed + i),
                "--clients", str(args.clients), "--seconds", str(args.seconds), "--dir", str(root),
                "--table-every", "0", "--summary-out", str(root / f"summary-{i}.json")]
        argv += [a for kind in args.only for a in ("--only", kind)]
        argv += ["--keep-going"] * args.keep_going + ["--verbose"] * args.verbose + ["--netns"] * args.netns
        log = root / f"campaign-{i}.log"
        print(f"campaign {i}: {rounds} rounds, --seed {args.seed + i}, output in {log}", flush=True)
        with log.open("w") as out:
            children.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
    shown = ""
    while any(c.poll() is None for c in children):
        time.sleep(1.0)
        lines = " | ".join(_last_round(root / f"campaign-{i}.log") for i in range(len(children)))
        if lines != shown:
            print(f"({time.monotonic() - started:.0f} s) {lines}", flush=True)
            shown = lines
    summary = Summary()
    missing = []
    for i, child in enumerate(children):
        out = root / f"summary-{i}.json"
        if out.exists():
            summary.merge(Summary.from_doc(json.loads(out.read_text())))
        else:
            missing.append(f"campaign {i} ended ({child.returncode}) without a summary: see {root}/campaign-{i}.log")
    summary.failures += missing
    report(summary, started, "--seed S for the failed campaign's seed (above)")
    return not summary.failures and all(c.returncode == 0 for c in children)


def _last_round(log: Path) -> str:
    rounds = [line for line in log.read_text().splitlines() if line.startswith("round")]
    return " ".join(rounds[-1].split()[:3]) if rounds else "starting"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent writers (and readers)")
    parser.add_argument("--seconds", type=float, default=1.2, help="how long each round starts operations")
    parser.add_argument("--keep-going", action="store_true", help="go on after a failed round")
    parser.add_argument("--verbose", action="store_true", help="a line per round (default: every 25th)")
    parser.add_argument("--dir", type=Path, default=None, help="where the members' state dirs go")
    parser.add_argument("--table-every", type=int, default=100, help="print the table so far every N rounds (0: no)")
    parser.add_argument("--netns", action="store_true",
                        help="members in network namespaces, with the network's and the disk's faults (root)")
    parser.add_argument("--only", action="append", default=[], metavar="FAULT",
                        help="draw only this fault kind (again for more), e.g. --only partition-leader")
    parser.add_argument("--parallel", type=int, default=1, help="campaigns at once, each on its own cluster")
    parser.add_argument("--summary-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    print(f"seed {args.seed}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="llmgw-raft-faults-", dir=args.dir))
    if args.parallel > 1:
        ok = in_parallel(args, root)
    elif args.netns:
        outcome: list[bool] = []

        def body() -> None:
            fabric = Fabric()
            try:
                outcome.append(trio.run(run, args, root, fabric))
            finally:
                fabric.close()

        in_own_netns(body)
        ok = outcome[0]
    else:
        ok = trio.run(run, args, root)
    if ok:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"the members' logs: {root}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
