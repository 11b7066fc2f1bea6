"""`GET /api/v1/status` in one process, through the admin app (ASGI, no sockets), at 200 and 1,000 simulated nodes
(as `llmgw sim-fleet` reports them: 8 H100s each, two fabrics, a held model) and 50 models: the default document
(aggregates and a page of each growing list) and the whole one (`?full=1`), each when every request builds the
summary (the clock moved past what a kept look may answer, `STALE` times `status_cache_s`: a new look each time)
and when it is kept (the same revision),
against what the route did before pages and the cache (the look and the whole document, built and written per
request) in the same run. The figures are the route's own work, without the network or other tasks of a live
control plane (`tests/bench/fleet.py` has those).

Run: `.venv/bin/python tests/bench/status.py [--nodes 200,1000] [--models 50] [--repeat 20]`.
Exits 1 when the default document built every time is over 150 ms at p95 or over 1 MB at any size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.control.api import make_app  # noqa: E402
from llmgw.control.context import Context  # noqa: E402
from llmgw.control.status_cache import STALE  # noqa: E402
from tests.support import status_world  # noqa: E402
from tests.support.status_world import Clock  # noqa: E402

GOAL_P95_MS = 150.0
GOAL_BYTES = 1_000_000
KEY = "sk-bench-status-0123456789"


def world(nodes: int, models: int) -> tuple[Context, Clock]:
    """A leader with `nodes` simulated nodes connected and `models` sim models placed on the first ones."""
    return status_world.world(nodes, models, KEY)


async def timed(ask: Callable[[], Awaitable[bytes]], repeat: int, between: Callable[[], None]) -> tuple[float, float, int]:
    """Median and 95th percentile in ms over `repeat` requests (`between` before each), and the body's size."""
    await ask()  # warm
    times, size = [], 0
    for _ in range(repeat):
        between()
        began = time.perf_counter()
        size = len(await ask())
        times.append((time.perf_counter() - began) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))], size


async def measure(nodes: int, models: int, repeat: int) -> list[tuple[str, float, float, int]]:
    ctx, clock = world(nodes, models)

    def rebuild() -> None:  # past what a kept look may answer: every request builds the summary again
        clock.now += ctx.timeouts.status_cache_s * (STALE + 1)

    async def before() -> bytes:  # the route before pages and the cache: the look and every row, per request
        return json.dumps(ctx.look(await ctx.cluster(None)).summary.to_doc()).encode()

    rows = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(ctx)), base_url="http://cp.test",
                                 headers={"Authorization": f"Bearer {KEY}"}) as api:
        async def get(path: str) -> bytes:
            r = await api.get(path)
            r.raise_for_status()
            return r.content

        rows.append((f"{nodes} nodes: before (built, every row)", *await timed(before, repeat, rebuild)))
        for name, path in (("default", "/api/v1/status"), ("full=1", "/api/v1/status?full=1")):
            builds = ctx.status_cache.builds
            rows.append((f"{nodes} nodes: {name}, built", *await timed(lambda: get(path), repeat, rebuild)))
            if ctx.status_cache.builds - builds < repeat:  # (a look kept a little past its time answers at once)
                raise RuntimeError(f"{name}: {ctx.status_cache.builds - builds} looks built for {repeat} requests")
            rows.append((f"{nodes} nodes: {name}, kept", *await timed(lambda: get(path), repeat, lambda: None)))
    return rows


def table(rows: list[tuple[str, float, float, int]]) -> str:
    out = [f"{'request':<44}{'median ms':>11}{'p95 ms':>9}{'bytes':>10}{'vs before':>11}"]
    before = 0.0
    for name, median, p95, size in rows:
        before = median if "before" in name else before
        out.append(f"{name:<44}{median:>11.2f}{p95:>9.2f}{size:>10}{before / median:>10.1f}x")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="200,1000", help="the fleet sizes measured")
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rows: list[tuple[str, float, float, int]] = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        rows += trio.run(measure, nodes, args.models, args.repeat)
    print(table(rows))
    ok = True
    for name, _, p95, size in rows:
        if name.endswith("default, built"):
            good = p95 <= GOAL_P95_MS and size <= GOAL_BYTES
            ok = ok and good
            print(f"{'PASS' if good else 'FAIL'}: {name.split(':')[0]}: the default document built each time, p95 "
                  f"{p95:.1f} ms, {size} bytes (goal {GOAL_P95_MS:.0f} ms, {GOAL_BYTES} bytes)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
