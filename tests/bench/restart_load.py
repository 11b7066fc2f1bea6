"""What clients see while `llmgw restart` restarts the whole cluster (issue 21, point 4); prints one table.

A small cluster of real processes on loopback (tests/support/restart_load.py): one `llmgw control`, one
`llmgw agent` with a sim engine, and two gateways, `gw-a` (one process) and `gw-b` (`--workers 2`). Clients
(threads, each with its own pooled connections, as an SDK keeps them) send chat completions one after
another, plain and streamed in turn, through both gateways. First a **baseline** of `--baseline` s with
nothing restarting; then `llmgw restart` (the agent in place, the control plane, then each gateway process
one at a time: drain, and the program that runs next takes over the listening socket); the load runs
through it. For each period: requests sent, failed, p50 and p99 latency, and the ratios of the restart's
p50/p99/max to the baseline's, measured in the same run on the same machine. The max is the request that
waited longest: one whose new connection waited in a restarting gateway's queue (its drain, then the next
program's start and first table); a few such requests per gateway, too few to move the p99.

With `--compare`, each gateway is then restarted as before it could restart in place (SIGTERM, and the same
command again), under the same load: a third row.

Run: `.venv/bin/python tests/bench/restart_load.py [--clients 4] [--baseline 20] [--compare]` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.figures import pct, print_table  # noqa: E402
from tests.support.restart_load import GATEWAYS, Load, Outcome, restart_cluster  # noqa: E402


def row(label: str, outcomes: list[Outcome], base: list[Outcome] | None) -> list[str]:
    latencies = [o.latency_s for o in outcomes]
    failed = sum(1 for o in outcomes if o.error is not None)
    nan = float("nan")
    p50, p99, top = (pct(latencies, 0.5), pct(latencies, 0.99), max(latencies)) if latencies else (nan, nan, nan)
    cells = [label, str(len(outcomes)), str(failed), f"{p50 * 1000:.1f}", f"{p99 * 1000:.1f}", f"{top * 1000:.0f}"]
    if base:
        b = [o.latency_s for o in base]
        cells += [f"{p50 / pct(b, 0.5):.2f}", f"{p99 / pct(b, 0.99):.2f}", f"{top / max(b):.1f}"]
    else:
        cells += ["1.00", "1.00", "1.0"]
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (threads)")
    parser.add_argument("--baseline", type=float, default=20.0, help="seconds of load before the restart")
    parser.add_argument("--compare", action="store_true",
                        help="then restart each gateway as before it could restart in place (SIGTERM, started "
                             "again), under the same load, for comparison")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-restart-bench-") as tmp, restart_cluster(Path(tmp)) as cluster:
        before = cluster.gateways()
        with Load(cluster.gateway_urls, clients=args.clients) as load:
            time.sleep(2.0)  # connections made and warm: not part of the baseline
            t0 = time.monotonic()
            time.sleep(args.baseline)
            t1 = time.monotonic()
            done = cluster.restart()
            t2 = time.monotonic()
            after = cluster.gateways()
            t3 = t4 = t2
            if args.compare:
                time.sleep(2.0)  # settled again
                t3 = time.monotonic()
                for name in GATEWAYS:
                    cluster.stop_start(name)
                t4 = time.monotonic()
        if done.returncode != 0:
            sys.exit(f"llmgw restart failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n{cluster.logs()}")
        restarted = sorted(n for n in after if after[n]["started_at"] != before[n]["started_at"]
                           and after[n]["pid"] == before[n]["pid"])
        base, during = load.between(t0, t1), load.between(t1, t2)
        failures = [o.error for o in during + base if o.error is not None]
        old_way = load.between(t3, t4) if args.compare else []
    print(f"llmgw restart took {t2 - t1:.1f} s; gateway processes restarted in place (same pid, new start): "
          f"{', '.join(restarted) or 'none'}; {args.clients} clients, plain and streamed chat completions through "
          f"gw-a and gw-b")
    print_table([["period", "sent", "failed", "p50 ms", "p99 ms", "max ms", "p50 ratio", "p99 ratio", "max ratio"],
                 row(f"baseline ({t1 - t0:.0f} s)", base, None),
                 row(f"during restart ({t2 - t1:.0f} s)", during, base),
                 *([row(f"gateways stopped and started ({t4 - t3:.0f} s)", old_way, base)] if args.compare else [])])
    for error in failures[:5]:
        print(f"failed: {error}")
    if args.compare:
        print("gateways stopped and started (SIGTERM, the same command again: a restart before the handover), "
              "failures seen: " + "; ".join(sorted({str(o.error)[:90] for o in old_way if o.error})[:4]))


if __name__ == "__main__":
    main()
