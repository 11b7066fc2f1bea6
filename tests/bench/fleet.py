"""`GET /api/v1/status` of a live control plane (`llmgw control`, a process) with simulated nodes
(`llmgw sim-fleet`, processes) at each of `--nodes` (200 and 1,000 by default) against the same at 10
nodes, in one run: the default document (aggregates and a page of each growing list) and the whole
one (`?full=1`, every row: the document before pages), their latency and size.

Run: `.venv/bin/python tests/bench/fleet.py [--nodes 200,1000] [--baseline 10] [--models 50] [--repeat 40]`.
The control plane first serves `--baseline` nodes; more fleets then add nodes up to each step (their
nodes numbered on), so no node is lost in between. `--models` sim models of 1 or 2 GPUs each are
placed on the first nodes, and one `--fail-start` model parks: the status has replicas, failures and
a warning to say, not an empty fleet. Each figure is over `--repeat` requests one after another on
one kept-alive connection: the median and the 95th percentile; `GET /api/v1/settings` at each step is
the floor (the same route machinery and key check, a small document, no summary: what the control
plane's loop, busy with that many agents' streams, adds to any request), and the member table,
which every status includes, is timed on its own. The control plane keeps the summary of a revision
for `status_cache_s` (1 s) while nothing changes: requests spaced `--gap` apart (0.25 s) rebuild it
every fourth one or so, so the 95th percentile counts builds. Exits 1 when the default document at
any step is over the goal: p95 above 150 ms or more than 1 MB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.cluster import Member  # noqa: E402

GOAL_P95_MS = 150.0
GOAL_BYTES = 1_000_000
KEY = "sk-bench-fleet"
SETTLE_S = 2.0  # after the nodes are in: the reconciler places, engines start, failures park
SETTLE_PER_NODE_S = 0.01  # and a little more per node: the last ones' first reports


def fleet(control: str, nodes: int, first: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "llmgw", "sim-fleet", "--control", control, "--nodes", str(nodes),
            "--first", str(first), "--gpus-per-node", "8", "--class", "h100-80g", "--fabric", "ib-a",
            "--fabric", "ib-b", "--storage-holds", "model-01"]
    with log.open("ab") as out:
        # LLMGW_KEY: the operator's admin key, with which the fleet makes each node's join token.
        return subprocess.Popen(argv, env={**os.environ, "LLMGW_KEY": KEY}, stdout=out, stderr=subprocess.STDOUT)


def wait_for(what: str, check: Any, timeout: float, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise SystemExit(f"gave up waiting for {what} after {timeout:g} s")


def connected(api: httpx.Client) -> int:
    """The nodes connected, from the status's counts (no row: asking for 1,000 nodes' rows ten times a second
    would take the control plane's CPU from the agents' streams, and they would drop)."""
    try:
        r = api.get("/api/v1/status?nodes=0&models=0&idle=0")
    except httpx.HTTPError:
        return -1
    return int(r.json()["node_counts"]["connected"]) if r.status_code == 200 else -1


def timed(api: httpx.Client, path: str, repeat: int, gap: float = 0.0) -> tuple[float, float, int]:
    """Median and 95th percentile in ms, and the body's size in bytes; `gap` seconds between requests."""
    api.get(path).raise_for_status()  # warm: the connection, the first pass's caches
    times, size = [], 0
    for _ in range(repeat):
        time.sleep(gap)
        began = time.perf_counter()
        r = api.get(path)
        times.append((time.perf_counter() - began) * 1000)
        r.raise_for_status()
        size = len(r.content)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))], size


