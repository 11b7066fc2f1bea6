"""What the journal's fsync policy costs: sequential commits through a one-member Raft store,
one at a time, per policy. `measure_commits` is what a benchmark calls; run this module to
print the table: `.venv/bin/python -m tests.support.fsync_cost [--commits N] [--dir D]`."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from llmgw.domain import commands
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from tests.support.processes import free_port
from llmgw.store import RaftStore
from llmgw.store.journal import FSYNC_POLICIES, FsyncPolicy


@dataclass(frozen=True)
class CommitCost:
    fsync: str
    commits: int
    per_s: float  # sequential commits per second
    p50_ms: float
    p99_ms: float


async def measure_commits(state_dir: Path, fsync: FsyncPolicy, commits: int = 500,
                          timeouts: Timeouts = TIMEOUTS) -> CommitCost:
    """Commit `commits` commands one after another into a fresh one-member store in `state_dir`
    (on the disk being measured), each awaited before the next; the wall time of each."""
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=state_dir, fsync=fsync,
                      timeouts=timeouts)
    await store.start()
    try:
        await store.wait_ready()
        for i in range(20):  # warm up: connections, caches, the first journal pages
            await store.submit(commands.put_setting("guard.enabled", bool(i % 2), float(i)))
        took: list[float] = []
        start = time.perf_counter()
        for i in range(commits):
            t0 = time.perf_counter()
            await store.submit(commands.put_setting("guard.enabled", bool(i % 2), float(i)))
            took.append(time.perf_counter() - t0)
        total = time.perf_counter() - start
    finally:
        store.close()
    took.sort()
    return CommitCost(fsync, commits, commits / total, statistics.median(took) * 1000,
                      took[min(len(took) - 1, int(len(took) * 0.99))] * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--dir", type=Path, default=None, help="where the journals go (default: a temp dir)")
    args = parser.parse_args()
    print(f"{'fsync':<8} {'commits':>8} {'commits/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for policy in FSYNC_POLICIES:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            cost = trio.run(measure_commits, Path(tmp), policy, args.commits)  # type: ignore[arg-type]
        print(f"{cost.fsync:<8} {cost.commits:>8} {cost.per_s:>10.0f} {cost.p50_ms:>8.2f} {cost.p99_ms:>8.2f}")


if __name__ == "__main__":
    main()
