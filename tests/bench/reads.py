"""What an admin API read costs now that each is confirmed by a majority (ReadIndex, issue 19); prints one table.

For each group size (`--members 1 3`: real `llmgw control` processes on loopback, `tests.support.cluster`),
one client (one keep-alive connection per member) sends, in turn and one at a time:

- `GET /health` on the leader: the baseline (public, answered from this member's own view: no key check,
  no round);
- `GET /api/v1/cluster/self` on the leader: a key check and a JSON document, still no round (a `local`
  route: what this member sees);
- `GET /api/v1/settings` on the leader: a key check, a JSON document, and the ReadIndex round (a probe to
  every voting member, answered by a majority, before the read is served);
- `GET /api/v1/settings` on a standby (3 members): forwarded to the leader, which confirms and answers.

Each row has p50/p99 and, against the baseline in the same run, the ratio of p50s and what the p50 adds.
The requests are interleaved (one of each per turn), so the machine's drift is shared by every row.

Run: `.venv/bin/python tests/bench/reads.py [--members 1 3] [--reads 500]` (about a minute).
Figures are from one run on this machine: compare the rows of one run, not across runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.cluster import Cluster, Member  # noqa: E402
from tests.support.figures import pct, print_table  # noqa: E402

BASELINE = "GET /health"


@dataclass
class Probe:
    """One kind of request, timed: `where` it is sent (leader, standby), `path`, and its times in seconds."""

    members: int
    where: str
    path: str
    member: Member
    took: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"GET {self.path}"


async def time_reads(cluster: Cluster, probes: list[Probe], reads: int) -> None:
    """`reads` turns; in each, one request of every probe, timed from send to the whole answer."""
    clients = {id(p.member): httpx.AsyncClient(base_url=p.member.url, headers=cluster.headers, timeout=10)
               for p in probes}
    try:
        for p in probes:  # one untimed request each: the connection is open before the clock runs
            (await clients[id(p.member)].get(p.path)).raise_for_status()
        for _ in range(reads):
            for p in probes:
                started = time.perf_counter()
                r = await clients[id(p.member)].get(p.path)
                p.took.append(time.perf_counter() - started)
                if r.status_code != 200:
                    raise AssertionError(f"{p.label} on the {p.where}: {r.status_code} {r.text}")
    finally:
        for client in clients.values():
            await client.aclose()


async def measure(root: Path, members: int, reads: int) -> list[Probe]:
    """Start a group of `members`, time the reads on its leader (and a standby), stop it."""
    cluster = Cluster(root / f"group-of-{members}", members)
    try:
        await cluster.start()
        await cluster.wait_settled()
        leader = await cluster.wait_for("a leader", cluster.leader, 30)
        probes = [Probe(members, "leader", "/health", leader),
                  Probe(members, "leader", "/api/v1/cluster/self", leader),
                  Probe(members, "leader", "/api/v1/settings", leader)]
        standby = next((m for m in cluster.members if m is not leader), None)
        if standby is not None:
            probes.append(Probe(members, "standby (forwarded)", "/api/v1/settings", standby))
        await time_reads(cluster, probes, reads)
        return probes
    finally:
        cluster.close()


def table(probes: list[Probe]) -> list[list[str]]:
    """One row per probe: p50/p99 in ms, and against the baseline of its group, the ratio and the p50 added."""
    rows = [["members", "sent to", "request", "p50 ms", "p99 ms", f"p50 / {BASELINE}", "p50 added"]]
    for p in probes:
        base = next(b for b in probes if b.members == p.members and b.path == "/health")
        p50, base50 = statistics.median(p.took), statistics.median(base.took)
        rows.append([str(p.members), p.where, p.label, f"{p50 * 1e3:.2f}", f"{pct(p.took, 0.99) * 1e3:.2f}",
                     "baseline" if p is base else f"{p50 / base50:.2f}x",
                     "" if p is base else f"{(p50 - base50) * 1e3:+.2f} ms"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 3], help="group sizes to measure")
    parser.add_argument("--reads", type=int, default=500, help="requests per row")
    args = parser.parse_args()
    started = time.monotonic()
    probes: list[Probe] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-reads-bench-") as tmp:
        for members in args.members:
            probes += trio.run(measure, Path(tmp), members, args.reads)
    rows = table(probes)
    print_table(rows)
    print(f"\n{args.reads} requests per row, interleaved; members on loopback, {os.cpu_count()} CPUs; "
          f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