def add_models(api: httpx.Client, count: int) -> None:
    for i in range(1, count + 1):
        gpus = 1 + i % 2
        doc = {"name": f"model-{i:02d}", "engine": "sim", "source": f"sim://model-{i:02d}",
               "profile": {"gpus": gpus, "tp": gpus}}
        api.post("/api/v1/models", json=doc).raise_for_status()
    api.post("/api/v1/models", json={"name": "broken", "engine": "sim", "source": "sim://broken",
                                     "args": ["--fail-start"], "profile": {"gpus": 1}}).raise_for_status()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="200,1000", help="the fleet sizes measured, in order")
    parser.add_argument("--baseline", type=int, default=10)
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between two requests of a figure")
    args = parser.parse_args()
    steps = [int(n) for n in args.nodes.split(",")]
    if not 0 < args.baseline < steps[0] or steps != sorted(set(steps)):
        raise SystemExit("--baseline must be above 0 and below the first of --nodes, given in increasing order")
    rows: list[tuple[str, float, float, int]] = []
    judged: list[tuple[int, float, int, float, int, float]] = []  # nodes, p95 and bytes default, full; floor p95
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        control = Member("control", root / "control")
        fleets: list[subprocess.Popen[bytes]] = []
        try:
            control.start([], env={"LLMGW_ADMIN_KEY": KEY})
            with httpx.Client(base_url=control.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as api:
                wait_for("the control plane", lambda: connected(api) == 0, 60)
                add_models(api, args.models)
                have = 0
                for want in (args.baseline, *steps):
                    began = time.monotonic()
                    fleets.append(fleet(control.url, want - have, have + 1, root / "fleet.log"))
                    wait_for(f"{want} nodes connected", lambda: connected(api) == want, 120 + want * 0.9, every=1.0)
                    have = want
                    print(f"{want} nodes connected in {time.monotonic() - began:.1f} s", flush=True)
                    time.sleep(SETTLE_S + want * SETTLE_PER_NODE_S)
                    # The floor: the same route machinery and key check, a small document, no summary; what the
                    # control plane's loop, busy with `want` agents' streams, adds to any request.
                    floor = timed(api, "/api/v1/settings", args.repeat, args.gap)
                    rows.append((f"settings (floor), {want} nodes", *floor))
                    if want == args.baseline:
                        # The member table is part of every status (each member asked over HTTP).
                        rows.append(("GET /api/v1/cluster/members", *timed(api, "/api/v1/cluster/members",
                                                                           args.repeat)))
                    default = timed(api, "/api/v1/status", args.repeat, args.gap)
                    full = timed(api, "/api/v1/status?full=1", args.repeat, args.gap)
                    rows.append((f"status, {want} nodes", *default))
                    rows.append((f"status?full=1, {want} nodes", *full))
                    for name, median, p95, size in (rows[-4], *rows[-2:]) if want == args.baseline else rows[-3:]:  # as it goes: a later step may not come
                        print(f"  {name}: median {median:.1f} ms, p95 {p95:.1f} ms, {size} bytes", flush=True)
                    if want != args.baseline:
                        judged.append((want, default[1], default[2], full[1], full[2], floor[1]))
        finally:
            for f in fleets:
                f.terminate()
            for f in fleets:
                try:
                    f.wait(15)
                except subprocess.TimeoutExpired:
                    f.kill()
            control.stop()
    print(f"{'request':<34}{'median ms':>11}{'p95 ms':>9}{'bytes':>10}")
    for name, median, p95, size in rows:
        print(f"{name:<34}{median:>11.1f}{p95:>9.1f}{size:>10}")
    ok = True
    for nodes, p95, size, full_p95, full_size, floor_p95 in judged:
        good = p95 <= GOAL_P95_MS and size <= GOAL_BYTES
        ok = ok and good
        print(f"{'PASS' if good else 'FAIL'}: status at {nodes} nodes p95 {p95:.1f} ms, {size} bytes (goal "
              f"{GOAL_P95_MS:.0f} ms, {GOAL_BYTES} bytes); full: p95 {full_p95:.1f} ms, {full_size} bytes "
              f"({full_p95 / p95:.1f}x the time, {full_size / size:.0f}x the bytes); the floor's p95 {floor_p95:.1f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
