"""`GET /api/v1/status` of a live control plane (`llmgw control`, a process) with 200 simulated nodes
(`llmgw sim-fleet`, a process) against the same at 10 nodes, in one run, printing the ratio.

Run: `.venv/bin/python tests/bench/fleet.py [--nodes 200] [--baseline 10] [--models 20] [--repeat 30]`.
The control plane first serves `--baseline` nodes; a second fleet then adds the rest (its nodes
numbered on), so no node is lost in between. `--models` sim models of 1 or 2 GPUs each are placed
on the first nodes, and one `--fail-start` model parks: the status has replicas, failures and a
warning to say, not an empty fleet. Each figure is over `--repeat` requests one after another on
one kept-alive connection: the median and the 95th percentile; `GET /api/v1/settings` is the floor
(the same route machinery and key check, a small document, no summary), and the member table,
which every status includes, is timed on its own. Exits 1 when the median at `--nodes` is
over the goal (300 ms).
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

GOAL_MS = 300.0
KEY = "sk-bench-fleet"
SETTLE_S = 2.0  # after the nodes are in: the reconciler places, engines start, failures park


def fleet(control: str, nodes: int, first: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "llmgw", "sim-fleet", "--control", control, "--nodes", str(nodes),
            "--first", str(first), "--gpus-per-node", "8", "--class", "h100-80g", "--fabric", "ib-a",
            "--fabric", "ib-b", "--storage-holds", "model-01"]
    with log.open("ab") as out:
        # LLMGW_KEY: the operator's admin key, with which the fleet makes each node's join token.
        return subprocess.Popen(argv, env={**os.environ, "LLMGW_KEY": KEY}, stdout=out, stderr=subprocess.STDOUT)


def wait_for(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise SystemExit(f"gave up waiting for {what} after {timeout:g} s")


def connected(api: httpx.Client) -> int:
    try:
        r = api.get("/api/v1/nodes")
    except httpx.HTTPError:
        return -1
    return sum(1 for n in r.json()["nodes"] if n["state"] == "connected") if r.status_code == 200 else -1


def timed(api: httpx.Client, path: str, repeat: int) -> tuple[float, float, int]:
    """Median and 95th percentile in ms, and the body's size in bytes."""
    api.get(path).raise_for_status()  # warm: the connection, the first pass's caches
    times, size = [], 0
    for _ in range(repeat):
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
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=10)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    if not 0 < args.baseline < args.nodes:
        raise SystemExit("--baseline must be above 0 and below --nodes")
    rows: list[tuple[str, float, float, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        control = Member("control", root / "control")
        fleets: list[subprocess.Popen[bytes]] = []
        try:
            control.start([], env={"LLMGW_ADMIN_KEY": KEY})
            with httpx.Client(base_url=control.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as api:
                wait_for("the control plane", lambda: connected(api) == 0, 60)
                add_models(api, args.models)
                for label, count, first in (("baseline", args.baseline, 1),
                                            ("fleet", args.nodes - args.baseline, args.baseline + 1)):
                    began = time.monotonic()
                    fleets.append(fleet(control.url, count, first, root / "fleet.log"))
                    want = first + count - 1
                    wait_for(f"{want} nodes connected", lambda: connected(api) == want, 120)
                    print(f"{want} nodes connected in {time.monotonic() - began:.1f} s ({label})")
                    time.sleep(SETTLE_S)
                    if label == "baseline":
                        rows.append(("GET /api/v1/settings (floor)", *timed(api, "/api/v1/settings", args.repeat)))
                        # The member table is part of every status (each member asked over HTTP).
                        rows.append(("GET /api/v1/cluster/members", *timed(api, "/api/v1/cluster/members",
                                                                           args.repeat)))
                    rows.append((f"GET /api/v1/status, {want} nodes", *timed(api, "/api/v1/status", args.repeat)))
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
    at_nodes, at_base = rows[-1][1], rows[-2][1]
    print(f"ratio status {args.nodes}/{args.baseline} nodes: {at_nodes / at_base:.1f}x "
          f"({args.nodes / args.baseline:.0f}x the nodes); over the floor: {at_nodes / rows[0][1]:.1f}x")
    ok = at_nodes <= GOAL_MS
    print(f"{'PASS' if ok else 'FAIL'}: status at {args.nodes} nodes {at_nodes:.1f} ms median (goal {GOAL_MS:.0f} ms)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
