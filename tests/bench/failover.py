"""How long the control planes are without a leader when the leader goes, and how long a member cut
off takes to catch up after the heal (issue 19, point 6); prints one table.

Three real `llmgw control` processes, each in a network namespace of its own (tests/support/netns.py;
needs root). A writer keeps writing through the members that are not hit. Each
trial, from a settled group:

- `sigkill`: SIGKILL of the leader;
- `partition`: the leader's packets to and from both peers dropped at the hub (clients still reach it);

then, from the fault: **elected**, the first moment a survivor names a new leader (polled every 10 ms),
and **first commit**, the first acknowledged return of a write sent after the fault (what a client
sees: failover), and **shown**, from the election until the new leader's `/metrics` says
`llmgw_control_leader 1` and its status (what `ctl status` prints) names it. The writer sends a write every 20 ms, each on its own (many clients), so a try that
hangs on the cut leader does not hold back the next. The
killed member is started again, the cut one healed after `--hold` s, and the next trial waits until
the group is settled again. `heal` trials cut the leader off for `--heal-hold` s (10 s) under the same
write load, then time **caught up**: from the heal until the cut member has applied the new leader's
commit index of the heal moment (catch-up; the goal is 5 s), the writes going on meanwhile.

Run: `.venv/bin/python tests/bench/failover.py [--trials 30] [--heal-trials 5]` (about 4 minutes).
Figures are from one run on this machine: p50 and p99 are of the trials of that run.
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
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.cluster import Cluster, Member  # noqa: E402
from tests.support.figures import pct, print_table  # noqa: E402
from tests.support.netns import Fabric, in_own_netns  # noqa: E402

SETTING = "/api/v1/settings/placement.warn_interval_s"


@dataclass
class Times:
    kind: str
    elected: list[float] = field(default_factory=list)
    committed: list[float] = field(default_factory=list)
    settled: list[float] = field(default_factory=list)
    shown: list[float] = field(default_factory=list)


class Writer:
    """Writes a setting at a steady rate (a new write every `every_s`, each in a task of its own, as
    many clients would), through the members it is told to use, in turn."""

    def __init__(self, cluster: Cluster, every_s: float = 0.02) -> None:
        self.cluster = cluster
        self.every_s = every_s
        self.via: list[Member] = list(cluster.members)
        self.acked: list[tuple[float, float]] = []  # (sent, returned) of each acknowledged write
        self._n = 600
        # Set to stop: the writes in flight end on their own (each has a timeout). Cancelled instead, one
        # in its TLS handshake left its socket to the collector (httpcore closes on Exception only).
        self.stopping = trio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient(headers=self.cluster.headers, limits=httpx.Limits(max_connections=200)) as http:
            async with trio.open_nursery() as nursery:
                while not self.stopping.is_set():
                    self._n += 1
                    nursery.start_soon(self.one, http, self.via[self._n % len(self.via)], self._n)
                    await trio.sleep(self.every_s)

    async def one(self, http: httpx.AsyncClient, m: Member, value: int) -> None:
        sent = time.monotonic()
        try:
            r = await http.put(m.url + SETTING, json=value, timeout=2.0)
        except httpx.HTTPError:
            return
        if r.status_code == 200:
            self.acked.append((sent, time.monotonic()))

    def first_after(self, t: float) -> float | None:
        """From `t` to the return of the first acknowledged write sent after it."""
        later = [returned for sent, returned in self.acked if sent > t]
        return min(later) - t if later else None


class Views:
    """What the members say of themselves (`GET /api/v1/cluster/self`), over one kept client: a new
    client per poll would cost more than the poll (httpx builds a TLS context for each)."""

    def __init__(self, cluster: Cluster, http: httpx.AsyncClient) -> None:
        self.cluster = cluster
        self.http = http

    async def doc(self, m: Member) -> dict[str, Any] | None:
        try:
            r = await self.http.get(m.url + "/api/v1/cluster/self", timeout=0.5)
        except httpx.HTTPError:
            return None
        doc: dict[str, Any] | None = r.json() if r.status_code == 200 else None
        return doc

    async def leader_of(self, m: Member) -> str | None:
        doc = await self.doc(m)
        return None if doc is None else doc.get("leader")

    async def leader_among(self, members: list[Member]) -> Member | None:
        for m in members:
            doc = await self.doc(m)
            if doc is not None and doc["role"] == "leader":
                return m
        return None

    async def agreed_leader(self) -> Member | None:
        named = {await self.leader_of(m) for m in self.cluster.members}
        return self.cluster.by_addr(named.pop()) if len(named) == 1 else None


async def trial(cluster: Cluster, views: Views, fabric: Fabric, writer: Writer, kind: str, hold: float,
                times: Times) -> None:
    # A member healed after a cut comes back with a higher term and forces one more election (pysyncobj
    # has no pre-vote): the trial starts once one leader of one term has held for a second.
    while True:  # (the writer never stops, so the members are never at one revision for long: healthy will do)
        await cluster.wait_for("every member healthy", cluster.all_healthy, 60)
        old: Member = await cluster.wait_for("a leader every member names", views.agreed_leader, 30)
        term = (await views.doc(old) or {}).get("term")
        await trio.sleep(1.0)
        if await views.agreed_leader() is old and (await views.doc(old) or {}).get("term") == term:
            break
    survivors = [m for m in cluster.members if m is not old]
    writer.via = survivors
    await trio.sleep(0.3)  # the writer is on the survivors before the fault
    t0 = time.monotonic()
    if kind == "sigkill":
        cluster.kill(old)
    else:
        fabric.isolate(old.host, [m.host for m in survivors])

    async def elected() -> float | None:
        for m in survivors:
            named = await views.leader_of(m)
            if named is not None and named != old.raft_addr:
                return time.monotonic() - t0
        return None

    times.elected.append(await cluster.wait_for("a new leader", elected, 30, poll=0.01))
    elected_at = time.monotonic()

    async def shown() -> bool:
        """What an operator reads: a survivor's /metrics says it leads, and its status (`ctl status`) names it
        (whichever survivor leads by then: a first election may be followed by another)."""
        for m in survivors:
            try:
                metrics = await views.http.get(m.url + "/metrics", timeout=0.5)
                if "llmgw_control_leader 1.0" not in metrics.text:
                    continue
                # (the status asks every member, the lost one too: up to `member_probe_s` for its answer)
                status = await views.http.get(m.url + "/api/v1/status", timeout=10)
            except httpx.HTTPError:
                continue
            if status.status_code == 200 and status.json().get("cluster", {}).get("leader") == m.raft_addr:
                return True
        return False

    await cluster.wait_for("the new leader in /metrics and the status", shown, 30, poll=0.01)
    times.shown.append(time.monotonic() - elected_at)
    took = await cluster.wait_for("a write acknowledged after the fault", lambda: writer.first_after(t0), 30,
                                  poll=0.01)
    times.committed.append(took)
    if kind == "sigkill":
        cluster.start_member(old)
    else:
        await trio.sleep(max(0.0, hold - (time.monotonic() - t0)))
        new = await cluster.wait_for("a leader among the survivors", lambda: views.leader_among(survivors), 30)
        leading = await cluster.wait_for("the new leader's view", lambda: views.doc(new), 30)
        target = leading["commit_index"]
        fabric.heal()
        healed = time.monotonic()
        if kind == "heal":
            async def caught_up() -> bool:
                doc = await views.doc(old)
                return doc is not None and doc["ready"] and doc["applied_index"] >= target

            await cluster.wait_for("the cut member at the leader's commit index of the heal", caught_up, 60,
                                   poll=0.01)
            times.settled.append(time.monotonic() - healed)
    writer.via = list(cluster.members)


async def measure(root: Path, fabric: Fabric, trials: int, heal_trials: int, hold: float,
                  heal_hold: float) -> list[Times]:
    cluster = Cluster(root, fabric=fabric)
    results = [Times("sigkill"), Times("partition"), Times("heal")]
    try:
        await cluster.start()
        writer = Writer(cluster)
        async with httpx.AsyncClient(headers=cluster.headers) as http, trio.open_nursery() as nursery:
            views = Views(cluster, http)
            nursery.start_soon(writer.run)
            for _ in range(trials):
                await trial(cluster, views, fabric, writer, "sigkill", hold, results[0])
                await trial(cluster, views, fabric, writer, "partition", hold, results[1])
            for _ in range(heal_trials):
                await trial(cluster, views, fabric, writer, "heal", heal_hold, results[2])
            writer.stopping.set()
        return results
    finally:
        cluster.close()


def table(results: list[Times]) -> list[list[str]]:
    def fig(values: list[float]) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} / {pct(values, 0.99):.2f} / {max(values):.2f}"

    rows = [["fault", "trials", "elected p50 / p99 / max s", "first commit p50 / p99 / max s",
             "caught up after heal p50 / p99 / max s", "in /metrics and status after the election p50 / p99 / max s"]]
    names = {"sigkill": "SIGKILL of the leader", "partition": "the leader cut off",
             "heal": "the leader cut off, healed"}
    for t in results:
        rows.append([names[t.kind], str(len(t.elected)), fig(t.elected), fig(t.committed), fig(t.settled),
                     fig(t.shown)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30, help="trials of each of sigkill and partition")
    parser.add_argument("--heal-trials", type=int, default=5, help="trials of a long cut, then the heal")
    parser.add_argument("--hold", type=float, default=2.0, help="how long a partition trial's cut lasts (s)")
    parser.add_argument("--heal-hold", type=float, default=10.0, help="how long a heal trial's cut lasts (s)")
    parser.add_argument("--timeouts", default="", help="LLMGW_TIMEOUTS for the members, e.g. "
                                                     "raft_election_min_s=0.4,raft_election_max_s=1.4")
    args = parser.parse_args()
    if args.timeouts:
        os.environ["LLMGW_TIMEOUTS"] = args.timeouts  # the members inherit it
    started = time.monotonic()
    out: list[list[Times]] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-failover-bench-") as tmp:
        def body() -> None:
            fabric = Fabric()
            try:
                out.append(trio.run(measure, Path(tmp), fabric, args.trials, args.heal_trials, args.hold,
                                    args.heal_hold))
            finally:
                fabric.close()

        in_own_netns(body)
    rows = table(out[0])
    print_table(rows)
    print(f"\nthree members in network namespaces, {os.cpu_count()} CPUs, LLMGW_TIMEOUTS="
          f"{os.environ.get('LLMGW_TIMEOUTS', '')!r}; "
          f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
